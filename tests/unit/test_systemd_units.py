"""The systemd units of systemd/: what they run is what ibtool's parser accepts, and the
hardening is there.

The units are read as systemd reads them (sections, repeated keys kept in order, an empty
assignment resetting a list, continuation lines); their command lines are parsed by the parser
`ibtool` itself builds (cli.build_parser, ibtool's own plugins), with the ARGS of the shipped
defaults file and of the examples its comments give. `systemd-analyze verify` checks them where
it runs (it needs no running systemd: a copy whose /usr/bin/ibtool is a stub, with --man=no);
tests/testbed/units.sh runs them under systemd in the testbed (`testbed --release sid units`).
"""

from __future__ import annotations

import argparse
import io
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ibtool.cli import build_parser
from ibtool.errors import ExitCode
from tests.unit.own_commands import own_commands

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
EXPORTER = UNITS / "ibtool-exporter.service"
HEALTH = UNITS / "ibtool-health.service"
TIMER = UNITS / "ibtool-health.timer"
DEFAULTS = UNITS / "ibtool-exporter.default"
UNIT_FILES = (EXPORTER, HEALTH, TIMER)
IBTOOL = "/usr/bin/ibtool"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian's prometheus-node-exporter's
TEXTFILE = f"{TEXTFILE_DIR}/ibtool.prom"
WEB_CONFIG = "/etc/ibtool/web-config.yml"
# What the exporter's sockets are: the endpoint, RDMA netlink and rtnetlink, the journal.
EXPORTER_FAMILIES = {"AF_NETLINK", "AF_INET", "AF_INET6", "AF_UNIX"}


# -- reading units as systemd does -----------------------------------------------------------------


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> its values in order (systemd.syntax(7)): comments (# ;) and blank lines
    dropped, a trailing backslash joining the next line, a key repeated kept whole."""
    units: dict[str, dict[str, list[str]]] = {}
    section = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("["):
            assert line.endswith("]"), f"{path.name}: bad section line {line!r}"
            section = line[1:-1]
            assert section not in units, f"{path.name}: section [{section}] twice"
            units[section] = {}
            continue
        assert section is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is no assignment"
        units[section].setdefault(key.strip(), []).append(value.strip())
    assert not pending, f"{path.name}: ends in a continuation"
    return units


def one(unit: dict, section: str, key: str) -> str:
    values = unit[section].get(key)
    assert values is not None, f"[{section}] {key}= missing"
    assert len(values) == 1, f"[{section}] {key}= given {len(values)} times: {values}"
    return values[0]


def effective_list(unit: dict, section: str, key: str) -> list[str]:
    """A list setting as systemd ends up with it: words added by each assignment, an empty
    assignment clearing what came before."""
    words: list[str] = []
    for value in unit[section].get(key, []):
        if value == "":
            words = []
        else:
            words += value.split()
    return words


def exec_argv(unit: dict, environment: dict[str, str]) -> list[str]:
    """ExecStart= as systemd runs it: $NAME split into words, ${NAME} kept as one."""
    line = one(unit, "Service", "ExecStart")
    assert line[0] not in "-@:+!", f"ExecStart= with a prefix ({line[0]}): it must run as the unit"
    argv: list[str] = []
    for word in shlex.split(line):
        m = re.fullmatch(r"\$(\w+)", word)
        if m:
            argv += environment.get(m.group(1), "").split()
            continue
        argv.append(re.sub(r"\$\{(\w+)\}", lambda m: environment.get(m.group(1), ""), word))
    return argv


def read_defaults(path: Path) -> tuple[dict[str, str], list[str]]:
    """The defaults file's assignments (as EnvironmentFile= reads them: KEY=VALUE, the value's
    quotes removed) and the ARGS values its comments show as examples."""
    assigned: dict[str, str] = {}
    examples: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        m = re.fullmatch(r'#\s*ARGS="([^"]*)"', line)
        if m:
            examples.append(m.group(1))
            continue
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'(\w+)=(?:"([^"]*)"|(\S*))', line)
        assert m, f"{path.name}: {line!r} is not KEY=VALUE"
        assigned[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
    return assigned, examples


# -- the parser ibtool builds ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    _, registry = own_commands()
    out, err = io.StringIO(), io.StringIO()
    return build_parser(registry, out=out, err=err)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argv (without the program) as `ibtool` parses it; a usage error fails the test."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"ibtool refuses {shlex.join(argv)} (exit {e.code})")


@pytest.fixture(scope="module")
def exporter():
    return read_unit(EXPORTER)


@pytest.fixture(scope="module")
def health():
    return read_unit(HEALTH)


@pytest.fixture(scope="module")
def timer():
    return read_unit(TIMER)


# -- the exporter ----------------------------------------------------------------------------------


def test_the_exporter_runs_ibtool_exporter_with_the_defaults_files_args(parser, exporter):
    assert one(exporter, "Service", "EnvironmentFile") == "-/etc/default/ibtool-exporter"
    assigned, _ = read_defaults(DEFAULTS)
    assert "ARGS" in assigned
    argv = exec_argv(exporter, assigned)
    assert argv[0] == IBTOOL
    args = parse(parser, argv[1:])
    assert args.command == "exporter"


def test_the_exporter_runs_without_the_defaults_file(parser, exporter):
    # EnvironmentFile=- : no file, no ARGS, and the command line still stands.
    args = parse(parser, exec_argv(exporter, {})[1:])
    assert args.command == "exporter"
    assert args.web_config_file is None


def test_the_defaults_files_examples_are_options_the_exporter_takes(parser, exporter):
    _, examples = read_defaults(DEFAULTS)
    assert examples, "the defaults file shows no ARGS example"
    configs = []
    for example in examples:
        environment = {"ARGS": example}
        args = parse(parser, exec_argv(exporter, environment)[1:])
        assert args.command == "exporter"
        configs.append(args.web_config_file)
    assert WEB_CONFIG in configs


def test_the_defaults_file_ships_no_option_that_needs_a_file(exporter):
    # The service must start on a node with no web configuration: the shipped ARGS name none.
    assigned, _ = read_defaults(DEFAULTS)
    assert "--web.config.file" not in assigned["ARGS"]
    assert "--config" not in assigned["ARGS"].split("=")[0].split()


def test_the_defaults_file_documents_every_exporter_option(parser):
    text = DEFAULTS.read_text()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    own = [
        a
        for a in sub.choices["exporter"]._actions
        if a.option_strings and a.default != argparse.SUPPRESS and a.dest != "help"
    ]
    assert own
    for action in own:
        assert any(s in text for s in action.option_strings), action.option_strings


# What both units hold to: no capability at all, a read-only system, no privilege gained, the
# kernel's knobs out of reach, only @system-service calls, /dev/infiniband read-only and
# optional (the system check looks for the uverbs nodes there; a host without RDMA still runs).
SANDBOX = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "DevicePolicy": "closed",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "MemoryDenyWriteExecute": "yes",
}


def assert_sandboxed(unit, more: dict[str, str]) -> None:
    s = "Service"
    assert effective_list(unit, s, "CapabilityBoundingSet") == []
    assert effective_list(unit, s, "AmbientCapabilities") == []
    for key, value in {**SANDBOX, **more}.items():
        assert one(unit, s, key) == value, key
    assert "@system-service" in effective_list(unit, s, "SystemCallFilter")
    assert "DeviceAllow" not in unit[s]
    assert "-/dev/infiniband" in effective_list(unit, s, "BindReadOnlyPaths")


def test_the_exporter_is_hardened(exporter):
    s = "Service"
    assert one(exporter, s, "DynamicUser") == "yes"
    assert one(exporter, s, "User")  # a name for ps and the journal
    assert_sandboxed(
        exporter,
        {
            "PrivateMounts": "yes",
            "PrivateUsers": "yes",
            "ProtectKernelLogs": "yes",
            "ProtectClock": "yes",
            "ProtectHostname": "yes",
            "RestrictRealtime": "yes",
            "LockPersonality": "yes",
            "SystemCallArchitectures": "native",
        },
    )
    assert set(effective_list(exporter, s, "RestrictAddressFamilies")) == EXPORTER_FAMILIES
    # It writes nothing: no writable path, no state, no extra group.
    for key in ("ReadWritePaths", "StateDirectory", "SupplementaryGroups"):
        assert key not in exporter[s], key


def test_the_exporter_is_wanted_by_multi_user(exporter):
    assert one(exporter, "Install", "WantedBy") == "multi-user.target"
    assert one(exporter, "Unit", "Documentation") == "man:ibtool-exporter(8)"


def test_the_exporters_sigterm_exit_is_success(exporter):
    # ibtool exporter exits 143 on SIGTERM (ibtool-exporter(8)): a stop is no failure.
    assert effective_list(exporter, "Service", "SuccessExitStatus") == [
        str(int(ExitCode.TERMINATED))
    ]


def test_the_exporter_is_not_restarted_for_what_a_restart_cannot_mend(exporter):
    assert one(exporter, "Service", "Restart") == "on-failure"
    assert effective_list(exporter, "Service", "RestartPreventExitStatus") == [
        str(int(c)) for c in (ExitCode.USAGE, ExitCode.UNSUPPORTED, ExitCode.DATA_ERROR)
    ]


# -- the health check ------------------------------------------------------------------------------


def test_health_writes_the_debian_textfile(parser, health):
    argv = exec_argv(health, {})
    assert argv[0] == IBTOOL
    args = parse(parser, argv[1:])
    assert args.command == "health"
    assert args.textfile == TEXTFILE
    assert not args.datapath and not args.slurm_drain
    # It may write there, and only there and its state; it is skipped without the directory.
    assert effective_list(health, "Service", "ReadWritePaths") == [TEXTFILE_DIR]
    assert one(health, "Unit", "ConditionPathIsDirectory") == TEXTFILE_DIR
    assert one(health, "Service", "StateDirectory") == "ibtool"


def test_health_keeps_its_state_where_root_keeps_it(parser, health):
    # No User=: uid 0, whose default state is /var/lib/ibtool/health.json, the StateDirectory.
    args = parse(parser, exec_argv(health, {})[1:])
    assert args.state is None and not args.no_state
    assert "User" not in health["Service"] and "DynamicUser" not in health["Service"]
    from unittest import mock

    from ibtool.health import state

    with mock.patch("os.geteuid", return_value=0):
        assert state.default_path({}) == "/var/lib/ibtool/health.json"
    assert one(health, "Service", "StateDirectory") == "ibtool"


def read_text_of(relative: str) -> str:
    return (REPO / relative).read_text()


def test_health_is_a_hardened_oneshot(health):
    s = "Service"
    assert one(health, s, "Type") == "oneshot"
    # uid 0 for the root-owned textfile directory, but no capability at all.
    assert_sandboxed(health, {})
    assert set(effective_list(health, s, "RestrictAddressFamilies")) <= {"AF_NETLINK", "AF_UNIX"}
    assert one(health, s, "IPAddressDeny") == "any"
    # ibtool makes the textfile 0644 itself (textfile.write_text): the rest stays private.
    assert one(health, s, "UMask") == "0077"
    # WARNING and CRITICAL are the node's state (in the textfile); UNKNOWN fails the unit.
    assert set(effective_list(health, s, "SuccessExitStatus")) == {"1", "2"}
    # The plugins' cache where the sandbox lets it be written (ProtectHome= hides ~root).
    assert one(health, s, "CacheDirectory") == "ibtool"
    assert one(health, s, "Environment") == "XDG_CACHE_HOME=%C"


def test_the_timer_runs_health_every_minute(timer):
    t = "Timer"
    assert one(timer, t, "Unit") == HEALTH.name
    calendar = timer[t].get("OnCalendar", [])
    active = timer[t].get("OnUnitActiveSec", [])
    assert calendar == ["minutely"] or active == ["1min"], (calendar, active)
    # Late and spread by seconds, never so much that a minute's run slips into the next.
    assert seconds(one(timer, t, "AccuracySec")) + seconds(one(timer, t, "RandomizedDelaySec")) < 60
    assert one(timer, "Install", "WantedBy") == "timers.target"


def seconds(span: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|ms|min|)", span)
    assert m, f"time span {span!r}"
    return float(m.group(1)) * {"": 1, "s": 1, "sec": 1, "ms": 0.001, "min": 60}[m.group(2)]


def test_the_time_span_reader():
    assert seconds("5s") == 5 and seconds("1min") == 60 and seconds("250ms") == 0.25


# -- what else names them --------------------------------------------------------------------------


def test_the_package_installs_every_unit_and_the_defaults_file():
    install = read_text_of("debian/ibtool.install")
    for unit in UNIT_FILES:
        assert re.search(
            rf"^systemd/{re.escape(unit.name)}\s+usr/lib/systemd/system$", install, re.M
        )
    assert "systemd/ibtool-exporter.default $(D)/etc/default/ibtool-exporter" in read_text_of(
        "debian/rules"
    )
    assert sorted(p.name for p in UNITS.iterdir()) == sorted(
        [u.name for u in UNIT_FILES] + [DEFAULTS.name]
    )


@pytest.mark.parametrize(
    "page, names",
    [
        (
            "ibtool-exporter.8",
            [
                "ibtool-exporter.service",
                "/etc/default/ibtool-exporter",
                WEB_CONFIG,
                "systemctl enable --now ibtool-exporter",
            ],
        ),
        (
            "ibtool-health.8",
            [
                "ibtool-health.service",
                "ibtool-health.timer",
                TEXTFILE,
                "systemctl enable --now ibtool-health.timer",
            ],
        ),
    ],
)
def test_the_man_pages_document_the_units(page, names):
    roff = read_text_of(f"man/{page}")
    text = re.sub(r"\\f[BIRP]", "", roff).replace("\\-", "-").replace("\\~", " ")
    for name in names:
        assert name in text, f"{page} does not name {name}"


# -- systemd-analyze verify ------------------------------------------------------------------------


def analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed")
    return path


def verify(directory: Path, names: list[str]) -> tuple[int, str]:
    """`systemd-analyze verify` of the units in `directory`, run there (no running systemd is
    needed); its exit code and everything it said."""
    proc = subprocess.run(
        [analyze(), "verify", "--man=no", *names],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def stubbed_copies(tmp_path: Path, edit=lambda text: text) -> list[str]:
    """The units copied to `tmp_path`, /usr/bin/ibtool replaced by an executable stub there:
    verify checks that the command exists, and ibtool is not installed on this host."""
    stub = tmp_path / "ibtool"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    names = []
    for unit in UNIT_FILES:
        (tmp_path / unit.name).write_text(edit(unit.read_text().replace(IBTOOL, str(stub))))
        names.append(unit.name)
    return names


def verify_works_here(tmp_path: Path) -> None:
    """A unit known to be good first: where verify itself cannot run (a chroot without
    cgroups: "Cannot determine cgroup we are running in"), skip with its words."""
    sane = tmp_path / "sane"
    sane.mkdir()
    (sane / "ibtool-sanity.service").write_text(
        "[Unit]\nDescription=sanity\n\n[Service]\nType=oneshot\nExecStart=/bin/true\n"
    )
    rc, said = verify(sane, ["ibtool-sanity.service"])
    if rc != 0 or said:
        pytest.skip(f"systemd-analyze verify does not work here (exit {rc}): {said[:300]}")


def test_systemd_analyze_verify(tmp_path):
    verify_works_here(tmp_path)
    rc, said = verify(tmp_path, stubbed_copies(tmp_path))
    assert rc == 0 and said == "", said


def test_systemd_analyze_verify_sees_a_bad_directive(tmp_path):
    # The check above can fail: a misspelt directive is reported.
    verify_works_here(tmp_path)
    names = stubbed_copies(tmp_path, lambda t: t.replace("ProtectClock=", "ProtectClokc="))
    rc, said = verify(tmp_path, names)
    assert "ProtectClokc" in said

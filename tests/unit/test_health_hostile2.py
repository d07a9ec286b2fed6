"""`ibtool health` against hostile files and values, second pass (issue #38): a FIFO or a device
where the config or the state should be, a config nested or numbered past what the TOML parser
can read, numbers that are not finite, a netdev name no kernel would take; and a capture,
which cannot know the loaded modules, answered on what it does hold.

Whatever stops a run before its checks is UNKNOWN (exit 3, the Nagios plugin convention) and
the textfile then says 3, never the last run's OK: node_exporter serves it until the next run.
A run that could hang on a FIFO or read /dev/zero until memory runs out is a child process with
a timeout and a memory limit, so that a regression fails its test, not the suite.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.conftest import REPO, run_cli
from tests.unit.test_health_untrusted import SNAPSHOT, health, tree

# mlx5_0/2 of the fixture tree is DOWN (its cable out): ignored, the tree is a healthy node.
HEALTHY = '[ports."mlx5_0/2"]\nignore = true\n'
# A child ibtool gets this long, and this much address space: far above what a run takes (about
# a second, under 300 MB), far below what a hang or a read of /dev/zero would.
CHILD_TIMEOUT = 120
CHILD_MEMORY = 1 << 30
# int() reads at most 4300 digits from Python 3.11 and the 3.9.14 and 3.10.7 security releases
# (CVE-2020-10735); before them, 5000 digits are an integer, and no float.
LONG_NUMBER = (
    "3: a number of more digits than can be read (5000)"
    if hasattr(sys, "get_int_max_str_digits")
    else "3: budget must be a number of seconds above 0"
)


def healthy(tmp_path: Path) -> Path:
    config = tmp_path / "health.toml"
    config.write_text(HEALTHY)
    return config


def status_in(prom: Path) -> tuple[float, str | None]:
    """The textfile's ibtool_health_status and its fault's reason (None without one)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    (status,) = families["ibtool_health_status"].samples
    faults = families.get("ibtool_health_fault_info")
    return status.value, faults.samples[0].labels["reason"] if faults else None


def ok_run(root: Path, tmp_path: Path, prom: Path) -> None:
    """The last good run: OK, and the textfile says so."""
    r = health(
        root, tmp_path / "ok.json", "--config", str(healthy(tmp_path)), "--textfile", str(prom)
    )
    assert r.code == 0, r.out
    assert status_in(prom) == (0.0, None)


def child(*argv: str) -> subprocess.CompletedProcess:
    """ibtool in a child process, bounded in time and memory (see the module's docstring)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))

    return subprocess.run(
        [sys.executable, "-m", "ibtool", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "IBTOOL_DISABLE_PLUGIN_AUTOLOAD": "1"},
        preexec_fn=limit,
        timeout=CHILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def planted(tmp_path: Path, kind: str) -> Path:
    """A path where a file should be that is something else: a FIFO (a plain open() waits for a
    writer forever), a link to /dev/zero (a read never ends), a link to /dev/null (a save
    would rename a file over the device: a link to it here, so that a regression replaces only
    the link), a directory."""
    path = tmp_path / "planted"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        os.symlink(f"/dev/{kind}", path)
    return path


# -- item 1: a FIFO or a device as --config or --state ---------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory"])
def test_a_config_that_is_not_a_regular_file_is_unknown_and_the_textfile_says_so(tmp_path, kind):
    root, prom = tree(tmp_path), tmp_path / "ibtool.prom"
    ok_run(root, tmp_path, prom)
    config = planted(tmp_path, kind)
    r = child("--root", str(root), "health", "--no-state", "--config", str(config),
              "--textfile", str(prom))  # fmt: skip
    what = "a directory" if kind == "directory" else "not a regular file"
    assert (r.returncode, r.stderr) == (3, ""), r.stderr
    assert r.stdout.startswith(f"IBTOOL UNKNOWN - config {config}: {what} (hint: "), r.stdout
    assert len(r.stdout.splitlines()) == 1
    assert status_in(prom) == (3.0, r.stdout[len("IBTOOL UNKNOWN - ") :].rstrip("\n"))


@pytest.mark.parametrize("kind", ["fifo", "zero", "null", "directory"])
def test_a_state_that_is_not_a_regular_file_is_unknown_and_left_alone(tmp_path, kind):
    root, prom = tree(tmp_path), tmp_path / "ibtool.prom"
    ok_run(root, tmp_path, prom)
    state = planted(tmp_path, kind)
    r = child("--root", str(root), "health", "--config", str(healthy(tmp_path)),
              "--state", str(state), "--textfile", str(prom))  # fmt: skip
    what = "a directory" if kind == "directory" else "not a regular file"
    assert (r.returncode, r.stderr) == (3, ""), r.stderr
    assert r.stdout.startswith(f"IBTOOL UNKNOWN - state {state}: {what} (hint: "), r.stdout
    assert len(r.stdout.splitlines()) == 1
    assert status_in(prom)[0] == 3.0
    # left as it was (not replaced by a new state), and no lock made beside it
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(state).st_mode)
    elif kind == "directory":
        assert state.is_dir() and not any(state.iterdir())
    else:
        assert os.readlink(state) == f"/dev/{kind}"
    assert not os.path.exists(f"{state}.lock")


def test_dev_null_as_the_config_is_still_no_configuration(tmp_path):
    """`--config /dev/null` (what the frozen outputs' recorder gives) says: the defaults,
    ignore /etc/ibtool/health.toml. Only /dev/null: /dev/zero is refused above."""
    r = health(tree(tmp_path), None, "--config", "/dev/null", "--check", "port")
    assert (r.code, r.out.splitlines()[0].split(" - ")[0]) == (2, "IBTOOL CRITICAL")


def test_a_config_larger_than_any_health_toml_is_refused_unread(tmp_path):
    from ibtool.health.files import CONFIG_MAX

    root, prom = tree(tmp_path), tmp_path / "ibtool.prom"
    ok_run(root, tmp_path, prom)
    config = tmp_path / "huge.toml"
    with open(config, "wb") as f:
        f.truncate(CONFIG_MAX + 1)  # sparse: nothing is written to the disk
    r = health(root, None, "--config", str(config), "--textfile", str(prom))
    assert r.code == 3
    assert r.out.startswith(f"IBTOOL UNKNOWN - config {config}: larger than 1 MiB"), r.out
    assert status_in(prom)[0] == 3.0


def test_a_state_larger_than_any_state_file_is_refused_and_kept(tmp_path):
    from ibtool.health.files import STATE_MAX

    root, state = tree(tmp_path), tmp_path / "health.json"
    with open(state, "wb") as f:
        f.truncate(STATE_MAX + 1)
    r = health(root, state, "--config", str(healthy(tmp_path)))
    assert r.code == 3
    assert r.out.startswith(f"IBTOOL UNKNOWN - state {state}: larger than 64 MiB"), r.out
    assert state.stat().st_size == STATE_MAX + 1  # not replaced: it may not be ours


def test_a_state_file_nested_past_the_parser_is_a_new_baseline(tmp_path):
    """The state is ibtool's own file: one it cannot read (as one that is not JSON) is replaced,
    with a warning, not a crash."""
    root, state = tree(tmp_path), tmp_path / "health.json"
    state.write_text("[" * 200_000 + "]" * 200_000)
    r = health(root, state, "--config", str(healthy(tmp_path)))
    assert r.code == 0, r.out + r.err
    assert r.warnings == [
        f"ibtool: warning: state {state} is not JSON (nested too deeply): starting a new baseline"
    ]


def test_the_state_of_4000_ports_of_100_counters_is_read(tmp_path):
    """The bound is for files no run writes: the baselines of 4,000 ports of 100 counters each,
    at their longest (64-bit values), are read as ever."""
    from ibtool.health.files import STATE_MAX
    from ibtool.health.state import StateFile

    counters = {
        f"{p}/hw/a_driver_counter_name_{c:03}": 2**64 - 1 for p in (1, 2) for c in range(100)
    }
    devices = {f"mlx5_{d}": {"counters": counters} for d in range(2000)}
    checks = {"counters": {"data": {"devices": devices}, "boot_id": None, "time": 0.0}}
    state = StateFile(str(tmp_path / "health.json"))
    state.save(checks)
    assert 4 << 20 < (tmp_path / "health.json").stat().st_size < STATE_MAX
    saved = state.load()
    assert saved.problem is None and len(saved.checks["counters"]["data"]["devices"]) == 2000


# -- item 2: a config past what the TOML parser can read -------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[health]\nskip = " + "[" * 200_000 + "]" * 200_000 + "\n",
         "arrays or tables nested too deeply to read"),
        ("[checks.system]\nx = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n",
         "arrays or tables nested too deeply to read"),
        ("[datapath]\n\nbudget = " + "9" * 5000 + "\n", LONG_NUMBER),
    ],
    ids=["deep-arrays", "deep-inline-tables", "5000-digits"],
)  # fmt: skip
def test_a_config_the_parser_cannot_read_is_unknown_after_an_ok_run(tmp_path, text, message):
    root, prom = tree(tmp_path), tmp_path / "ibtool.prom"
    ok_run(root, tmp_path, prom)
    config = tmp_path / "hostile.toml"
    config.write_text(text)
    r = health(root, None, "--config", str(config), "--textfile", str(prom))
    assert (r.code, r.err) == (3, ""), r.err
    assert r.out.startswith(f"IBTOOL UNKNOWN - config {config}"), r.out
    assert message in r.out and len(r.out.splitlines()) == 1, r.out
    assert status_in(prom) == (3.0, r.out[len("IBTOOL UNKNOWN - ") :].rstrip("\n"))


def test_any_failure_of_the_toml_parser_is_the_config_s_error(tmp_path, monkeypatch):
    """Not only the two inputs above: whatever the parser (tomllib, or tomli before Python
    3.11) raises on what the file holds is an error of the config, never an internal error."""
    import types

    from ibtool.health import config as healthconfig

    class Parser(types.SimpleNamespace):
        class TOMLDecodeError(ValueError):
            pass

        @staticmethod
        def loads(text):
            raise IndexError("string index out of range")

    monkeypatch.setattr(healthconfig, "toml_parser", lambda: Parser)
    root, prom = tree(tmp_path), tmp_path / "ibtool.prom"
    config = healthy(tmp_path)
    r = health(root, None, "--config", str(config), "--textfile", str(prom))
    assert (r.code, r.out) == (
        3,
        f"IBTOOL UNKNOWN - config {config}: the TOML parser failed on it (IndexError) "
        "(hint: see ibtool-health(8))\n",
    )
    assert status_in(prom)[0] == 3.0


def test_an_internal_error_still_replaces_the_textfile_s_ok(tmp_path, monkeypatch):
    """A bug (exit 70) must not leave node_exporter serving the last run's OK either."""
    from ibtool.health import run as healthrun

    root, prom = tree(tmp_path), tmp_path / "ibtool.prom"
    ok_run(root, tmp_path, prom)

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(healthrun, "run", broken)
    r = health(root, None, "--config", str(healthy(tmp_path)), "--textfile", str(prom))
    assert r.code == 70
    assert status_in(prom) == (3.0, "internal error: ZeroDivisionError")


# -- item 3: numbers that are not finite -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[ports."*"]\nrate = nan\n', "2: rate must be a finite number of Gb/s"),
        ('[ports."*"]\nrate = 1e400\n', "2: rate must be a finite number of Gb/s"),
        ('[ports."*"]\nrate = +inf\n', "2: rate must be a finite number of Gb/s"),
        ('[ports."mlx5_0"]\nrate = 1' + "0" * 400 + "\n", "2: rate must be a finite number"),
        ("[datapath]\nbudget = 1" + "0" * 400 + "\n", "2: budget must be a number of seconds"),
        ("[thresholds]\nsymbol_error = 1" + "0" * 400 + "\n",
         "2: threshold of symbol_error: must be finite"),
        ('[thresholds]\nsymbol_error = "1' + "0" * 400 + '"\n',
         "2: threshold of symbol_error: must be finite"),
        ('[thresholds.link_downed]\ncritical = "@1' + "0" * 400 + ':"\n',
         "2: threshold of link_downed: must be finite"),
    ],
    ids=["nan", "1e400", "inf", "int-rate", "int-budget", "int-threshold", "text-threshold",
         "text-range"],
)  # fmt: skip
def test_a_number_that_is_not_finite_is_a_config_error_naming_the_key(tmp_path, text, message):
    root, config = tree(tmp_path), tmp_path / "health.toml"
    config.write_text(text)
    r = health(root, None, "--config", str(config))
    assert (r.code, r.err) == (3, ""), r.err
    assert r.out.startswith(f"IBTOOL UNKNOWN - config {config}:{message}"), r.out
    assert len(r.out.splitlines()) == 1


# -- item 4: names no kernel would give ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[roce]\nnetdevs = ["eth\\u001b[31m9"]\n', "netdevs"),
        ('[roce]\nnetdevs = ["eth2", "a-name-of-16-chr"]\n', "netdevs"),  # IFNAMSIZ is 16
        ('[roce]\nnetdevs = ["eth2/1"]\n', "netdevs"),
        ('[roce]\nnetdevs = [".."]\n', "netdevs"),
        ('[roce]\nnetdevs = ["eth\\u202e9"]\n', "netdevs"),
        ('[health]\ndevices = ["mlx5_\\u001b[2J0"]\n', "devices"),
        ('[health]\nmodules = ["ib_\\u0007core"]\n', "modules"),
        ('[datapath]\npeers = ["node\\u009b01"]\n', "peers"),  # C1 CSI
    ],
)
def test_a_name_no_kernel_would_give_is_a_config_error(tmp_path, text, key):
    root, config = tree(tmp_path), tmp_path / "health.toml"
    config.write_text(text)
    r = health(root, None, "--config", str(config))
    assert (r.code, r.err) == (3, ""), r.err
    assert r.out.startswith(f"IBTOOL UNKNOWN - config {config}:2: {key}: "), r.out
    assert r.out.isascii() and r.out[:-1].isprintable(), repr(r.out)
    assert len(r.out.splitlines()) == 1


def test_netdevs_and_addresses_the_kernel_would_take_are_accepted(tmp_path):
    from ibtool.health import config as healthconfig

    config = tmp_path / "health.toml"
    names = ["eth2", "ens1f0np0", "bond0.100", "a-name-of-15-ch", "10.1.2.3", "fe80::1"]
    config.write_text(f"[roce]\nnetdevs = {names!r}\n".replace("'", '"'))
    assert healthconfig.load(str(config), required=True).netdevs == tuple(names)


# -- item 5: a capture does not know the loaded modules --------------------------------------------


def test_a_healthy_capture_without_module_state_is_ok(tmp_path):
    root = tree(tmp_path)
    shutil.rmtree(root / "sys/class/infiniband_verbs")  # as a capture without module state
    r = health(root, None, "--config", str(healthy(tmp_path)))
    assert r.code == 0, r.out
    assert r.out.splitlines()[0].startswith("IBTOOL OK - all OK: ")
    assert "[OK] system modules and uverbs: not in this capture, not checked" in r.out.splitlines()


def test_a_snapshot_of_a_healthy_host_is_ok():
    r = run_cli(["--snapshot", str(SNAPSHOT), "health", "--no-state"])
    assert r.code == 0, r.out
    assert "[OK] system modules and uverbs: not in this capture, not checked" in r.out


def test_a_capture_s_problems_still_decide_its_status(tmp_path):
    root = tree(tmp_path)
    shutil.rmtree(root / "sys/class/infiniband_verbs")
    r = health(root, None)  # mlx5_0/2 DOWN
    assert r.code == 2
    assert "[OK] system modules and uverbs: not in this capture, not checked" in r.out


def test_on_the_running_host_not_captured_stays_unknown():
    """Only a capture may not know: the live host's checks always can, so a plugin's
    not_captured there is what it says, UNKNOWN."""
    from ibtool.api import HealthResult, Status
    from ibtool.health import run as healthrun
    from ibtool.health.config import HealthConfig

    said = HealthResult(Status.UNKNOWN, "", "modules and uverbs: not in this capture",
                        kind="not_captured")  # fmt: skip

    class Host:
        live = True

    checks = {"system": lambda ctx: [said]}
    report = healthrun.run(checks, Host(), HealthConfig(), None, boot_id=None)
    assert report.status == Status.UNKNOWN

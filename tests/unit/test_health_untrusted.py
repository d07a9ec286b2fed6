"""`ibtool health` on input it cannot trust (issue #25): a capture of another host, a config with
a typo, a run that fails before its checks, names with Nagios's reserved characters, hundreds
of ports, numbers out of range, a planted lock file."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from ibtool.sources.sysfs.fs import DISK
from tests.fixtures import sysfs_trees
from tests.unit.conftest import run_cli

SNAPSHOT = (
    Path(__file__).resolve().parents[1] / "fixtures" / "captured" / "snapshot" / "host.json.gz"
)
COUNTERS = "sys/class/infiniband/mlx5_0/ports/1/counters"


def tree(tmp_path: Path, name: str = "mlx5_ib_hca", *, boot_id: str | None = None) -> Path:
    """A capture as ibtool ships them: sysfs and uverbs, and a boot id only if given."""
    root = sysfs_trees.build(name, tmp_path / "root")
    sysfs_trees.uverbs(root, sorted(os.listdir(root / "sys/class/infiniband")))
    if boot_id is not None:
        path = root / "proc/sys/kernel/random"
        path.mkdir(parents=True, exist_ok=True)
        (path / "boot_id").write_text(boot_id + "\n")
    return root


def health(root: Path, state: Path | None, *args: str):
    kept = ["--state", str(state)] if state is not None else []
    return run_cli(["--root", str(root), "health", *kept, *args])


def write(root: Path, relative: str, value: object) -> None:
    (root / relative).write_text(f"{value}\n")


# -- nothing acts on this host because of another host's data --------------------------------------


@pytest.fixture
def scontrol(monkeypatch):
    """Every scontrol ibtool would run, recorded instead of run."""
    from ibtool.health import slurm

    ran: list[list[str]] = []

    def run(argv):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "NodeName=n State=IDLE Reason=(null)\n", "")

    monkeypatch.setattr(slurm, "run_command", run)
    return ran


def test_slurm_drain_on_a_root_tree_is_a_usage_error_and_drains_nothing(tmp_path, scontrol):
    root = tree(tmp_path)  # mlx5_0/2 is DOWN: CRITICAL, which would drain
    r = health(root, None, "--slurm-drain")
    assert (r.code, r.out, scontrol) == (2, "", [])
    assert r.err == (
        f"ibtool: error: --slurm-drain drains this host's Slurm node; --root {root} is not this "
        "host (hint: drop --slurm-drain, or run on the node itself)\n"
    )


def test_slurm_drain_on_a_snapshot_is_a_usage_error_and_drains_nothing(scontrol):
    r = run_cli(["--snapshot", str(SNAPSHOT), "health", "--slurm-drain"])
    assert (r.code, r.out, scontrol) == (2, "", [])
    assert f"--snapshot {SNAPSHOT} is not this host" in r.err


# -- a capture without a boot id is compared, not a new baseline each run -------------------------


def test_counters_of_a_capture_without_boot_id_are_compared_between_runs(tmp_path):
    root, state = tree(tmp_path), tmp_path / "health.json"
    assert health(root, state, "--check", "counters").code == 0
    write(root, f"{COUNTERS}/symbol_error", 500)
    r = health(root, state, "--check", "counters")
    assert (r.code, r.out.splitlines()[0]) == (
        1,
        "IBTOOL WARNING - mlx5_0/1: symbol_error +500 since the last run (warning 10)",
    )


def test_a_lid_moved_in_a_capture_without_boot_id_is_flagged(tmp_path):
    root, state = tree(tmp_path), tmp_path / "health.json"
    health(root, state, "--check", "port")
    write(root, "sys/class/infiniband/mlx5_0/ports/1/lid", "0x1d")
    r = health(root, state, "--check", "port")
    assert "[WARNING] port mlx5_0/1: lid 29 (was 28) since the last run" in r.out.splitlines()


def test_a_boot_id_read_at_one_run_only_is_unknown_not_a_reboot(tmp_path):
    root, state = tree(tmp_path), tmp_path / "health.json"
    health(root, state, "--check", "counters")  # kept without a boot id
    path = root / "proc/sys/kernel/random"
    path.mkdir(parents=True)
    (path / "boot_id").write_text("6d2f0e4c-8f4b-4a55-9a53-0c1f2b9d7e11\n")
    write(root, f"{COUNTERS}/port_rcv_errors", 40)
    r = health(root, state, "--check", "counters")
    assert "mlx5_0/1: port_rcv_errors +40 since the last run (warning 10)" in r.out


def test_the_exporter_over_a_capture_sees_a_counter_move_between_polls(tmp_path):
    """The exporter's poller keeps its baselines in memory, with the capture's (absent) boot
    id: symbol_error 0 -> 1000 between two polls is a WARNING on the second."""
    from ibtool.health.config import HealthConfig
    from ibtool.live.exporter import poller
    from ibtool.plugin.commands import Invocation
    from ibtool.plugin.hooks import health_checks
    from ibtool.plugin.manager import build_plugins

    root = tree(tmp_path)
    plugins = build_plugins(warn=lambda m: None)
    checks = {"counters": health_checks(plugins, lambda m: None)["counters"]}
    inv = Invocation(args=None, root=str(root), plugins=plugins)
    poll = poller(inv, checks, HealthConfig())

    def status() -> float:
        families = {f.name: f for f in poll()}
        return families["ibtool_health_status"].samples[0].value

    assert status() == 0
    write(root, f"{COUNTERS}/symbol_error", 1000)
    assert status() == 1
    inv.close()


# -- a config typo is an error naming the nearest valid name --------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("[thresholds]\nsymbol_errors = 5\n", 2,
         "[thresholds] names no counter 'symbol_errors'; did you mean 'symbol_error'?"),
        ("[thresholds]\nlink_downed = 1\nmy_driver_counter = 3\n", 3,
         "[thresholds] names no counter 'my_driver_counter'"),
        ("[health]\ndevice = []\n", 2,
         "unknown key 'device' in [health] (known: skip, devices, modules); did you mean "
         "'devices'?"),
        ('[ports."*"]\nrates = 100\n', 2,
         "unknown key 'rates' for port * (known: rate, width, ignore); did you mean 'rate'?"),
        ("[threshold]\n", 1, "unknown section [threshold] (known: [health], [ports], [roce], "
         "[thresholds], [datapath], [checks]); did you mean 'thresholds'?"),
        ("[checks.sytem]\nx = 1\n", 1, "[checks.sytem] names no health check; did you mean "
         "'system'?"),
        ("[thresholds.port_rcv_errors]\nwarn = '5'\n", 2,
         "unknown key 'warn' for counter port_rcv_errors (warning, critical); did you mean "
         "'warning'?"),
    ],
)  # fmt: skip
def test_a_config_typo_is_unknown_naming_the_key_and_the_nearest(tmp_path, text, line, message):
    root, config = tree(tmp_path), tmp_path / "health.toml"
    config.write_text(text)
    r = health(root, None, "--config", str(config))
    assert r.code == 3, r.out
    assert r.out.startswith(f"IBTOOL UNKNOWN - config {config}:{line}: {message}"), r.out
    assert len(r.out.splitlines()) == 1


def test_a_threshold_for_a_driver_counter_ibtool_does_not_describe_but_the_host_has(tmp_path):
    root, config, state = tree(tmp_path), tmp_path / "health.toml", tmp_path / "health.json"
    config.write_text('[thresholds]\nrx_dct_connect = "2"\n')  # an mlx5 Q counter
    assert health(root, state, "--config", str(config), "--check", "counters").code == 0
    write(root, "sys/class/infiniband/mlx5_0/ports/1/hw_counters/rx_dct_connect", 3)
    r = health(root, state, "--config", str(config), "--check", "counters")
    assert "[WARNING] counters mlx5_0/1: rx_dct_connect +3 since the last run (warning 2)" in (
        r.out.splitlines()
    )


def test_a_configured_device_that_is_absent_is_critical_even_in_a_capture(tmp_path):
    root, config = tree(tmp_path), tmp_path / "health.toml"
    config.write_text(
        '[health]\ndevices = ["mlx5_0", "mlx5_1"]\n[ports."mlx5_0/2"]\nignore = true\n'
    )
    r = health(root, None, "--config", str(config), "--check", "port")
    assert (r.code, r.out.splitlines()[0]) == (
        2,
        "IBTOOL CRITICAL - mlx5_1: expected device mlx5_1 missing | 'mlx5_0/1 rate Gb/s'=100;;;0",
    )


# -- a run that fails before its checks still tells the textfile and -j ---------------------------


def test_a_bad_config_replaces_the_textfile_with_unknown_and_the_reason(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    root, config = tree(tmp_path), tmp_path / "health.toml"
    prom = tmp_path / "textfile" / "ibtool.prom"
    prom.parent.mkdir()
    assert health(root, None, "--textfile", str(prom)).code == 2  # the last good run
    config.write_text("[thresholds]\nsymbol_errors = 5\n")
    r = health(root, None, "--config", str(config), "--textfile", str(prom))
    assert r.code == 3
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert [s.value for s in families["ibtool_health_status"].samples] == [3.0]
    (reason,) = families["ibtool_health_fault_info"].samples
    assert reason.labels["reason"] == r.out[len("IBTOOL UNKNOWN - ") :].rstrip("\n")
    assert "ibtool_port_state_id" not in families  # nothing read of the host: nothing claimed
    assert [p.name for p in prom.parent.iterdir()] == ["ibtool.prom"]


def test_a_held_lock_writes_unknown_to_the_textfile(tmp_path):
    import fcntl

    root, state = tree(tmp_path), tmp_path / "health.json"
    prom = tmp_path / "ibtool.prom"
    health(root, state, "--textfile", str(prom))
    with open(str(state) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = health(root, state, "--lock-wait", "0", "--textfile", str(prom))
    assert r.code == 3
    assert "ibtool_health_status 3.0\n" in prom.read_text()
    assert "is locked by another ibtool health run" in prom.read_text()


def test_a_json_error_has_the_keys_of_a_json_report(tmp_path):
    root, config = tree(tmp_path), tmp_path / "health.toml"
    good = health(root, None, "-j").json
    config.write_text("[sla]\n")
    r = health(root, None, "-j", "--config", str(config))
    bad = r.json
    assert r.code == 3 and set(bad) == set(good)
    assert (bad["status"], bad["exit_code"], bad["results"]) == ("UNKNOWN", 3, [])
    assert bad["faults"] == [bad["summary"]] and "unknown section [sla]" in bad["summary"]


def test_json_list_of_the_checks(tmp_path):
    r = health(tree(tmp_path), None, "-j", "--list")
    assert r.code == 0
    names = [c["name"] for c in r.json]
    assert names == ["counters", "datapath", "fabric", "gpudirect", "peers", "port", "system"]
    assert all(c["description"] for c in r.json)


# -- Nagios output: reserved characters, a bounded first line, hundreds of ports ------------------


def test_a_pipe_in_a_device_name_does_not_split_the_perfdata(tmp_path):
    root = tree(tmp_path)
    ib = root / "sys/class/infiniband"
    (ib / "mlx5_0").rename(ib / "mlx|0")
    r = health(root, None, "--check", "port")
    first, *rest = r.out.splitlines()
    text, perfdata = first.split(" | ")  # the one '|' is the separator
    assert text == "IBTOOL CRITICAL - mlx\u00a60/2: state DOWN (physical_state POLLING): no link " \
        "(cable, peer port or netdev down)"  # fmt: skip
    assert perfdata == "'mlx_0/1 rate Gb/s'=100;;;0 'mlx_0/2 rate Gb/s'=10;;;0"
    assert not any("|" in line for line in rest)


def test_perfdata_labels_lose_the_characters_the_guidelines_reserve():
    from ibtool.api import HealthResult, Perfdata, Status
    from ibtool.health import run as health

    result = HealthResult(Status.OK, "x", "fine", (Perfdata("a=b'c|d", 1),), check="c")
    report = health.Report([result], Status.OK, 0.0)
    assert health.nagios(report).splitlines()[0] == "IBTOOL OK - all OK: c 1 | a_b_c_d=1"


def test_a_host_of_500_vfs_has_a_bounded_first_line_and_lists_the_problems(sriov_500_vfs):
    r = sriov_500_vfs("health", "--no-state")
    lines = r.out.splitlines()
    assert len(lines[0]) <= 300 and " | " not in lines[0]
    # all OK (the capture's modules are not checked): the perfdata start on that last line
    assert re.fullmatch(r"results: .*; the \d+ OK are listed with --verbose \| '.*", lines[1])
    assert not any(line.startswith("[OK]") for line in lines)
    assert "'" in lines[-1]  # the perfdata, one per line after the long output
    verbose = sriov_500_vfs("health", "--no-state", "--verbose").out.splitlines()
    assert len([line for line in verbose if line.startswith("[OK] port ")]) > 400


def test_many_problems_are_counted_on_the_first_line(tmp_path):
    from ibtool.api import HealthResult, Status
    from ibtool.health import run as health

    results = [
        HealthResult(
            Status.CRITICAL, f"mlx5_{i}/1", "state DOWN (physical_state POLLING)", (), "port"
        )
        for i in range(300)
    ] + [
        HealthResult(Status.WARNING, f"mlx5_{i}/1", "trained down", (), "port") for i in range(198)
    ]
    text = health.summary(results)
    assert len(text) <= health.SUMMARY_MAX
    assert text.endswith("; and 495 more (297 CRITICAL, 198 WARNING)"), text
    one = [HealthResult(Status.CRITICAL, "d", "x" * 500, (), "port")]
    assert health.summary(one) == "d: " + "x" * 194 + "..."


# -- numbers on the command line -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e308", "3601"])
def test_lock_wait_out_of_range_is_a_usage_error(tmp_path, value):
    r = health(tree(tmp_path), tmp_path / "health.json", "--lock-wait", value)
    assert (r.code, r.out) == (2, "")
    assert "--lock-wait: must be " in r.err and "0 to 3600 seconds" in r.err


@pytest.mark.parametrize("value", ["0.000001", "0", "nan", "1e308"])
def test_exporter_interval_out_of_range_is_a_usage_error(tmp_path, value):
    r = run_cli(["--root", str(tree(tmp_path)), "exporter", "--interval", value])
    assert (r.code, r.out) == (2, "")
    assert "--interval: must be " in r.err and "1 to 3600 seconds" in r.err


# -- the lock file ------------------------------------------------------------------------------


def test_a_dangling_lock_symlink_is_refused_and_its_target_not_created(tmp_path):
    root, state = tree(tmp_path), tmp_path / "state" / "health.json"
    state.parent.mkdir()
    target = tmp_path / "elsewhere"
    os.symlink(target, str(state) + ".lock")
    r = health(root, state)
    assert r.code == 3
    assert r.out.startswith(f"IBTOOL UNKNOWN - state lock {state}.lock is a symbolic link")
    assert not target.exists()


def test_a_fifo_as_the_lock_is_refused_without_hanging(tmp_path):
    root, state = tree(tmp_path), tmp_path / "health.json"
    os.mkfifo(str(state) + ".lock")
    r = health(root, state)
    assert r.code == 3
    assert r.out.startswith(f"IBTOOL UNKNOWN - state lock {state}.lock is not a regular file")


# -- messages ------------------------------------------------------------------------------------


def test_an_ib_port_disabled_by_management_is_not_blamed_on_the_cable(tmp_path):
    root = tree(tmp_path)
    write(root, "sys/class/infiniband/mlx5_0/ports/2/phys_state", "3: Disabled")
    r = health(root, None, "--check", "port")
    assert (
        "[CRITICAL] port mlx5_0/2: state DOWN (physical_state DISABLED): disabled by management "
        "(the subnet manager or ibportstate), not a cable fault"
    ) in r.out.splitlines()


def test_the_json_keys_of_the_man_page_read_as_a_list():
    from tests.unit.test_man import tool  # mandoc: in every release root the suite runs in

    page = Path(__file__).resolve().parents[2] / "man" / "ibtool-health.8"
    rendered = subprocess.run(
        [tool("mandoc"), "-Tascii", "-O", "width=200", str(page)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    plain = re.sub(r".\x08", "", rendered)  # bold and underline as overstrikes
    assert re.search(r"min and max\), notes", plain), "the -j keys' list is garbled"


@pytest.mark.parametrize("planted", ["fifo", "link"])
def test_a_capture_s_boot_id_that_is_a_fifo_or_a_link_is_unknown(tmp_path, planted):
    from ibtool.health import state as healthstate

    root = tmp_path / "root"
    where = root / "proc/sys/kernel/random"
    where.mkdir(parents=True)
    if planted == "fifo":
        os.mkfifo(where / "boot_id")  # a plain open() would wait for a writer forever
    else:
        (tmp_path / "host_file").write_text("secret\n")
        os.symlink(tmp_path / "host_file", where / "boot_id")
    assert healthstate.boot_id(str(root), DISK) is None

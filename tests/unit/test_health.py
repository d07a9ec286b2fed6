"""`ibtool health`: what cron, Nagios, Prometheus and Slurm read of a node, on fixture trees.

Each run is the CLI in-process on a tree of real hardware's sysfs, changed between runs the way
the kernel changes it; the state file is the one the next cron run would read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.fixtures import sysfs_trees

BOOT = "6d2f0e4c-8f4b-4a55-9a53-0c1f2b9d7e11"


class Node:
    """A fixture tree with ib_uverbs loaded and a boot id, its state file, and ibtool run on
    it as cron would: `health` with the state kept between runs."""

    def __init__(self, tree: str, tmp_path: Path, run_cli):
        self.root = sysfs_trees.build(tree, tmp_path / "root")
        names = sorted(os.listdir(self.root / "sys/class/infiniband"))
        sysfs_trees.uverbs(self.root, names)
        self.boot(BOOT)
        self.state = tmp_path / "state" / "health.json"
        self.run_cli = run_cli

    def boot(self, boot_id: str) -> None:
        path = self.root / "proc/sys/kernel/random"
        path.mkdir(parents=True, exist_ok=True)
        (path / "boot_id").write_text(boot_id + "\n")

    def port(self, device: str, port: int) -> Path:
        return self.root / "sys/class/infiniband" / device / "ports" / str(port)

    def write(self, relative: str, value: object) -> None:
        (self.root / relative).write_text(f"{value}\n")

    def health(self, *args: str):
        return self.run_cli(["--root", str(self.root), "health", "--state", str(self.state), *args])


@pytest.fixture
def node(tmp_path):
    from tests.unit.conftest import run_cli

    return lambda tree: Node(tree, tmp_path, run_cli)


def first_line(out: str) -> str:
    return out.splitlines()[0]


# -- the Nagios plugin -----------------------------------------------------------------------------


def test_a_down_port_is_critical_and_named_on_the_first_line(node):
    ib = node("mlx5_ib_hca")
    r = ib.health()
    assert r.code == 2, r.out
    assert first_line(r.out) == (
        "IBTOOL CRITICAL - mlx5_0/2: state DOWN (physical_state POLLING): no link "
        "(cable, peer port or netdev down) | "
        "'mlx5_0/1 rate Gb/s'=100;;;0 'mlx5_0/2 rate Gb/s'=10;;;0"
    )
    assert r.out.splitlines()[1:] == [
        "[CRITICAL] port mlx5_0/2: state DOWN (physical_state POLLING): no link "
        "(cable, peer port or netdev down)",
        "[OK] counters mlx5_0/1: first run: baseline taken",
        "[OK] counters mlx5_0/2: first run: baseline taken",
        "[OK] port mlx5_0/1: ACTIVE 100 Gb/s 4X lid 28 sm_lid 1",
        "[OK] system 1 RDMA device; uverbs ABI 6; modules ib_core,ib_uverbs",
    ]
    assert r.err == ""


def test_a_port_the_config_ignores_leaves_the_node_ok(node, tmp_path):
    ib = node("mlx5_ib_hca")
    config = tmp_path / "health.toml"
    config.write_text('[ports."mlx5_0/2"]\nignore = true\n')
    r = ib.health("--config", str(config))
    assert (r.code, first_line(r.out)) == (
        0,
        "IBTOOL OK - all OK: counters 2, port 1, system 1 | 'mlx5_0/1 rate Gb/s'=100;;;0",
    )


def test_an_ib_port_without_sm_lid_is_critical(node):
    ib = node("mlx5_ib_hca")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/sm_lid", "0x0")
    r = ib.health("--check", "port")
    assert "[CRITICAL] port mlx5_0/1: no subnet manager LID" in r.out.splitlines()


# -- counters between runs -------------------------------------------------------------------------


def counters(ib, device: str = "mlx5_0", port: int = 1) -> Path:
    return ib.port(device, port) / "counters"


def test_error_counters_over_their_threshold_since_the_last_run_warn(node):
    ib = node("mlx5_ib_hca")
    assert ib.health("--check", "counters").code == 0
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", 11)
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors", 4)
    r = ib.health("--check", "counters")
    assert r.code == 1, r.out
    assert r.out.splitlines() == [
        "IBTOOL WARNING - mlx5_0/1: symbol_error +11 since the last run (warning 10)",
        "[WARNING] counters mlx5_0/1: symbol_error +11 since the last run (warning 10)",
        "[OK] counters mlx5_0/2: no errors since the last run",
    ]
    # the baseline moved on: nothing new, nothing to say
    r = ib.health("--check", "counters")
    assert r.code == 0 and "[OK] counters mlx5_0/1: no errors since the last run" in r.out


def test_moves_under_the_threshold_are_reported_not_alarmed(node):
    ib = node("mlx5_ib_hca")
    ib.health("--check", "counters")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors", 4)
    r = ib.health("--check", "counters")
    assert r.code == 0
    assert "[OK] counters mlx5_0/1: port_rcv_errors +4 since the last run" in r.out


def test_a_link_that_went_down_and_up_between_runs_is_a_flap(node):
    ib = node("mlx5_ib_hca")
    ib.health("--check", "counters")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/link_downed", 2)  # was 1
    r = ib.health("--check", "counters")
    assert (r.code, first_line(r.out)) == (
        1,
        "IBTOOL WARNING - mlx5_0/1: link went down once since the last run (flap)",
    )


def test_configured_thresholds_in_nagios_ranges(node, tmp_path):
    ib = node("mlx5_ib_hca")
    config = tmp_path / "health.toml"
    config.write_text(
        "[thresholds]\n"
        'port_rcv_errors = { warning = "2", critical = "5" }\n'
        'port_xmit_wait = "@1:"  # congestion, alarmed here\n'
    )
    ib.health("--check", "counters", "--config", str(config))
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors", 6)
    ib.write("sys/class/infiniband/mlx5_0/ports/2/counters/port_xmit_wait", 7)
    r = ib.health("--check", "counters", "--config", str(config))
    assert r.code == 2
    assert r.out.splitlines()[1:] == [
        "[CRITICAL] counters mlx5_0/1: port_rcv_errors +6 since the last run (critical 5)",
        "[WARNING] counters mlx5_0/1: port_xmit_wait saturated at 4294967295: clear it to count",
        "[WARNING] counters mlx5_0/2: port_xmit_wait +7 since the last run (warning @1:)",
    ]


def test_a_cleared_counter_is_a_new_baseline_not_an_alarm(node):
    ib = node("mlx5_ib_hca")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", 500)
    ib.health("--check", "counters")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", 3)  # perfquery -R
    r = ib.health("--check", "counters")
    assert r.code == 0
    assert "[OK] counters mlx5_0/1: symbol_error reset since the last run: new baseline" in r.out


def test_a_recreated_device_is_a_new_baseline(node):
    ib = node("mlx5_ib_hca")
    ib.health("--check", "counters")
    device = (ib.root / "sys/class/infiniband/mlx5_0").resolve()
    shutil.copytree(device, device.with_name("mlx5_0.new"), symlinks=True)
    shutil.rmtree(device)
    device.with_name("mlx5_0.new").rename(device)  # a new directory: the kernel made it anew
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", 40)
    r = ib.health("--check", "counters")
    assert r.code == 0, r.out
    assert "[OK] counters mlx5_0/1: device re-created since the last run: new baseline" in r.out


def test_a_reboot_is_a_new_baseline(node):
    ib = node("mlx5_ib_hca")
    ib.health("--check", "counters")
    ib.boot("0b7d3a52-1c3e-4f0e-8d6a-2b1b7c9e4a10")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", 40)
    r = ib.health("--check", "counters")
    assert r.code == 0
    assert "[OK] counters mlx5_0/1: rebooted since the last run: new baseline" in r.out


def test_a_saturated_error_counter_is_reported_as_such(node):
    ib = node("mlx5_ib_hca")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", 65535)
    r = ib.health("--check", "counters")
    assert r.code == 1
    assert "[WARNING] counters mlx5_0/1: symbol_error saturated at 65535: clear it to count" in (
        r.out.splitlines()
    )


def test_without_state_nothing_is_compared(node):
    ib = node("mlx5_ib_hca")
    r = ib.run_cli(["--root", str(ib.root), "health", "--check", "counters"])
    assert r.code == 0
    assert "[OK] counters mlx5_0/1: no state kept: error counters not compared" in r.out
    assert not ib.state.exists()


# -- ports between runs ----------------------------------------------------------------------------


def test_a_link_that_trained_down_from_its_best_warns(node):
    ib = node("mlx5_ib_hca")
    ib.health("--check", "port")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/rate", "25 Gb/sec (1X EDR)")
    r = ib.health("--check", "port")
    assert "[WARNING] port mlx5_0/1: trained down: 25 Gb/s 1X, it had 100 Gb/s" in r.out


def test_the_configured_rate_and_width(node, tmp_path):
    ib = node("mlx5_ib_hca")
    config = tmp_path / "health.toml"
    config.write_text('[ports."*"]\nrate = 200\n[ports."mlx5_0/2"]\nignore = true\n')
    r = ib.health("--check", "port", "--config", str(config))
    assert "[WARNING] port mlx5_0/1: rate 100 Gb/s 4X below the configured 200 Gb/s" in r.out
    config.write_text('[ports.mlx5_0]\nwidth = "8X"\n')
    r = ib.health("--check", "port", "--config", str(config))
    assert "[WARNING] port mlx5_0/1: width 4X, configured 8X: trained down (100 Gb/s 4X)" in (r.out)


def test_a_roce_carrier_flap_between_runs_warns(node):
    roce = node("mlx5_roce")
    r = roce.health("--check", "port")
    assert r.code == 0, r.out
    roce.write("sys/class/net/enp3s0f0/carrier_changes", 4)
    r = roce.health("--check", "port")
    assert (r.code, first_line(r.out).split(" | ")[0]) == (
        1,
        "IBTOOL WARNING - mlx5_0/1: link flapped: enp3s0f0 carrier changed 2 times since the "
        "last run",
    )


def test_a_port_that_came_back_says_so_once(node):
    ib = node("mlx5_ib_hca")
    assert ib.health("--check", "port").code == 2
    for name, value in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("lid", "0x2")):
        ib.write(f"sys/class/infiniband/mlx5_0/ports/2/{name}", value)
    ib.write("sys/class/infiniband/mlx5_0/ports/2/sm_lid", "0x1")
    r = ib.health("--check", "port")
    assert r.code == 0, r.out
    assert (
        "[OK] port mlx5_0/2: ACTIVE 10 Gb/s 4X lid 2 sm_lid 1; up again (was DOWN at the "
        "last run)" in r.out
    )
    assert "up again" not in ib.health("--check", "port").out


def test_roce_netdevs_and_addresses_the_config_needs_a_gid_for(node, tmp_path):
    roce = node("mlx5_roce")
    config = tmp_path / "health.toml"
    config.write_text('[roce]\nnetdevs = ["enp3s0f0", "10.9.9.9"]\n')
    r = roce.health("--check", "port", "--config", str(config))
    assert r.code == 2
    lines = r.out.splitlines()
    assert any(line.startswith("[OK] port enp3s0f0: RoCE v2 GID index ") for line in lines)
    assert (
        "[CRITICAL] port 10.9.9.9: no RoCE v2 GID for address 10.9.9.9 (no RDMA port has that "
        "address: configure it on the RDMA netdev (ip addr add ADDR dev NETDEV); GIDs follow "
        "the netdev's addresses)"
    ) in lines


# -- the system ------------------------------------------------------------------------------------


def test_without_uverbs_user_space_cannot_use_the_devices(node):
    ib = node("mlx5_ib_hca")
    shutil.rmtree(ib.root / "sys/class/infiniband_verbs")
    (ib.root / "sys/module/ib_core").mkdir(parents=True)  # a capture that has the module list
    r = ib.health("--check", "system")
    assert (r.code, r.out) == (
        2,
        "IBTOOL CRITICAL - ib_uverbs: module not loaded (no /sys/class/infiniband_verbs/"
        "abi_version): modprobe ib_uverbs\n"
        "[CRITICAL] system ib_uverbs: module not loaded (no /sys/class/infiniband_verbs/"
        "abi_version): modprobe ib_uverbs\n"
        "[OK] system 1 RDMA device\n",
    )


def test_a_capture_without_module_state_is_not_checked_not_unloaded(node):
    ib = node("mlx5_ib_hca")
    shutil.rmtree(ib.root / "sys/class/infiniband_verbs")
    r = ib.health("--check", "system")
    assert (r.code, r.out.splitlines()[1:]) == (
        0,
        ["[OK] system modules and uverbs: not in this capture, not checked"],
    )


def test_configured_devices_must_be_present(node, tmp_path):
    ib = node("mlx5_ib_hca")
    config = tmp_path / "health.toml"
    config.write_text('[health]\ndevices = ["mlx5_0", "mlx5_1"]\n')
    r = ib.health("--config", str(config))
    assert r.code == 2 and "mlx5_1: expected device mlx5_1 missing" in first_line(r.out)
    # One result (the port check's), not one more from the system check.
    assert (
        r.out.splitlines()[1:].count("[CRITICAL] port mlx5_1: expected device mlx5_1 missing") == 1
    )
    assert "configured device not present" not in r.out


# -- configuration and state -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # the TOML parser's own words, with the line
        ("[health]\nskip = [\n", "health.toml:2: Invalid value at the end of the file"),
        ("[health]\nskip = [\n\n[ports]\n", "health.toml:4: Invalid value"),
        ("[health]\n\nskipp = []\n", "health.toml:3: unknown key 'skipp' in [health]"),
        ('[thresholds]\nsymbol_error = "ten"\n', "health.toml:2: threshold of symbol_error: "),
        ('[ports."mlx5_0/1"]\nrate = "fast"\n', "health.toml:2: rate must be a number of Gb/s"),
        ("[datapath]\nbudget = 0\n", "health.toml:2: budget must be a number of seconds"),
        ("[sla]\n", "health.toml:1: unknown section [sla]"),
    ],
)
def test_a_bad_config_is_unknown_naming_the_line(node, tmp_path, text, message):
    ib = node("mlx5_ib_hca")
    config = tmp_path / "health.toml"
    config.write_text(text)
    r = ib.health("--config", str(config))
    assert r.code == 3
    assert r.out.startswith(f"IBTOOL UNKNOWN - config {config}") and message in r.out, r.out
    assert len(r.out.splitlines()) == 1


def test_a_missing_config_given_by_name_is_unknown(node, tmp_path):
    r = node("mlx5_ib_hca").health("--config", str(tmp_path / "nope.toml"))
    assert r.code == 3 and "no such file" in r.out


def test_a_held_lock_is_unknown_and_the_state_stays_whole(node):
    import fcntl

    ib = node("mlx5_ib_hca")
    ib.health()
    before = ib.state.read_bytes()
    with open(str(ib.state) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = ib.health("--lock-wait", "0.2")
    assert r.code == 3
    assert first_line(r.out).startswith(f"IBTOOL UNKNOWN - state {ib.state} is locked")
    assert ib.state.read_bytes() == before


def test_a_garbage_state_file_is_replaced_with_a_warning(node):
    ib = node("mlx5_ib_hca")
    ib.state.parent.mkdir(parents=True)
    ib.state.write_text("{not json")
    r = ib.health("--check", "counters")
    assert r.code == 0
    assert r.warnings == [f"ibtool: warning: state {ib.state} is not JSON: starting a new baseline"]
    assert json.loads(ib.state.read_text())["format"] == "ibtool-health-state"


def test_an_unknown_check_name_is_unknown(node):
    r = node("mlx5_ib_hca").health("--check", "nosuch")
    assert r.code == 3
    assert r.out == (
        "IBTOOL UNKNOWN - no health check named 'nosuch' "
        "(hint: checks: counters, datapath, fabric, gpudirect, peers, port, system)\n"
    )


# -- JSON and Prometheus ---------------------------------------------------------------------------


def test_json_has_every_result_with_its_perfdata(node):
    r = node("mlx5_ib_hca").health("-j", "--check", "port")
    data = r.json
    assert (data["status"], data["exit_code"], r.code) == ("CRITICAL", 2, 2)
    assert data["results"][0] == {
        "check": "port",
        "status": "OK",
        "subject": "mlx5_0/1",
        "summary": "ACTIVE 100 Gb/s 4X lid 28 sm_lid 1",
        "perfdata": [
            {
                "label": "mlx5_0/1 rate Gb/s",
                "value": 100.0,
                "unit": "",
                "warn": None,
                "crit": None,
                "min": 0,
                "max": None,
            }
        ],
    }


def test_the_textfile_is_valid_exposition_with_the_health_and_every_counter(node, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    ib = node("mlx5_ib_hca")
    path = tmp_path / "textfile" / "ibtool.prom"
    path.parent.mkdir()
    r = ib.health("--textfile", str(path))
    assert r.code == 2
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    status = families["ibtool_health_status"].samples
    assert [(s.labels, s.value) for s in status] == [({}, 2.0)]
    subjects = {
        (s.labels["check"], s.labels["subject"]): s.value
        for s in families["ibtool_health_subject_status"].samples
    }
    assert subjects[("port", "mlx5_0/2")] == 2 and subjects[("port", "mlx5_0/1")] == 0
    data = families["ibtool_port_xmit_data_bytes"].samples  # the parser drops _total
    assert [(s.labels, s.value) for s in data] == [
        ({"device": "mlx5_0", "port": "1"}, 4873402938521 * 4),
        ({"device": "mlx5_0", "port": "2"}, 0),
    ]
    assert families["ibtool_port_state_id"].type == "gauge"
    assert [p.name for p in path.parent.iterdir()] == ["ibtool.prom"]  # no temporary left


def test_a_textfile_not_named_prom_is_refused_and_the_results_still_shown(node, tmp_path):
    ib = node("mlx5_ib_hca")
    r = ib.run_cli(["--root", str(ib.root), "health", "--check", "counters", "--textfile",
                    str(tmp_path / "i.txt")])  # fmt: skip
    assert r.code == 3
    fault = (
        f"--textfile {tmp_path}/i.txt: node_exporter reads only files named *.prom "
        "(hint: e.g. --textfile /var/lib/node_exporter/textfile_collector/ibtool.prom)"
    )
    first = first_line(r.out)
    assert first.startswith(f"IBTOOL UNKNOWN - --textfile {tmp_path}/i.txt: node_exporter reads")
    assert len(first) <= len("IBTOOL UNKNOWN - ") + 200  # the whole fault is on its own line
    assert r.out.splitlines()[1:] == [
        f"[UNKNOWN] {fault}",
        "[OK] counters mlx5_0/1: no state kept: error counters not compared",
        "[OK] counters mlx5_0/2: no state kept: error counters not compared",
    ]


def test_a_lid_the_subnet_manager_moved_warns_once(node):
    ib = node("mlx5_ib_hca")
    ib.health("--check", "port")
    ib.write("sys/class/infiniband/mlx5_0/ports/1/lid", "0x1d")
    r = ib.health("--check", "port")
    assert "[WARNING] port mlx5_0/1: lid 29 (was 28) since the last run" in r.out.splitlines()
    assert "was 28" not in ib.health("--check", "port").out


def test_the_data_path_runs_only_when_asked_and_needs_the_live_host(node):
    ib = node("mlx5_ib_hca")
    assert "datapath" not in ib.health().out
    r = ib.health("--datapath", "--check", "datapath")
    assert (r.code, r.out) == (
        3,
        "IBTOOL UNKNOWN - data path not tested: --root trees hold only sysfs\n"
        "[UNKNOWN] datapath data path not tested: --root trees hold only sysfs\n",
    )

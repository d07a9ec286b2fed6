"""`ibtool doctor` on what real adapters show (fixture trees of tests/fixtures/sysfs_trees.py,
their files in the kernel's formats): this host's side of each check, as --root reads it. The
route, netfilter, DCB and the probe need the running kernel and are SKIP here; the two-host
testbed (tests/integration/test_pair_doctor.py) breaks and repairs them for real."""

from __future__ import annotations

import pytest

from tests.unit.conftest import _tree


def verdicts(result) -> dict[str, tuple[str, str]]:
    return {c["check"]: (c["status"], c["evidence"]) for c in result.json["checks"]}


def test_mlx5_roce_trained_down_on_its_slot(tmp_path):
    r = _tree("mlx5_roce", tmp_path)("doctor", "-j")
    assert r.code == 1, r.err  # WARN: the PCIe link
    got = verdicts(r)
    assert got["pcie"] == (
        "WARN",
        "trained down: 0000:03:00.0 8.0 GT/s PCIe x8 of 16.0 GT/s PCIe x16",
    )
    assert got["gid"] == ("PASS", "GID 3 192.168.10.1 RoCE v2 on enp3s0f0")
    # rdma_cm's configfs was set for mlx5_0: RoCE v2, ToS 106 (DSCP 26)
    assert got["roce_mode"] == ("PASS", "rdma_cm default RoCE v2")
    assert got["qos"][0] == "SKIP"
    assert got["qos"][1].startswith("ToS 106 (default_roce_tos) is DSCP 26")
    assert got["memlock"] == ("PASS", "memlock unlimited")
    assert got["numa"][0] == "PASS" and "NUMA node 0 (CPUs 0-15,32-47)" in got["numa"][1]
    assert got["pkey"] == ("PASS", "P_Key 0xffff (full) at index 0 of 1")
    assert got["route"][0] == got["udp4791"][0] == got["peer"][0] == "SKIP"
    # a capture has no ethtool to ask what the netdev supports
    assert got["rate"] == ("SKIP", "mlx5_0/1 at 100 Gb/sec (4X EDR); enp3s0f0's supported link "
                                   "modes need the running kernel (ethtool)")  # fmt: skip
    local = r.json["local"]
    assert local["driver"] == "mlx5_core" and local["netdev_mtu"] == 9000
    assert local["pci"][0] == {"bdf": "0000:03:00.0", "speed": "8.0 GT/s PCIe", "width": 8,
                               "max_speed": "16.0 GT/s PCIe", "max_width": 16}  # fmt: skip
    assert r.json["remote"] is None and r.json["status"] == "WARN"


def test_hfi1_opa_an_infiniband_port_skips_what_only_ip_has(tmp_path):
    r = _tree("hfi1_opa", tmp_path)("doctor", "-j")
    assert r.code == 0, r.err
    got = verdicts(r)
    for check in ("gid", "roce_mode", "arp", "route", "udp4791", "qos"):
        assert got[check][0] == "SKIP" and got[check][1].startswith("InfiniBand port"), check
    assert got["port"] == ("PASS", "hfi1_0/1 ACTIVE, LINK_UP, 100 Gb/sec (4X EDR)")
    assert got["rate"][0] == "SKIP" and "its maximum is not known here" in got["rate"][1]
    assert got["pkey"] == ("PASS", "P_Key 0x8001 (full) at index 0 of 2")
    assert got["pcie"] == ("PASS", "0000:81:00.0 8.0 GT/s PCIe x16 (its maximum)")
    assert got["memlock"][0] == "PASS" and "8 MiB" in got["memlock"][1]


def test_i40iw_iwarp_connects_by_ip(tmp_path):
    r = _tree("i40iw_iwarp", tmp_path)("doctor", "-j")
    got = verdicts(r)
    for check in ("gid", "roce_mode", "udp4791", "qos"):
        assert got[check][0] == "SKIP" and got[check][1].startswith("iWARP port"), check
    assert got["arp"][0] == "PASS" and "rp_filter 0, arp_ignore 1, arp_announce 2" in got["arp"][1]
    assert got["pcie"][0] == "PASS" and got["numa"][0] == "SKIP"
    assert got["memlock"][0] == "PASS" and "64 KiB" in got["memlock"][1]
    assert r.code == 0, r.out


@pytest.mark.parametrize("tree", ["mlx5_roce", "hfi1_opa", "i40iw_iwarp"])
def test_the_text_checklist_is_one_line_a_check_and_a_status(tmp_path, tree):
    r = _tree(tree, tmp_path)("doctor")
    lines = r.out.splitlines()
    assert lines[0].startswith("doctor: ")
    assert lines[-1].startswith("status: ")
    checks = [x.split()[1] for x in lines[1:-1] if not x.startswith(" ")]
    assert checks == ["peer", "stack", "port", "rate", "gid", "roce_mode", "memlock", "mtu",
                      "arp", "route", "udp4791", "qos", "pkey", "pcie", "numa"]  # fmt: skip


def test_a_peer_under_root_is_a_usage_free_skip_of_what_needs_the_kernel(tmp_path):
    r = _tree("mlx5_roce", tmp_path)("doctor", "--no-probe", "--dev", "mlx5_0/1", "-j")
    assert r.json["checks"][0]["status"] == "SKIP"


def test_an_unknown_device_is_one_error(tmp_path):
    r = _tree("mlx5_roce", tmp_path)("doctor", "--dev", "mlx5_9")
    assert r.code == 4 and r.out == ""
    assert r.err.startswith("ibtool: error: ") and len(r.err.splitlines()) == 1

"""`ibtool loopback` and the fabric's rules: Q_Keys (ud_qkey, --qkey), multicast (mcast), path
migration (apm) and service levels (--sl), on the fake pyverbs (pyverbs_fakes.py), whose device
follows the kernel's and the HCA's rules; a device that breaks one is caught."""

from __future__ import annotations

import pytest
from ibtool_plugins import loopback as loopback_plugin

from ibtool.errors import IbtoolError
from ibtool.rdma.loopback import mcast, operations, selftest
from ibtool.rdma.loopback.results import OPS
from tests.fixtures import sysfs_trees
from tests.unit.pyverbs_fakes import MIG_MIGRATED, RDMA_UDP_QKEY

ROCE_GID = "0000:0000:0000:0000:0000:ffff:c0a8:0a01"  # GID 3 of the mlx5_roce tree: 192.168.10.1
STANDARD_KEYS = [
    "op", "status", "size", "iters", "lat_min_us", "lat_p50_us", "lat_p99_us", "lat_max_us",
    "bw_MBps", "error",
]  # fmt: skip
AUTO_PATH_MIG = 1 << 4


@pytest.fixture
def roce(fake_pyverbs, live_roce):
    """(fabric, ibtool) on mlx5_0/1 of the mlx5_roce tree, a RoCE port."""
    fabric = fake_pyverbs("rdma-core-44")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    return fabric, live_roce


@pytest.fixture
def infiniband(fake_pyverbs, tmp_path, monkeypatch):
    """(fabric, ibtool) on mlx5_0/1 of the mlx5_ib_hca tree: LID 0x1c, LMC 2, IPoIB ib0 at
    10.1.0.1 (its address is what the host would answer, the one thing faked above verbs)."""
    from tests.unit.conftest import on_live_host

    ibtool = on_live_host(sysfs_trees.build("mlx5_ib_hca", tmp_path))
    monkeypatch.setattr(loopback_plugin, "ipv4_of", {"ib0": "10.1.0.1"}.get)
    fabric = fake_pyverbs("rdma-core-56")
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=0x1C, lmc=2, cap_flags=AUTO_PATH_MIG)
    fabric.ipoib["10.1.0.1"] = ("mlx5_0", 1)
    return fabric, ibtool


def results(r) -> dict[str, dict]:
    assert r.json is not None, r.err
    return {x["op"]: x for x in r.json["results"]}


def nothing_left(fabric) -> bool:
    attached = any(fabric.groups.values())
    return not (fabric.qps or fabric.mrs or fabric.cm_ids or attached)


# -- Q_Key --------------------------------------------------------------------------------------


def test_a_wrong_qkey_is_dropped_and_counted_the_keys_said(roce):
    fabric, ibtool = roce
    r = ibtool("-j", "loopback", "--ops", "ud_qkey", "--iters", "4", "--size", "64")
    assert r.code == 0, r.err
    x = results(r)["ud_qkey"]
    assert (x["status"], x["iters"], x["error"]) == ("PASS", 4, None)
    assert (x["qkey"], x["wrong_qkey"], x["dropped"]) == ("0x11111111", "0x11111110", 5)
    assert x["qkey_viol_cntr_delta"] == 5  # the warm-up round's too
    assert x["detail"] == (
        "receiver's Q_Key 0x11111111: 5 SENDs with 0x11111111 delivered, 5 with 0x11111110 "
        "dropped; port qkey_viol_cntr +5"
    )
    assert nothing_left(fabric)


def test_a_device_that_delivers_a_wrong_qkey_fails(roce):
    fabric, ibtool = roce
    fabric.ignores_qkey = True
    r = ibtool("loopback", "--ops", "ud_send,ud_qkey", "--iters", "2")
    assert r.code == 1
    lines = r.out.splitlines()
    assert lines[2].split()[:2] == ["ud_send", "PASS"]
    assert lines[3].split()[:2] == ["ud_qkey", "FAIL"]
    assert lines[4] == (
        "ud_qkey: a UD SEND with Q_Key 0x11111110 was delivered to a QP whose Q_Key is 0x11111111"
    )


def test_qkey_option_sets_the_ud_operations_keys(roce):
    _, ibtool = roce
    r = ibtool("-j", "loopback", "--ops", "ud_send,ud_qkey", "--iters", "2", "--qkey", "0x80010000")
    assert r.code == 0, r.err
    assert r.json["qkey"] == "0x80010000"
    x = results(r)
    assert x["ud_send"]["qkey"] == "0x80010000"
    # A controlled Q_Key in a work request means "the sending QP's own": the wrong one never is.
    assert (x["ud_qkey"]["qkey"], x["ud_qkey"]["wrong_qkey"]) == ("0x80010000", "0x00010001")
    assert x["ud_qkey"]["status"] == "PASS"


def test_a_refused_controlled_qkey_is_a_failure_with_the_hint_not_a_traceback(roce):
    fabric, ibtool = roce
    fabric.controlled_qkeys = False  # no CAP_NET_RAW, privileged-qkey off
    r = ibtool("loopback", "--ops", "send,ud_send,ud_qkey", "--iters", "2", "--qkey", "2147483649")
    assert r.code == 1 and "Traceback" not in r.err
    lines = r.out.splitlines()
    assert (
        lines[0] == "loopback on mlx5_0/1 gid 3, pkey 0xffff (index 0), 4096 bytes, 2 iterations, "
        "Q_Key 0x80000001"
    )
    assert [line.split()[:2] for line in lines[2:5]] == [
        ["send", "PASS"], ["ud_send", "FAIL"], ["ud_qkey", "FAIL"],
    ]  # fmt: skip
    for op, line in zip(("ud_send", "ud_qkey"), lines[5:]):
        assert line.startswith(
            f"{op}: Q_Key 0x80000001 is a controlled Q_Key (bit 31 set) and the kernel refused "
            "it to this process (UD QP RESET->RTS: "
        )
        assert line.endswith(
            "hint: run with CAP_NET_RAW (root), choose a Q_Key below 0x80000000 with --qkey, or "
            "let every process use them with `rdma system set privileged-qkey on` (Linux 6.7 "
            "and later)"
        )
    assert nothing_left(fabric)


@pytest.mark.parametrize("text", ["zz", "0x100000000", "-1", ""])
def test_a_qkey_that_is_not_32_bits_is_a_usage_error(roce, text):
    _, ibtool = roce
    r = ibtool("loopback", "--ops", "ud_send", "--qkey", text)
    assert r.code == 2
    assert r.err == (
        f"ibtool: error: --qkey {text}: a Q_Key is 32 bits (hint: give 0x0..0xffffffff, or "
        "decimal)\n"
    )


def test_the_existing_operations_report_as_before(roce):
    _, ibtool = roce
    r = ibtool("-j", "loopback", "--ops", "send,ud_send", "--iters", "2")
    assert list(r.json) == ["ifname", "port", "gid_index", "pkey_index", "pkey", "results"]
    assert [list(x) for x in r.json["results"]] == [STANDARD_KEYS, STANDARD_KEYS]
    text = ibtool("loopback", "--ops", "send,ud_send", "--iters", "2").out.splitlines()
    assert text[0] == "loopback on mlx5_0/1 gid 3, pkey 0xffff (index 0), 4096 bytes, 2 iterations"
    assert len(text) == 4  # header, table head, two rows: no notes, no details


# -- multicast ----------------------------------------------------------------------------------


def test_multicast_reaches_both_members_and_not_the_outsider_roce(roce):
    fabric, ibtool = roce
    r = ibtool("-j", "loopback", "--ops", "mcast", "--iters", "3", "--size", "128")
    assert r.code == 0, r.err
    x = results(r)["mcast"]
    assert (x["status"], x["iters"]) == ("PASS", 3)
    group = mcast.group_address("192.168.10.1")
    assert x["group"] == group and group.startswith("239.255.")
    assert x["mgid"].startswith("0000:0000:0000:0000:0000:ffff:efff:")
    assert (x["mlid"], x["qkey"], x["members"]) == (None, f"{RDMA_UDP_QKEY:#010x}", 2)
    assert x["detail"] == (
        f"group {group} (MGID {x['mgid']}, Q_Key 0x01234567) joined through rdma_cm by 2 UD "
        "QPs on mlx5_0/1: every SEND to it reached both, a QP that did not join got none"
    )
    assert nothing_left(fabric)  # ids destroyed, the group left


def test_multicast_on_infiniband_reports_the_mlid(infiniband):
    fabric, ibtool = infiniband
    r = ibtool("-j", "loopback", "--ops", "mcast", "--iters", "2")
    assert r.code == 0, r.err
    x = results(r)["mcast"]
    assert (x["status"], x["mlid"]) == ("PASS", "0xc001")
    assert ", MLID 0xc001, Q_Key 0x01234567) joined through rdma_cm" in x["detail"]
    assert nothing_left(fabric)


def test_a_multicast_reaching_a_qp_that_did_not_join_fails(roce):
    fabric, ibtool = roce
    fabric.floods_mcast = True
    r = ibtool("-j", "loopback", "--ops", "mcast", "--iters", "2")
    assert r.code == 1
    x = results(r)["mcast"]
    assert x["status"] == "FAIL"
    assert x["error"] == f"a QP that did not join {x['group']} received its multicast"
    assert nothing_left(fabric)


def test_a_kernel_that_cannot_join_such_a_group_is_unsupported(roce):
    fabric, ibtool = roce
    fabric.join_errno = 524  # ENOTSUPP, as Linux 6.1 answered for an IPv6 group on RoCE v2
    r = ibtool("-j", "loopback", "--ops", "send,mcast", "--iters", "2")
    assert r.code == 0, r.err
    x = results(r)["mcast"]
    group = mcast.group_address("192.168.10.1")
    assert (x["status"], x["group"]) == ("UNSUPPORTED", group)
    assert x["error"] == f"the kernel does not join {group} on mlx5_0/1 (ENOTSUPP, errno 524)"
    assert nothing_left(fabric)


def test_a_port_without_an_ip_address_cannot_do_multicast(infiniband, monkeypatch):
    fabric, ibtool = infiniband
    monkeypatch.setattr(loopback_plugin, "ipv4_of", lambda netdev: None)  # IPoIB unconfigured
    r = ibtool("-j", "loopback", "--ops", "mcast", "--iters", "2")
    assert r.code == 0, r.err
    assert results(r)["mcast"]["error"] == (
        "no IP address on mlx5_0/1's netdev: multicast groups are joined through rdma_cm, which "
        "finds a port by its IP address (IPoIB on InfiniBand)"
    )


def test_without_rdma_cm_multicast_is_unsupported_and_the_rest_runs(fake_pyverbs, live_roce):
    fabric = fake_pyverbs("rdma-core-65", rdmacm=False)
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})
    r = live_roce("-j", "loopback", "--ops", "send,mcast", "--iters", "2")
    assert r.code == 0, r.err
    x = results(r)
    assert x["send"]["status"] == "PASS" and x["mcast"]["status"] == "UNSUPPORTED"
    assert x["mcast"]["error"].startswith("librdmacm's part of pyverbs is not available (")
    assert "(hint: install the distribution's python3-pyverbs with librdmacm" in x["mcast"]["error"]


def test_ctrl_c_during_multicast_leaves_the_group_and_destroys_everything(roce, monkeypatch):
    fabric, _ = roce
    rounds = []
    real_round = mcast.Group.round

    def interrupted(self, *args):
        rounds.append(sorted(len(m) for m in fabric.groups.values()))
        if len(rounds) == 2:
            raise KeyboardInterrupt
        return real_round(self, *args)

    monkeypatch.setattr(mcast.Group, "round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        selftest.run("mlx5_0", 1, 3, ["mcast"], 64, 5, 5.0, mcast_source="192.168.10.1")
    assert rounds == [[2], [2]]  # both members were attached while it ran
    assert nothing_left(fabric)


# -- path migration -----------------------------------------------------------------------------


def test_apm_migrates_to_the_alternate_path_and_traffic_flows(infiniband):
    fabric, ibtool = infiniband
    r = ibtool("-j", "loopback", "--ops", "apm", "--iters", "3")
    assert r.code == 0, r.err
    x = results(r)["apm"]
    assert (x["status"], x["iters"], x["error"]) == ("PASS", 3, None)
    # LMC 2: the alternate path leaves from and goes to the port's second LID.
    assert (x["auto_path_mig"], x["alt_port"], x["alt_lid"]) == (True, 1, "0x1d")
    assert (x["path_mig_state"], x["peer_path_mig_state"]) == ("MIGRATED", "ARMED")
    assert x["detail"].startswith(
        "alternate path (port 1, LID 0x1d (path bits 1), alt_timeout 14) armed by the HCA in "
    )
    assert x["detail"].endswith(
        "ms; QP migrated to it (MIGRATED), SENDs verified both ways after; the peer QP is ARMED"
    )
    assert nothing_left(fabric)


def test_apm_with_lmc_0_uses_the_primary_lid_again(infiniband):
    fabric, ibtool = infiniband
    fabric.ports[("mlx5_0", 1)].lmc = 0
    x = results(ibtool("-j", "loopback", "--ops", "apm", "--iters", "1"))["apm"]
    assert (x["status"], x["alt_lid"]) == ("PASS", "0x1c")
    assert x["detail"].startswith("alternate path (port 1, LID 0x1c (the primary's), ")


def test_apm_without_the_device_capability_is_unsupported(infiniband):
    fabric, ibtool = infiniband
    fabric.ports[("mlx5_0", 1)].cap_flags = 0
    r = ibtool("-j", "loopback", "--ops", "send,apm", "--iters", "1")
    assert r.code == 0, r.err
    x = results(r)["apm"]
    assert (x["status"], x["auto_path_mig"]) == ("UNSUPPORTED", False)
    assert x["error"] == (
        "mlx5_0 does not report automatic path migration (device_cap_flags lacks AUTO_PATH_MIG)"
    )


def test_apm_on_roce_is_unsupported_though_the_device_reports_it(roce):
    fabric, ibtool = roce
    fabric.ports[("mlx5_0", 1)].cap_flags = AUTO_PATH_MIG  # as rxe does
    r = ibtool("loopback", "--ops", "apm", "--iters", "1")
    assert r.code == 0, r.err
    assert r.out.splitlines()[-1] == (
        "apm: the kernel refused an alternate path on mlx5_0/1, a RoCE port (EINVAL): Linux "
        "takes alternate paths on InfiniBand ports only, though the device reports AUTO_PATH_MIG"
    )
    assert nothing_left(fabric)


def test_an_hca_that_never_arms_the_alternate_path_fails(infiniband):
    fabric, ibtool = infiniband
    fabric.ports[("mlx5_0", 1)].arms = False
    r = ibtool("-j", "loopback", "--ops", "apm", "--iters", "1", "--timeout", "0.05")
    assert r.code == 1
    x = results(r)["apm"]
    assert x["status"] == "FAIL"
    assert x["error"].startswith(
        "the HCA did not arm the alternate path: path_mig_state is still REARM after "
    )
    assert nothing_left(fabric)


def test_migration_needs_an_armed_qp(fake_pyverbs):
    # The fake's rule is the HCA's: MIGRATED only from ARMED (what apm.migrate relies on).
    from ibtool.rdma.loopback import apm

    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=1, lid=5, cap_flags=AUTO_PATH_MIG)
    with operations.Loopback("mlx5_0", 1, None, 64, 1) as lb:
        assert apm.mig_state(lb.ladder, lb.qp_a) == MIG_MIGRATED
        with pytest.raises(IbtoolError, match=r"^migrate \(path_mig_state\): "):
            apm.migrate(lb.ladder, lb.qp_a)


# -- service level ------------------------------------------------------------------------------


def test_sl_goes_into_every_path_and_comes_back_on_infiniband(infiniband):
    fabric, ibtool = infiniband
    r = ibtool("loopback", "--ops", "send,ud_send,ud_qkey", "--iters", "2", "--sl", "3")
    assert r.code == 0, r.err + r.out
    lines = r.out.splitlines()
    assert lines[0] == "loopback on mlx5_0/1, pkey 0xffff (index 0), 4096 bytes, 2 iterations, sl 3"
    assert lines[1] == (
        "note: sl 3: the SL-to-VL tables of the port and the switches map the SL to a virtual lane"
    )
    assert fabric.rtr_sls == [3, 3]  # both RC QPs' paths


def test_a_ud_message_that_comes_on_another_sl_fails_on_infiniband(infiniband):
    fabric, ibtool = infiniband
    fabric.wc_sl = 0
    r = ibtool("-j", "loopback", "--ops", "ud_send", "--iters", "1", "--sl", "5")
    assert r.code == 1
    assert r.json["sl"] == 5
    assert results(r)["ud_send"]["error"] == "UD RECV came on SL 0, sent on SL 5"


def test_sl_on_roce_says_what_becomes_of_it(roce):
    _, ibtool = roce
    r = ibtool("loopback", "--ops", "ud_send", "--iters", "1", "--sl", "2")
    assert r.code == 0, r.err
    assert r.out.splitlines()[1] == (
        "note: sl 2: on RoCE the SL has no field on the wire: drivers send it as the frames' "
        "Ethernet priority (802.1p PCP, 0-7, on a VLAN netdev), rxe ignores it; the DSCP is the "
        "GRH's traffic class"
    )


@pytest.mark.parametrize("sl", ["-1", "16"])
def test_an_sl_outside_0_to_15_is_a_usage_error(roce, sl):
    _, ibtool = roce
    r = ibtool("loopback", "--sl", sl)
    assert (r.code, r.out) == (2, "")
    assert r.err.endswith(f"ibtool loopback: error: argument --sl: must be 0 to 15, not {sl}\n")


# -- the default run ----------------------------------------------------------------------------


def test_the_default_run_has_every_operation_and_fails_none_for_a_missing_feature(roce):
    fabric, ibtool = roce
    r = ibtool("-j", "loopback", "--iters", "1")
    assert r.code == 0, r.err
    x = results(r)
    assert list(x) == list(OPS)
    assert {op: v["status"] for op, v in x.items() if v["status"] != "PASS"} == {
        "apm": "UNSUPPORTED"
    }
    assert nothing_left(fabric)

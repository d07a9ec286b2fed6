"""`ibtool doctor`'s checklist on facts as real hosts have them: each check's PASS, and the
FAIL or WARN with its fix for each cause it names. The facts are built here by hand; the
fixture-tree tests (test_doctor_trees.py) read them from what adapters really show."""

from __future__ import annotations

import dataclasses

import pytest

from ibtool.doctor import checks
from ibtool.doctor.checks import Context
from ibtool.model.doctor import Facts, Finding, GidFact, PciFact, Verdict
from ibtool.views import doctor as view

PASS, WARN, FAIL, SKIP = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP


def roce(ip: str = "10.77.0.1", **changes) -> Facts:
    base = Facts(
        hostname="a",
        kernel="6.1.0-28-amd64",
        ibtool="0.1.0",
        device="rxe0",
        port=1,
        driver="rxe",
        link_layer="Ethernet",
        state="ACTIVE",
        physical_state="LinkUp",
        rate="100 Gb/sec (4X EDR)",
        active_mtu=1024,
        netdev="eth0",
        netdev_mtu=1500,
        gid_index=1,
        gids=(
            GidFact(
                0,
                "fe80:0000:0000:0000:5054:00ff:fe12:3401",
                "RoCE v2",
                "eth0",
                None,
                "fe80::5054:ff:fe12:3401",
            ),  # fmt: skip
            GidFact(1, "0000:0000:0000:0000:0000:ffff:0a4d:0001", "RoCE v2", "eth0", None, ip),
        ),
        pkeys=(0xFFFF,),
        dcb=False,
        rp_filter=0,
        arp_ignore=0,
        arp_announce=0,
        memlock_soft=-1,
        memlock_hard=-1,
        ipc_lock=True,
        modules=("ib_core", "ib_uverbs", "rdma_ucm"),
        uverbs="uverbs0",
        uverbs_node=True,
        rdma_cm_node=True,
        provider=True,
    )
    return dataclasses.replace(base, **changes)


PEER_B = Context(peer="b")


def only(check, local, peer=None, ctx=PEER_B) -> Finding:
    return check(local, peer, ctx)


@dataclasses.dataclass
class Route:
    destination: str
    dev: str | None
    src: str | None = None
    gateway: str | None = None
    type: str = "unicast"


def test_a_healthy_pair_passes_every_check_it_can_know():
    here, there = roce(), roce("10.77.0.2", hostname="b")
    ctx = Context(peer="b", peer_ip="10.77.0.2", route=Route("10.77.0.2", "eth0", "10.77.0.1"))
    findings = checks.run_checks(here, there, ctx)
    verdicts = {f.check: f.verdict for f in findings}
    assert {k for k, v in verdicts.items() if v not in (PASS, SKIP)} == set()
    assert verdicts["gid"] == verdicts["mtu"] == verdicts["route"] == verdicts["stack"] == PASS
    assert verdicts["qos"] == SKIP  # no DCB on the netdev
    stack = next(f for f in findings if f.check == "stack")
    assert stack.evidence == "both: ib_core, ib_uverbs, rdma_ucm loaded, uverbs0, provider for rxe"
    assert verdicts["pcie"] == SKIP  # software RDMA: no PCI device
    assert view.summary(findings).startswith("status: PASS (")


def test_a_peer_that_is_this_host_is_said_whole():
    ctx = Context(peer="a", peer_ip="10.77.0.1", route=Route("10.77.0.1", "lo", type="local"))
    f = only(checks.check_route, roce(), roce(), ctx)
    assert f.verdict == FAIL
    assert f.evidence == (
        "10.77.0.1 is an address of this host: the kernel delivers to it through lo, so "
        "nothing crosses the network and the peer is this host itself"
    )
    assert f.fix.startswith("give another host's address (ibtool loopback DEV/PORT")


def test_link_local_only_fails_and_says_to_add_an_address():
    here = roce(gid_index=None, gids=roce().gids[:1])
    f = only(checks.check_gid, here)
    assert f.verdict == FAIL
    assert "no routable RoCE v2 GID on eth0" in f.evidence and "link-local IPv6" in f.evidence
    assert f.fix == "ip addr add ADDRESS/PREFIX dev eth0"


def test_a_roce_version_or_family_mismatch_between_the_ends_fails():
    v1 = dataclasses.replace(roce().gids[1], type="RoCE v1")
    f = only(checks.check_gid, roce(), roce("10.77.0.2", gids=(roce().gids[0], v1)))
    assert f.verdict == WARN or f.verdict == FAIL
    assert "RoCE v1 is not routable" in f.evidence
    v6 = GidFact(1, "fd77:0001:0000:0000:0000:0000:0000:0002", "RoCE v2", "eth0", None, "fd77:1::2")
    f = only(checks.check_gid, roce(), roce(gids=(roce().gids[0], v6)))
    assert f.verdict == FAIL and "IPv4 here against IPv6 on the peer" in f.evidence


def test_missing_rdma_ucm_fails_with_modprobe():
    f = only(checks.check_stack, roce(modules=("ib_core", "ib_uverbs")))
    assert f.verdict == FAIL and "rdma_ucm not loaded" in f.evidence
    assert f.fix == "modprobe rdma_ucm"
    # on the peer only: the fix says where
    f = only(checks.check_stack, roce(), roce(modules=("ib_core", "ib_uverbs")))
    assert f.verdict == FAIL and f.fix == "on the peer: modprobe rdma_ucm"
    assert f.evidence.startswith("here: ib_core, ib_uverbs, rdma_ucm loaded")


def test_memlock_below_the_probe_fails_without_cap_ipc_lock_and_passes_with_it():
    f = only(checks.check_memlock, roce(memlock_soft=65536, memlock_hard=65536, ipc_lock=False))
    assert f.verdict == FAIL and f.evidence.startswith("memlock 64 KiB")
    assert "prlimit --memlock=unlimited" in f.fix
    f = only(checks.check_memlock, roce(memlock_soft=65536, ipc_lock=True))
    assert f.verdict == PASS and "CAP_IPC_LOCK" in f.evidence
    f = only(checks.check_memlock, roce(memlock_soft=64 << 20, ipc_lock=False))
    assert f.verdict == WARN


def test_an_mtu_mismatch_warns_naming_the_smaller_side():
    f = only(checks.check_mtu, roce(active_mtu=4096, netdev_mtu=9000), roce())
    assert f.verdict == WARN
    assert "here: active MTU 4096 (netdev eth0 9000); peer: active MTU 1024" in f.evidence
    fix = "set one MTU on both netdevs (ip link set dev eth0 mtu 9000 on the peer)"
    assert f.fix.startswith(fix)
    f = only(checks.check_mtu, roce(netdev_mtu=1600), roce())
    assert f.verdict == WARN


def test_strict_rp_filter_with_two_nics_in_one_subnet_fails():
    ctx = Context(peer="b", siblings=("eth1",))
    f = checks.check_arp(roce(rp_filter=1), None, ctx)
    assert f.verdict == FAIL and "shares its subnet with eth1" in f.evidence
    assert "rp_filter=2" in f.fix
    f = checks.check_arp(roce(rp_filter=2), None, ctx)
    assert f.verdict == WARN and "ARP flux" in f.evidence
    f = checks.check_arp(roce(rp_filter=2, arp_ignore=2, arp_announce=2), None, ctx)
    assert f.verdict == PASS
    assert checks.check_arp(roce(rp_filter=1), None, Context(peer="b")).verdict == PASS
    unknown = checks.check_arp(roce(rp_filter=1), None, Context(peer="b", siblings=None))
    assert unknown.verdict == WARN and "addresses not known" in unknown.evidence


def test_a_route_out_of_another_nic_fails():
    ctx = Context(peer="b", route=Route("10.77.0.2", "eth1", "10.77.0.9"))
    f = checks.check_route(roce(), None, ctx)
    assert f.verdict == FAIL and "10.77.0.2 via eth1" in f.evidence
    assert f.fix == "ip route add 10.77.0.2/32 dev eth0 src 10.77.0.1"
    unreachable = Route("10.77.0.2", None, type="unreachable")
    f = checks.check_route(roce(), None, Context(peer="b", route=unreachable))
    assert f.verdict == FAIL and "no route" in f.evidence


def test_an_nft_drop_of_udp_4791_fails_on_rxe_and_not_on_hardware():
    rule = "inet filter input: udp dport 4791 drop"
    f = only(checks.check_udp, roce(udp_filters=(rule,)))
    assert f.verdict == FAIL and rule in f.evidence
    f = only(checks.check_udp, roce(udp_filters=(rule,), driver="mlx5_core"))
    assert f.verdict == PASS and "takes RoCE in the NIC" in f.evidence


def test_a_traffic_class_on_a_lossy_priority_fails():
    dcb = dict(dcb=True, pfc=(3,), dscp_prio=((26, 3), (48, 6)), trust=("dscp",))
    f = checks.check_qos(roce(**dcb), None, Context(peer="b", tclass=0))
    assert f.verdict == FAIL
    assert "ToS 0 (--tclass) is DSCP 0 -> priority 0 (trust dscp), lossy" in f.evidence
    assert f.fix.startswith("use ToS 104 (DSCP 26)")
    f = checks.check_qos(roce(**dcb), None, Context(peer="b", tclass=104))
    assert f.verdict == PASS and "lossless" in f.evidence
    f = checks.check_qos(roce(roce_tos=104, **dcb), None, Context(peer="b"))
    assert f.verdict == PASS and "(default_roce_tos)" in f.evidence


def test_two_limited_pkey_members_fail():
    ib = dict(link_layer="InfiniBand", gids=(), gid_index=None, lid=7)
    f = only(checks.check_pkey, roce(pkeys=(0x7FFF,), **ib), roce(pkeys=(0x7FFF,), **ib))
    assert f.verdict == FAIL and "two limited members" in f.evidence
    f = only(checks.check_pkey, roce(pkeys=(0xFFFF,), **ib), roce(pkeys=(0x7FFF,), **ib))
    assert f.verdict == PASS
    f = only(checks.check_pkey, roce(pkeys=(0x8001,), **ib), roce(pkeys=(0xFFFF,), **ib))
    assert f.verdict == FAIL and "different partitions" in f.evidence


def test_pcie_trained_down_warns_and_a_slot_limit_does_not():
    down = (PciFact("0000:3b:00.0", "8.0 GT/s PCIe", 8, "16.0 GT/s PCIe", 16),
            PciFact("0000:3a:00.0", "16.0 GT/s PCIe", 16, "16.0 GT/s PCIe", 16))  # fmt: skip
    f = only(checks.check_pcie, roce(pci=down))
    assert f.verdict == WARN
    assert f.evidence == "trained down: 0000:3b:00.0 8.0 GT/s PCIe x8 of 16.0 GT/s PCIe x16"
    slot = (PciFact("0000:3b:00.0", "8.0 GT/s PCIe", 8, "16.0 GT/s PCIe", 16),
            PciFact("0000:3a:00.0", "8.0 GT/s PCIe", 8, "8.0 GT/s PCIe", 8))  # fmt: skip
    assert only(checks.check_pcie, roce(pci=slot)).verdict == PASS


def test_numa_warns_when_every_allowed_cpu_is_remote():
    f = only(checks.check_numa, roce(numa_node=1, local_cpus="16-31", allowed_cpus="0-7"))
    assert f.verdict == WARN and "numactl --cpunodebind=1 --membind=1" in f.fix
    assert only(checks.check_numa, roce(numa_node=0, local_cpus="0-15",
                                        allowed_cpus="0-7")).verdict == PASS  # fmt: skip


def test_iwarp_skips_what_only_roce_has_and_keeps_ip_routing():
    iw = roce(protocol="iw", gid_index=None, gids=())
    for check in (checks.check_gid, checks.check_roce_mode, checks.check_udp, checks.check_qos):
        f = only(check, iw)
        assert f.verdict == SKIP and f.evidence.startswith("iWARP port"), f
    ctx = Context(peer="b", route=Route("10.77.0.2", "eth1"))
    assert checks.check_route(iw, None, ctx).verdict == FAIL


def test_a_peer_that_told_nothing_is_a_warning_with_the_reason():
    ctx = Context(peer="b", no_facts="no ibtool ping server at b:18520: Connection refused")
    f = checks.check_peer(roce(), None, ctx)
    assert f.verdict == WARN and "Connection refused" in f.evidence
    assert f.fix == "run `ibtool ping --server` on b"


@pytest.mark.parametrize("mode,verdict", [("IB/RoCE v1", WARN), ("RoCE v2", PASS)])
def test_rdma_cm_roce_mode(mode, verdict):
    assert only(checks.check_roce_mode, roce(roce_mode=mode)).verdict == verdict


def test_the_kernel_default_roce_mode_is_v1_on_dual_mode_ports():
    v1 = GidFact(2, "0000:0000:0000:0000:0000:ffff:0a4d:0001", "RoCE v1", "eth0", None, "10.77.0.1")
    f = only(checks.check_roce_mode, roce(gids=roce().gids + (v1,)))
    assert f.verdict == WARN and "(kernel default)" in f.evidence


def test_the_checklist_text():
    findings = [
        Finding("gid", PASS, "GID 1 10.77.0.1 RoCE v2 on eth0"),
        Finding("mtu", FAIL, "MTU differs", "ip link set dev eth0 mtu 1500"),
    ]
    assert view.lines(findings) == [
        "PASS  gid        GID 1 10.77.0.1 RoCE v2 on eth0",
        "FAIL  mtu        MTU differs",
        "                 fix: ip link set dev eth0 mtu 1500",
    ]
    assert view.summary(findings) == "status: FAIL (1 failed, 1 passed)"
    assert view.head(roce(), roce("10.77.0.2", hostname="b"), "b") == (
        "doctor: rxe0/1 GID 1 10.77.0.1 -> b (rxe0/1 GID 1 10.77.0.2 on b)"
    )


def test_the_peers_trust_mapping_the_traffic_class_to_a_lossy_priority_fails_there():
    """The peer's DCB as an mlx5 with trust dscp and PFC on priority 3 reports it (the DCB
    replies veth cannot give: test_system_facts.py parses such replies built from the uapi)."""
    dcb = dict(dcb=True, pfc=(3,), dscp_prio=((26, 3),), trust=("dscp",))
    f = checks.check_qos(roce(), roce("10.77.0.2", **dcb), Context(peer="b", tclass=96))
    assert f.verdict == FAIL
    assert f.evidence.startswith("here: ToS 96 (--tclass) is DSCP 24; eth0 has no DCB")
    assert "peer: ToS 96 (--tclass) is DSCP 24 -> priority 0 (trust dscp), lossy" in f.evidence
    assert f.fix.startswith("on the peer: use ToS 104 (DSCP 26)")


def test_ends_with_different_active_mtus_are_a_warning_not_a_failure():
    # connections take the smaller; what fails is an application that fixes the larger
    here, there = roce(active_mtu=1024, netdev_mtu=1500), roce(active_mtu=4096, netdev_mtu=9000)
    f = only(checks.check_mtu, here, there)
    assert f.verdict == WARN
    assert "connections take the smaller, 1024; a QP whose path MTU is set to 4096" in f.evidence
    assert f.fix.startswith("set one MTU on both netdevs (ip link set dev eth0 mtu 9000 here)")


class _Ladder:
    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _probe_with(monkeypatch, drops_above: int | None) -> list:
    """probe_native against a path that answers every ping up to `drops_above` bytes."""
    from ibtool.doctor import probe
    from ibtool.rdma import ladder
    from ibtool.rdma.ping import client

    sizes = []

    class Client:
        def __init__(self, ladder, peer, port, size, mode, timeout, path):
            sizes.append(size)
            self.size = size

        def close(self):
            pass

    def run_client(c, count, interval, deadline, reply, loss, stats, rtts):
        stats.sent = count
        if drops_above is not None and c.size > drops_above:
            for seq in range(1, count + 1):
                loss(seq, f"ping {seq}: no reply in 2 s")
            stats.received = 0
        else:
            stats.received = count
            rtts.extend([100.0] * count)

    monkeypatch.setattr(ladder, "Ladder", _Ladder)
    monkeypatch.setattr(client, "Client", Client)
    monkeypatch.setattr(client, "run_client", run_client)
    found = probe.probe_native("rxe0", 1, 1, "10.77.0.2", 18520, 3, 64, 2.0, None, 4096)
    return sizes, found


def test_the_probe_sends_one_full_packet_at_the_path_mtu(monkeypatch):
    sizes, found = _probe_with(monkeypatch, None)
    assert sizes == [64, 64, 4096]
    assert [f.verdict for f in found] == [PASS, PASS, PASS]
    assert found[2].evidence.startswith("RC SEND of 4096 bytes (the path MTU): 3/3 answered")


def test_a_smaller_mtu_on_the_path_fails_the_full_packet_probe_only(monkeypatch):
    # 64 bytes pass, 4096 are dropped: the switch (or a tunnel) has a smaller MTU than the ends
    _, found = _probe_with(monkeypatch, 1100)
    assert [f.verdict for f in found] == [PASS, PASS, FAIL]
    assert "RC SEND passed, so the path drops packets of 4096 bytes of payload" in found[2].evidence
    assert found[2].fix.startswith("find the smaller MTU on the path")


def test_ends_at_different_rates_or_firmware_are_a_warning():
    here = roce(fw="16.35.2000")
    f = only(checks.check_port, here, roce("10.77.0.2", fw="16.35.2000"))
    assert f.verdict == PASS and f.evidence.startswith("both: rxe0/1 ACTIVE")
    slow = roce("10.77.0.2", rate="25 Gb/sec (1X EDR)", fw="16.35.1012")
    f = only(checks.check_port, here, slow)
    assert f.verdict == WARN
    assert f.evidence.endswith(
        "25 Gb/sec (1X EDR): the ends run at different rates; "
        "firmware 16.35.2000 here, 16.35.1012 on the peer"
    )
    assert "reseat or replace the cable" in f.fix and "one firmware version" in f.fix
    # other drivers (an mlx5 against a bnxt_re) have firmware of their own
    f = only(checks.check_port, here, roce("10.77.0.2", driver="bnxt_re", fw="227.0.131.0"))
    assert f.verdict == PASS

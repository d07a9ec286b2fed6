"""The Host's facts about the host around the RDMA devices (what `ibtool doctor` reads): IPv4
sysctls, the RDMA CM's RoCE defaults, PCIe links, NUMA, memlock, CPU affinity, libibverbs
providers, MTU, DCB, the route, netfilter rules.

File readers run on the fixture trees (tests/fixtures/sysfs_trees.py) and on trees spoiled
one file at a time: missing, malformed, a link out of the root, too large. The kernel's
answers (DCB, routes) and the firewall tools' outputs come through the Host's seams.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
from pathlib import Path

import pytest

from ibtool.errors import UsageError
from ibtool.host import Host
from ibtool.model.system import Dcb, Ipv4Conf, MemLock, PciLink, RoceDefaults, Route
from ibtool.sources import firewall, rtnetlink
from ibtool.sources.proc import parse_memlock
from ibtool.sources.sysfs.pci import parse_cpulist
from ibtool.sources.sysfs.rooted import READ_LIMIT
from tests.fixtures import sysfs_trees
from tests.unit.route_socket import RouteSocket

TREES = ("mlx5_roce", "hfi1_opa", "i40iw_iwarp")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("system")
    return {name: sysfs_trees.build(name, base / name) for name in TREES}


@pytest.fixture
def tree(tmp_path):
    """A fresh tree to spoil: tree(name) -> its root."""

    def make(name: str) -> Path:
        return sysfs_trees.build(name, tmp_path / name)

    return make


def host_of(root: Path, **seams) -> tuple[Host, list[str]]:
    warnings: list[str] = []
    return Host(str(root), warnings.append, **seams), warnings


# -- the fixture trees, read as they are --------------------------------------------------------


def test_pci_links_from_the_function_up_to_the_root_port(built):
    host, warnings = host_of(built["mlx5_roce"])
    assert host.pci_links("mlx5_0") == (
        PciLink("0000:03:00.0", "8.0 GT/s PCIe", 8, "16.0 GT/s PCIe", 16),
        PciLink("0000:00:03.0", "8.0 GT/s PCIe", 8, "16.0 GT/s PCIe", 16),
    )
    assert all(link.degraded for link in host.pci_links("mlx5_0"))
    host, _ = host_of(built["hfi1_opa"])
    links = host.pci_links("hfi1_0")
    assert [link.bdf for link in links] == ["0000:81:00.0", "0000:80:03.0"]
    assert not any(link.degraded for link in links)
    host, _ = host_of(built["i40iw_iwarp"])
    assert host.pci_links("i40iw0")[0] == PciLink("0000:3d:00.0", "8 GT/s", 8, "8 GT/s", 8)
    assert host.pci_links("i40iw0")[0].max_gts == 8.0
    assert warnings == []


def test_numa(built):
    host, warnings = host_of(built["mlx5_roce"])
    numa = host.numa("mlx5_0")
    assert numa.node == 0 and numa.local_cpus == frozenset([*range(16), *range(32, 48)])
    host, _ = host_of(built["hfi1_opa"])
    assert host.numa("hfi1_0").node == 1
    host, _ = host_of(built["i40iw_iwarp"])
    assert host.numa("i40iw0").node is None  # numa_node -1
    assert host.numa("i40iw0").local_cpus == frozenset(range(40))
    assert warnings == []


def test_a_device_without_a_pci_function_has_no_links(tmp_path):
    root = tmp_path / "t"
    sysfs_trees.ib_device(root, "rxe0", None, {"node_type": "1: CA"})
    host, warnings = host_of(root)
    assert host.pci_links("rxe0") == ()
    assert host.numa("rxe0").node is None and host.numa("rxe0").local_cpus is None
    assert warnings == []


def test_ipv4_conf_and_what_the_kernel_goes_by(built):
    host, warnings = host_of(built["mlx5_roce"])
    conf = host.ipv4_conf("enp3s0f0")
    assert conf == Ipv4Conf("enp3s0f0", 2, 0, 0, 0, 0, 0, 0, 0)
    assert conf.effective_rp_filter == 2
    host, _ = host_of(built["hfi1_opa"])
    conf = host.ipv4_conf("ib0")
    assert (conf.rp_filter, conf.all_rp_filter, conf.effective_rp_filter) == (0, 1, 1)
    host, _ = host_of(built["i40iw_iwarp"])
    conf = host.ipv4_conf("eno1")
    assert (conf.effective_arp_ignore, conf.effective_arp_announce) == (1, 2)
    assert conf.effective_accept_local is False
    assert warnings == []


def test_memlock_and_allowed_cpus(built):
    expected = {
        "mlx5_roce": (MemLock(None, None), frozenset(range(64))),
        "hfi1_opa": (MemLock(8388608, 8388608), frozenset([*range(16, 32), *range(48, 64)])),
        "i40iw_iwarp": (MemLock(65536, 65536), frozenset(range(40))),
    }
    for name, (memlock, cpus) in expected.items():
        host, warnings = host_of(built[name])
        assert (host.memlock(), host.allowed_cpus()) == (memlock, cpus), name
        assert warnings == []
    assert expected["mlx5_roce"][0].unlimited and not expected["i40iw_iwarp"][0].unlimited


def test_roce_defaults(built):
    host, warnings = host_of(built["mlx5_roce"])
    assert host.roce_defaults("mlx5_0", 1) == RoceDefaults("RoCE v2", 106, True, True, True)
    host, _ = host_of(built["hfi1_opa"])
    defaults = host.roce_defaults("hfi1_0", 1)
    assert defaults == RoceDefaults(None, None, False, True, False)
    assert (defaults.effective_mode, defaults.effective_tos) == ("RoCE v2", 0)
    host, _ = host_of(built["i40iw_iwarp"])
    assert host.roce_defaults("i40iw0", 1).mounted is None  # no mount table in the tree
    assert warnings == []


def test_roce_defaults_never_make_the_configfs_directory(tree):
    root = tree("hfi1_opa")
    host, _ = host_of(root)
    host.roce_defaults("hfi1_0", 1)
    assert not (root / "sys" / "kernel" / "config").exists()


def test_providers_mtu_and_addresses(built):
    host, warnings = host_of(built["mlx5_roce"])
    assert host.verbs_providers() == ("mlx4", "mlx5", "rxe", "siw")
    assert host.netdev_mtu("enp3s0f0") == 9000
    assert host.ipv4_addresses("enp3s0f0") == ("192.168.10.1",)
    assert host.ipv4_addresses("enp3s0f0.100") == ("192.168.100.1",)
    host, _ = host_of(built["hfi1_opa"])
    assert host.verbs_providers() == ("hfi1verbs",)
    assert host.netdev_mtu("ib0") == 2044
    assert warnings == []


def test_the_running_kernel_only_facts_are_none_under_root(built):
    host, warnings = host_of(built["mlx5_roce"])
    assert host.dcb("enp3s0f0") is None
    assert host.route("192.168.10.2") is None
    assert host.udp_filters() == ()
    assert warnings == []


# -- spoiled trees: one warning per bad file, the rest read ------------------------------------

CONF = "proc/sys/net/ipv4/conf"


def test_a_missing_sysctl(tree):
    root = tree("mlx5_roce")
    (root / CONF / "all" / "rp_filter").unlink()
    host, warnings = host_of(root)
    conf = host.ipv4_conf("enp3s0f0")
    assert conf.all_rp_filter is None and conf.effective_rp_filter is None
    assert conf.rp_filter == 2 and conf.all_arp_ignore == 0
    assert warnings == ["/proc/sys/net/ipv4/conf/all/rp_filter: missing"]


def test_a_netdev_without_a_conf_directory(tree):
    host, warnings = host_of(tree("mlx5_roce"))
    conf = host.ipv4_conf("eth9")
    assert conf.rp_filter is None and conf.all_rp_filter == 0
    assert warnings == ["/proc/sys/net/ipv4/conf/eth9: missing"]
    host.ipv4_conf("../../../etc")
    assert len(warnings) == 2 and "not a netdev name" in warnings[1]


def test_a_malformed_sysctl(tree):
    root = tree("mlx5_roce")
    (root / CONF / "enp3s0f0" / "arp_ignore").write_text("one\n")
    host, warnings = host_of(root)
    conf = host.ipv4_conf("enp3s0f0")
    assert conf.arp_ignore is None and conf.rp_filter == 2 and conf.arp_announce == 0
    assert warnings == ["/proc/sys/net/ipv4/conf/enp3s0f0/arp_ignore: malformed value 'one'"]
    host.ipv4_conf("enp3s0f0")
    assert len(warnings) == 1  # once per file


def test_a_malformed_link_width_and_an_unknown_speed(tree):
    root = tree("mlx5_roce")
    fn = root / "sys" / "devices" / sysfs_trees.ROCE_PF
    (fn / "current_link_width").write_text("x8\n")
    (fn / "current_link_speed").write_text("Unknown\n")
    host, warnings = host_of(root)
    link = host.pci_links("mlx5_0")[0]
    assert link == PciLink("0000:03:00.0", None, None, "16.0 GT/s PCIe", 16)
    assert len(host.pci_links("mlx5_0")) == 2
    assert len(warnings) == 1 and warnings[0].endswith("current_link_width: malformed value 'x8'")


def test_a_conventional_pci_hop_has_no_link_attributes(tree):
    root = tree("mlx5_roce")
    bridge = root / "sys" / "devices" / "pci0000:00" / "0000:00:03.0"
    for name in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
        (bridge / name).unlink()
    host, warnings = host_of(root)
    assert host.pci_links("mlx5_0")[1] == PciLink("0000:00:03.0", None, None, None, None)
    assert warnings == []


def test_missing_and_malformed_numa(tree):
    root = tree("hfi1_opa")
    fn = root / "sys" / "devices" / "pci0000:80" / "0000:80:03.0" / "0000:81:00.0"
    (fn / "local_cpulist").write_text("16-31,x\n")
    (fn / "numa_node").unlink()
    host, warnings = host_of(root)
    assert host.numa("hfi1_0") == type(host.numa("hfi1_0"))(None, None)
    assert len(warnings) == 2
    assert warnings[0].endswith("numa_node: missing")
    assert warnings[1].endswith("local_cpulist: malformed value '16-31,x'")


def test_a_missing_and_a_malformed_limits_file(tree):
    root = tree("i40iw_iwarp")
    limits = root / "proc" / "self" / "limits"
    text = limits.read_text()
    limits.write_text(text.replace("65536                65536", "65536                lots"))
    host, warnings = host_of(root)
    assert host.memlock() == MemLock(None, None, known=False)
    assert not host.memlock().unlimited
    assert len(warnings) == 1 and warnings[0].startswith("/proc/self/limits: malformed value")
    limits.unlink()
    host, warnings = host_of(root)
    assert host.memlock() == MemLock(None, None, known=False)
    assert warnings == ["/proc/self/limits: missing"]
    assert host.memlock(4242).known is False and warnings[-1] == "/proc/4242/limits: missing"


def test_parse_memlock_of_the_running_kernel():
    with open("/proc/self/limits") as f:
        assert parse_memlock(f.read()).known


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("5", {5}), ("", set()), ("0-1\n", {0, 1})],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("text", ["3-1", "a", "1,,2", "-1", "0-99999999"])
def test_parse_cpulist_refuses(text):
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_a_malformed_configfs_mode_and_a_provider_line(tree):
    root = tree("mlx5_roce")
    port = root / "sys" / "kernel" / "config" / "rdma_cm" / "mlx5_0" / "ports" / "1"
    (port / "default_roce_mode").write_text("RoCE v3\n")
    (root / "etc" / "libibverbs.d" / "rxe.driver").write_text("drver rxe\n")
    host, warnings = host_of(root)
    assert host.roce_defaults("mlx5_0", 1) == RoceDefaults(None, 106, True, True, True)
    assert host.roce_defaults("mlx5_0", 1).effective_mode is None
    assert host.verbs_providers() == ("mlx4", "mlx5", "siw")
    assert len(warnings) == 2
    assert warnings[0].endswith("default_roce_mode: malformed value 'RoCE v3'")
    assert warnings[1] == "/etc/libibverbs.d/rxe.driver: malformed line 'drver rxe'"


def test_links_out_of_the_root_are_not_followed(tree, tmp_path):
    root = tree("mlx5_roce")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "limits").write_text(sysfs_trees.proc_limits(1) + "\n")
    limits = root / "proc" / "self" / "limits"
    limits.unlink()
    os.symlink(outside / "limits", limits)  # absolute: the examining host's file
    rp_filter = root / CONF / "all" / "rp_filter"
    rp_filter.unlink()
    os.symlink(
        "../../../../../../../../../../../../proc/sys/net/ipv4/conf/all/rp_filter", rp_filter
    )
    # the ib_device's device link, pointed at a PCI function outside the tree
    fn = outside / "pci0000:00" / "0000:00:03.0" / "0000:03:00.0"
    sysfs_trees.pci_link(fn, ("2.5 GT/s PCIe", 1), ("2.5 GT/s PCIe", 1))
    device = (root / "sys" / "class" / "infiniband" / "mlx5_0").resolve() / "device"
    device.unlink()
    os.symlink(fn, device)
    host, warnings = host_of(root)
    assert host.memlock() == MemLock(None, None, known=False)
    assert host.ipv4_conf("enp3s0f0").all_rp_filter is None
    assert host.pci_links("mlx5_0") == ()
    assert host.numa("mlx5_0").node is None
    assert len(warnings) == 3
    assert all("a link out of the root" in w and "not followed" in w for w in warnings)


def test_a_link_inside_the_root_is_followed(tree):
    root = tree("mlx5_roce")
    limits = root / "proc" / "self" / "limits"
    target = root / "proc" / "48211" / "limits"
    target.parent.mkdir()
    limits.rename(target)
    os.symlink("../48211/limits", limits)
    host, warnings = host_of(root)
    assert host.memlock() == MemLock(None, None) and warnings == []


def test_a_dangling_link(tree):
    root = tree("mlx5_roce")
    status = root / "proc" / "self" / "status"
    status.unlink()
    os.symlink("nowhere", status)
    host, warnings = host_of(root)
    assert host.allowed_cpus() is None
    assert warnings == ["/proc/self/status: dangling link"]


def test_oversized_files_are_not_read(tree):
    root = tree("mlx5_roce")
    fn = root / "sys" / "devices" / sysfs_trees.ROCE_PF
    (fn / "local_cpulist").write_text("0," * READ_LIMIT)
    (root / "proc" / "self" / "limits").write_text("x" * (READ_LIMIT + 1))
    host, warnings = host_of(root)
    assert host.numa("mlx5_0").local_cpus is None and host.numa("mlx5_0").node == 0
    assert host.memlock().known is False
    assert len(warnings) == 2
    assert all(w.endswith(f"larger than {READ_LIMIT} bytes: not read") for w in warnings)


def test_a_fifo_does_not_block(tree):
    root = tree("mlx5_roce")
    limits = root / "proc" / "self" / "limits"
    limits.unlink()
    os.mkfifo(limits)
    host, warnings = host_of(root)
    assert host.memlock().known is False and len(warnings) == 1


def test_live_allowed_cpus_is_the_affinity():
    host = Host(warn=lambda m: None)
    assert host.allowed_cpus() == frozenset(os.sched_getaffinity(0))
    warnings: list[str] = []
    assert Host(warn=warnings.append).allowed_cpus(2**22 + 7) is None and warnings


# -- DCB: replies built from the uapi layout ---------------------------------------------------
#
# Not captured from a card: the bytes are built field by field from include/uapi/linux/dcbnl.h
# (struct dcbmsg, struct ieee_pfc, struct dcb_app, the attribute numbers) in the order
# net/dcb/dcbnl.c dcbnl_ieee_fill puts them, as a kernel would for a ConnectX (mlx5) with PFC
# on priority 3 and trust dscp (mlx5 then adds an APP entry per DSCP value, priority dscp >> 3:
# en_dcbnl.c mlx5e_dcbnl_dscp_app).


def nla(kind: int, payload: bytes, nested: bool = False) -> bytes:
    head = struct.pack("=HH", 4 + len(payload), kind | (0x8000 if nested else 0))
    return head + payload + b"\0" * (-len(payload) % 4)


def ieee_pfc(cap: int, enabled: set[int]) -> bytes:
    en = sum(1 << p for p in enabled)
    raw = struct.pack("=BBBxH", cap, en, 0, 0).ljust(8, b"\0") + b"\0" * 128
    assert len(raw) == 136  # sizeof(struct ieee_pfc)
    return raw


def dcb_app(selector: int, priority: int, protocol: int) -> bytes:
    return struct.pack("=BBH", selector, priority, protocol)


def ieee_ets() -> bytes:
    # willing, ets_cap 8, cbs, tc_tx_bw[8], tc_rx_bw[8], tc_tsa[8], prio_tc[8], tc_reco_*[8*3]
    return struct.pack("=BBB", 0, 8, 0) + bytes(8 * 7)


def mlx5_reply(seq: int, netdev: str = "enp3s0f0", trust: tuple[int, ...] | None = None) -> bytes:
    apps = b"".join(nla(1, dcb_app(5, dscp >> 3, dscp)) for dscp in range(64))
    ieee = nla(1, ieee_ets()) + nla(2, ieee_pfc(8, {3})) + nla(3, apps, nested=False)
    if trust is not None:
        ieee += nla(11, b"".join(nla(1 if s != 255 else 2, bytes([s])) for s in trust), True)
    body = struct.pack("=BBH", 0, 21, 0)
    body += nla(1, netdev.encode() + b"\0") + nla(13, ieee) + nla(14, bytes([0x8 | 0x4]))
    return struct.pack("=IHHII", 16 + len(body), 78, 0, seq, 0) + body


def error_reply(seq: int, code: int) -> bytes:
    request = struct.pack("=IHHII", 16, 78, 1, seq, 0)
    body = struct.pack("=i", -code) + request
    return struct.pack("=IHHII", 16 + len(body), 2, 0, seq, 0) + body


def FakeRouteSocket(answer, extra: list[bytes] = ()) -> RouteSocket:
    """Answers the RTM_GETDCB request with `extra`'s reads, then `answer(seq)`."""
    return RouteSocket(lambda seq: [*extra, answer(seq)])


def dcb_host(sock) -> tuple[Host, list[str]]:
    warnings: list[str] = []
    return Host("/nonexistent", warnings.append, live=False, rtnetlink=lambda: sock), warnings


def test_dcb_of_a_connectx_trusting_dscp():
    sock = FakeRouteSocket(mlx5_reply)
    host, warnings = dcb_host(sock)
    dcb = host.dcb("enp3s0f0")
    assert dcb.pfc_enabled == frozenset({3}) and dcb.pfc_cap == 8
    assert dcb.priority_of_dscp(26) == 3 and dcb.priority_of_dscp(46) == 5
    assert len(dcb.dscp_prio) == 64
    assert dcb.trust is None  # no DCB_ATTR_DCB_APP_TRUST_TABLE: mlx5 has no dcbnl_getapptrust
    assert warnings == [] and sock.closed
    # the request: RTM_GETDCB, NLM_F_REQUEST, dcbmsg{AF_UNSPEC, DCB_CMD_IEEE_GET}, IFNAME
    request = sock.requests[0]
    assert struct.unpack_from("=HH", request, 4) == (78, 1)
    assert request[16:18] == bytes([0, 21]) and b"enp3s0f0\0" in request


def test_dcb_with_a_trust_table():
    # Linux 6.1+ with a driver that has dcbnl_getapptrust (sparx5, lan966x, DSA switches)
    sock = FakeRouteSocket(lambda seq: mlx5_reply(seq, trust=(5, 255)))
    host, _ = dcb_host(sock)
    assert host.dcb("enp3s0f0").trust == ("dscp", "pcp")


def test_dcb_ignores_answers_to_other_requests():
    stale = error_reply(1, errno.EINVAL)
    sock = FakeRouteSocket(mlx5_reply, extra=[stale])
    host, warnings = dcb_host(sock)
    assert isinstance(host.dcb("enp3s0f0"), Dcb) and warnings == []


def test_no_dcb_on_a_netdev_without_it():
    host, warnings = dcb_host(FakeRouteSocket(lambda seq: error_reply(seq, errno.EOPNOTSUPP)))
    assert host.dcb("veth0") is None and warnings == []


def test_dcb_failures_are_warnings():
    host, warnings = dcb_host(FakeRouteSocket(lambda seq: error_reply(seq, errno.ENODEV)))
    assert host.dcb("eth9") is None and warnings == ["DCB of eth9: no such netdev"]

    def truncated(seq):
        reply = mlx5_reply(seq)
        return reply[:16] + reply[16:60] + struct.pack("=HH", 200, 13)

    def fixed_length(seq):
        reply = truncated(seq)
        return struct.pack("=I", len(reply)) + reply[4:]

    host, warnings = dcb_host(FakeRouteSocket(fixed_length))
    assert host.dcb("enp3s0f0") is None and "malformed reply" in warnings[0]
    sock = FakeRouteSocket(lambda seq: b"")
    sock.recvmsg = lambda size: (_ for _ in ()).throw(socket.timeout())
    host, warnings = dcb_host(sock)
    assert host.dcb("enp3s0f0") is None and "did not answer" in warnings[0]

    def refused():
        raise PermissionError(errno.EACCES, "Permission denied")

    warnings = []
    host = Host("/nonexistent", warnings.append, live=False, rtnetlink=refused)
    assert host.dcb("enp3s0f0") is None and "cannot open" in warnings[0]


def test_dcb_without_pfc_support():
    def reply(seq):
        body = struct.pack("=BBH", 0, 21, 0) + nla(1, b"eth0\0") + nla(13, nla(3, b""))
        return struct.pack("=IHHII", 16 + len(body), 78, 0, seq, 0) + body

    host, _ = dcb_host(FakeRouteSocket(reply))
    dcb = host.dcb("eth0")
    assert dcb == Dcb("eth0", frozenset(), (), None, None, ())


# -- the route ---------------------------------------------------------------------------------


class FakeMsg(dict):
    def __init__(self, fields, attrs):
        super().__init__(fields)
        self.attrs = attrs

    def get_attr(self, name):
        return self.attrs.get(name)


class FakeIPRoute:
    def __init__(self, routes=None, error=None):
        self.routes, self.error, self.closed, self.asked = routes or [], error, False, []

    def route(self, command, **kwargs):
        self.asked.append((command, kwargs))
        if self.error is not None:
            raise self.error
        return self.routes

    def link(self, command, index):
        return [FakeMsg({}, {"IFLA_IFNAME": {4: "enp3s0f0"}.get(index)})]

    def close(self):
        self.closed = True


def route_host(ipr) -> tuple[Host, list[str]]:
    warnings: list[str] = []
    return Host("/nonexistent", warnings.append, live=False, iproute=lambda: ipr), warnings


def test_route_get():
    msg = FakeMsg(
        {"type": 1},
        {"RTA_OIF": 4, "RTA_PREFSRC": "192.168.10.1", "RTA_GATEWAY": None},
    )
    ipr = FakeIPRoute([msg])
    host, warnings = route_host(ipr)
    assert host.route("192.168.10.2") == Route(
        "192.168.10.2", "enp3s0f0", "192.168.10.1", None, "unicast"
    )
    assert ipr.asked == [("get", {"dst": "192.168.10.2", "family": socket.AF_INET})]
    assert ipr.closed and warnings == []


def test_route_to_nowhere_is_unreachable():
    from pyroute2.netlink.exceptions import NetlinkError

    host, warnings = route_host(FakeIPRoute(error=NetlinkError(errno.ENETUNREACH)))
    route = host.route("2001:db8::1")
    assert (route.type, route.dev, route.error) == ("unreachable", None, "ENETUNREACH")
    assert warnings == []


def test_route_of_what_is_not_an_address():
    host, _ = route_host(FakeIPRoute())
    with pytest.raises(UsageError):
        host.route("node02")


# -- netfilter ---------------------------------------------------------------------------------
#
# `nft -j list ruleset` outputs written by hand after libnftables-json(5) (the shapes nft 1.0
# prints: metainfo, table, chain with hook/prio/policy, rule with expr and handle), and
# iptables-save outputs after iptables-save(8).


def nft_doc(*items) -> bytes:
    head = [
        {
            "metainfo": {
                "version": "1.0.6",
                "release_name": "Lester Gooch #5",
                "json_schema_version": 1,
            }
        },
        {"table": {"family": "inet", "name": "filter", "handle": 1}},
    ]
    return json.dumps({"nftables": head + list(items)}).encode()


def chain(name, hook=None, policy="accept", family="inet", table="filter"):
    c = {"family": family, "table": table, "name": name, "handle": 1}
    if hook:
        c.update(type="filter", hook=hook, prio=0, policy=policy)
    return {"chain": c}


def rule(chain_name, handle, *expr, family="inet", table="filter", comment=None):
    r = {
        "family": family,
        "table": table,
        "chain": chain_name,
        "handle": handle,
        "expr": list(expr),
    }
    if comment:
        r["comment"] = comment
    return {"rule": r}


def match(left, right, op="=="):
    return {"match": {"op": op, "left": left, "right": right}}


UDP_DPORT = {"payload": {"protocol": "udp", "field": "dport"}}
TCP_DPORT = {"payload": {"protocol": "tcp", "field": "dport"}}
SADDR = {"payload": {"protocol": "ip", "field": "saddr"}}
L4PROTO = {"meta": {"key": "l4proto"}}
CT_STATE = {"ct": {"key": "state"}}
DROP, ACCEPT = {"drop": None}, {"accept": None}
REJECT = {"reject": {"type": "icmpx", "expr": "port-unreachable"}}


def runner(outputs: dict):
    """A command runner from {tool: stdout}; tools not in it are not installed."""

    def run(argv):
        out = outputs.get(argv[0])
        if out is None:
            return None
        if isinstance(out, tuple):
            return out
        return 0, out, b""

    return run


def filters(outputs: dict, port: int = 4791):
    warnings: list[str] = []
    host = Host("/nonexistent", warnings.append, live=False, run=runner(outputs))
    return host.udp_filters(port), warnings


def test_nft_rule_on_the_port_with_a_source_is_reported_with_its_text():
    doc = nft_doc(
        chain("input", "input"),
        rule("input", 4, match(CT_STATE, ["established", "related"]), ACCEPT),
        rule("input", 5, match(CT_STATE, "invalid"), DROP),
        rule("input", 6, match(TCP_DPORT, 22), DROP),
        rule(
            "input",
            7,
            match(SADDR, {"prefix": {"addr": "10.0.0.0", "len": 8}}),
            match(UDP_DPORT, 4791),
            {"counter": {"packets": 0, "bytes": 0}},
            DROP,
            comment="no RoCE from the lab",
        ),
        rule("input", 8, match(UDP_DPORT, 4791, "!="), DROP),
    )
    found, warnings = filters({"nft": doc})
    assert warnings == []
    assert [(f.tool, f.table, f.chain, f.handle, f.verdict) for f in found] == [
        ("nft", "inet filter", "input", 7, "drop")
    ]
    assert found[0].text == (
        'ip saddr 10.0.0.0/8 udp dport 4791 counter drop comment "no RoCE from the lab"'
    )


@pytest.mark.parametrize(
    "right",
    [
        {"set": [4789, 4791]},
        {"range": [4000, 5000]},
        {"set": [{"range": [4790, 4792]}, 53]},
        "@roce_ports",
    ],
)
def test_nft_sets_and_ranges_holding_the_port(right):
    named = {
        "set": {
            "family": "inet",
            "table": "filter",
            "name": "roce_ports",
            "type": "inet_service",
            "handle": 3,
            "elem": [4791, 4792],
        }
    }
    doc = nft_doc(named, chain("input", "input"), rule("input", 9, match(UDP_DPORT, right), REJECT))
    found, _ = filters({"nft": doc})
    assert [(f.handle, f.verdict) for f in found] == [(9, "reject")]
    doc = nft_doc(named, chain("input", "input"), rule("input", 9, match(UDP_DPORT, 22), REJECT))
    assert filters({"nft": doc})[0] == ()


def test_nft_rules_matching_all_udp_or_everything():
    doc = nft_doc(
        chain("input", "input"),
        chain("lab"),
        rule(
            "input", 3, match({"meta": {"key": "iifname"}}, "enp3s0f0"), {"jump": {"target": "lab"}}
        ),
        rule("lab", 10, match(L4PROTO, "udp"), DROP),
        rule("lab", 11, match(L4PROTO, {"set": ["tcp", "sctp"]}), DROP),
        rule("lab", 12, DROP),
        chain("output", "output"),
        rule("output", 20, DROP),
    )
    found, _ = filters({"nft": doc})
    assert [(f.chain, f.handle, f.text) for f in found] == [
        ("lab", 10, "meta l4proto udp drop"),
        ("lab", 12, "drop"),
    ]


def test_nft_drop_policy_unless_the_port_is_accepted():
    accepted = nft_doc(
        chain("input", "input", policy="drop"),
        rule("input", 4, match(UDP_DPORT, 4791), ACCEPT),
        rule("input", 5, DROP),  # shadowed for UDP 4791
    )
    assert filters({"nft": accepted})[0] == ()
    closed = nft_doc(
        chain("input", "input", policy="drop"),
        rule("input", 4, match(TCP_DPORT, 22), ACCEPT),
    )
    found, _ = filters({"nft": closed})
    assert len(found) == 1 and found[0].handle is None and found[0].verdict == "drop"
    assert "policy drop" in found[0].text


def test_nft_prerouting_and_netdev_ingress_count():
    doc = nft_doc(
        {"table": {"family": "netdev", "name": "edge", "handle": 2}},
        chain("ingress", "ingress", family="netdev", table="edge"),
        rule("ingress", 2, match(UDP_DPORT, 4791), DROP, family="netdev", table="edge"),
        chain("pre", "prerouting"),
        rule("pre", 3, match(UDP_DPORT, 4791), DROP),
    )
    found, _ = filters({"nft": doc})
    assert {(f.table, f.chain) for f in found} == {
        ("netdev edge", "ingress"),
        ("inet filter", "pre"),
    }


IPTABLES_SAVE = """\
# Generated by iptables-save v1.8.7 on Thu Nov 26 10:02:11 2026
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:LAB - [0:0]
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -s 10.0.0.0/8 -p udp -m udp --dport 4791 -m comment --comment "lab hosts" -j DROP
-A INPUT -p udp -m multiport --dports 4000:5000,53 -j REJECT --reject-with icmp-port-unreachable
-A INPUT -p udp -m udp ! --dport 4791 -j DROP
-A INPUT -i enp3s0f0 -j LAB
-A LAB -p udp -j DROP
-A LAB -p udp -m udp --dport 4791 -j ACCEPT
COMMIT
# Completed on Thu Nov 26 10:02:11 2026
"""


def test_iptables_save():
    found, warnings = filters({"iptables-save": IPTABLES_SAVE.encode()})
    assert warnings == []
    assert [(f.tool, f.table, f.chain, f.line, f.verdict) for f in found] == [
        ("iptables", "filter", "INPUT", 10, "drop"),
        ("iptables", "filter", "INPUT", 11, "reject"),
        ("iptables", "filter", "INPUT", None, "drop"),  # the policy: nothing accepts 4791
        ("iptables", "filter", "LAB", 14, "drop"),
    ]
    assert found[0].text.startswith("-A INPUT -s 10.0.0.0/8 -p udp")


def test_iptables_accepting_the_port_before_the_policy():
    text = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p udp --dport 4791 -j ACCEPT\nCOMMIT\n"
    assert filters({"ip6tables-save": text.encode()})[0] == ()


def test_missing_tools_are_no_rule_and_failing_ones_a_warning():
    assert filters({}) == ((), [])
    found, warnings = filters(
        {"nft": (1, b"", b"Operation not permitted (you must be root)\n"), "iptables-save": b""}
    )
    assert found == () and len(warnings) == 1 and "Operation not permitted" in warnings[0]
    found, warnings = filters({"nft": b"{not json"})
    assert found == () and "libnftables-json" in warnings[0]


def test_run_command_is_bounded(monkeypatch):
    assert firewall.run_command(["ibtool-no-such-tool"]) is None
    status, out, _ = firewall.run_command(["sh", "-c", "echo ok"])
    assert (status, out) == (0, b"ok\n")
    monkeypatch.setattr(firewall, "TIMEOUT", 0.3)
    status, _, err = firewall.run_command(["sh", "-c", "sleep 5"])
    assert status == -1 and b"within" in err
    monkeypatch.setattr(firewall, "TIMEOUT", 5.0)
    monkeypatch.setattr(firewall, "OUTPUT_LIMIT", 1 << 16)
    status, _, err = firewall.run_command(["sh", "-c", "yes"])
    assert status == -1 and b"more than" in err


def test_rtnetlink_module_constants_follow_the_uapi():
    assert (rtnetlink.RTM_GETDCB, rtnetlink.DCB_CMD_IEEE_GET, rtnetlink.DCB_ATTR_IEEE) == (
        78,
        21,
        13,
    )


def test_a_tree_without_proc_sys_warns_once(tree):
    host, warnings = host_of(tree("cxgb4_iwarp"))
    conf = host.ipv4_conf("enp2s0f4")
    assert conf.rp_filter is None and conf.all_rp_filter is None
    assert warnings == ["/proc/sys/net/ipv4/conf: missing"]
    assert host.memlock() == MemLock(None, None, known=False)
    assert host.verbs_providers() == ()
    assert host.roce_defaults("cxgb4_0", 1) == RoceDefaults(None, None, False, None, False)


def test_the_running_kernel_answers_for_the_loopback():
    """lo has no dcbnl_ops (EOPNOTSUPP: no DCB, no warning) and a local route to 127.0.0.1;
    where the sandbox forbids NETLINK_ROUTE, both are None after a warning."""
    warnings: list[str] = []
    host = Host(warn=warnings.append)
    assert host.dcb("lo") is None
    route = host.route("127.0.0.1")
    if route is not None:
        assert (route.dev, route.type) == ("lo", "local")
    assert len(warnings) <= 2


# -- RTM_GETROUTE and RTM_GETADDR on a plain socket (no pyroute2) ---------------------------


class _OneAnswer:
    """A NETLINK_ROUTE socket stand-in answering the request sent to it with `reply(seq)`."""

    def __init__(self, reply):
        self.reply, self.sent, self.closed = reply, [], False

    def settimeout(self, t):
        pass

    def send(self, data):
        self.sent.append(data)
        return len(data)

    def recvmsg(self, size):
        seq = struct.unpack_from("=IHHII", self.sent[-1])[3]
        return self.reply(seq), None, 0, None

    def close(self):
        self.closed = True


def _nlmsg(kind: int, seq: int, payload: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(payload), kind, 0, seq, 0) + payload


def test_a_route_the_kernel_refuses_is_unreachable_without_pyroute2():
    from ibtool.sources import rtnetlink

    error = lambda seq: _nlmsg(2, seq, struct.pack("=i", -errno.ENETUNREACH) + bytes(16))  # noqa: E731
    sock = _OneAnswer(error)
    route = rtnetlink.read_route("10.99.0.1", print, lambda: rtnetlink.RouteSocket(lambda: sock))
    assert (route.type, route.error, route.dev) == ("unreachable", "ENETUNREACH", None)
    assert sock.closed
    kind, flags = struct.unpack_from("=HH", sock.sent[0], 4)
    assert (kind, flags) == (rtnetlink.RTM_GETROUTE, rtnetlink.NLM_F_REQUEST)


def test_ipv4_addresses_of_the_running_kernel_include_the_loopback():
    from ibtool.sources import rtnetlink

    assert ("lo", "127.0.0.1", 8) in rtnetlink.ipv4_addresses()


def test_a_malformed_address_dump_is_an_oserror():
    from ibtool.sources import rtnetlink

    sock = _OneAnswer(lambda seq: struct.pack("=IHHII", 400, 20, 2, seq, 0))
    with pytest.raises(OSError, match="malformed"):
        rtnetlink.ipv4_addresses(lambda: sock)
    assert sock.closed


def test_route_get_from_a_source():
    msg = FakeMsg({"type": 1}, {"RTA_OIF": 4})  # asked from a source: no RTA_PREFSRC
    ipr = FakeIPRoute([msg])
    host, _ = route_host(ipr)
    route = host.route("192.168.10.2", "192.168.10.1")
    assert (route.dev, route.src) == ("enp3s0f0", "192.168.10.1")
    assert ipr.asked == [
        ("get", {"dst": "192.168.10.2", "family": socket.AF_INET, "src": "192.168.10.1"})
    ]
    with pytest.raises(UsageError, match="not one address family"):
        host.route("192.168.10.2", "fd77::1")


def test_a_route_from_a_source_is_asked_as_ip_route_get_from_asks_it():
    from ibtool.sources import rtnetlink

    error = lambda seq: _nlmsg(2, seq, struct.pack("=i", -errno.ENETUNREACH) + bytes(16))  # noqa: E731
    sock = _OneAnswer(error)
    rtnetlink.read_route(
        "10.99.0.2", print, lambda: rtnetlink.RouteSocket(lambda: sock), "10.99.0.1"
    )
    body = sock.sent[0][16:]
    family, dst_len, src_len = struct.unpack_from("=BBB", body)
    assert (family, dst_len, src_len) == (socket.AF_INET, 32, 32)
    attrs = body[rtnetlink.RTMSG.size :]
    assert attrs == struct.pack("=HH", 8, rtnetlink.RTA_DST) + bytes([10, 99, 0, 2]) + struct.pack(
        "=HH", 8, rtnetlink.RTA_SRC
    ) + bytes([10, 99, 0, 1])


def test_doctor_looks_the_route_up_from_the_gid_s_address(tmp_path, monkeypatch):
    from ibtool.doctor import run
    from tests.fixtures import sysfs_trees

    root = sysfs_trees.build("mlx5_roce", tmp_path)
    asked = []
    monkeypatch.setattr(run, "route_for", lambda host, dst, src=None: asked.append((dst, src)))
    opts = run.Options(peer="192.168.10.2", compat="rping", probe=False)
    run.diagnose(Host(str(root), lambda m: None), None, opts, lambda m: None)
    assert asked == [("192.168.10.2", "192.168.10.1")]  # GID 3's address, not the default's

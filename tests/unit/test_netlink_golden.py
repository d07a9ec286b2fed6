"""Golden decodes of replies captured from a real kernel (tests/fixtures/captured/netlink:
Debian 12's 6.1 kernel, rxe0 on veth0 and rxe1 on veth1), cross-checked against the sysfs tree
captured in the same session (tests/fixtures/captured/rxe-pair)."""

from __future__ import annotations

import struct

import pytest

from ibtool.model.records import CounterSample, NetnsMode, NodeType, PhysState, PortState, Protocol
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import messages, records
from ibtool.sources.netlink.client import NldevClient
from ibtool.sources.sysfs.infiniband import SysfsSource
from tests.fixtures.netlink import (
    NETLINK,
    FakeKernel,
    captured,
    replay,
)
from tests.fixtures.sysfs_trees import CAPTURED

RXE_PAIR = CAPTURED / "rxe-pair"
GUIDS = {"rxe0": "0024:13ff:fec5:518f", "rxe1": "f06b:52ff:fe7a:4f2d"}
RXE_COUNTERS = {
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
}


def decoded(name: str) -> tuple[list[int], list[dict]]:
    """The message types of a capture and the attributes of its NLDEV messages."""
    msgs = messages.parse(captured(name))
    types = [m["header"]["type"] for m in msgs]
    return types, [messages.attributes(m) for m in msgs if A.command_of(m["header"]["type"])]


def test_get_dump_two_soft_roce_devices():
    types, replies = decoded("get_dump.bin")
    assert types == [5121, 5121, A.NLMSG_DONE]
    devices = [records.device(r) for r in replies]
    assert [(d.name, d.node_guid, d.sys_image_guid) for d in devices] == [
        ("rxe0", GUIDS["rxe0"], GUIDS["rxe0"]),
        ("rxe1", GUIDS["rxe1"], GUIDS["rxe1"]),
    ]
    for d in devices:
        assert (d.node_type, d.protocol, d.port_count, d.fw_ver) == (
            NodeType.CA,
            Protocol.ROCE,
            1,
            None,  # rxe reports no firmware: the kernel leaves FW_VERSION out
        )
    assert [r["RDMA_NLDEV_ATTR_DEV_INDEX"] for r in replies] == [0, 1]
    assert replies[0]["RDMA_NLDEV_ATTR_CAP_FLAGS"] == 0x1223C76
    assert replies[0]["RDMA_NLDEV_ATTR_DEV_DIM"] == 0


@pytest.mark.parametrize("device", ["rxe0", "rxe1"])
def test_get_doit_is_what_the_dump_says(device):
    types, (one,) = decoded(f"get_{device}.bin")
    _, dump = decoded("get_dump.bin")
    assert types == [5121]
    assert one == next(r for r in dump if r["RDMA_NLDEV_ATTR_DEV_NAME"] == device)


@pytest.mark.parametrize("device", ["rxe0", "rxe1"])
def test_netlink_devices_agree_with_sysfs_captured_in_the_same_session(device):
    _, (reply,) = decoded(f"get_{device}.bin")
    ours = records.device(reply)
    sysfs = SysfsSource(str(RXE_PAIR)).device(device, with_ports=False)
    for field in ("name", "node_type", "node_guid", "sys_image_guid", "port_count"):
        assert getattr(ours, field) == getattr(sysfs, field), field


@pytest.mark.parametrize(
    ("device", "netdev", "ifindex"), [("rxe0", "veth0", 3), ("rxe1", "veth1", 2)]
)
def test_port_get_dump_and_doit(device, netdev, ifindex):
    dump_types, (from_dump,) = decoded(f"port_get_dump_{device}.bin")
    doit_types, (from_doit,) = decoded(f"port_get_{device}_1.bin")
    assert dump_types == [5125, A.NLMSG_DONE]
    assert doit_types == [5121]  # the doit reply is typed GET
    assert from_dump == from_doit
    assert from_doit["RDMA_NLDEV_ATTR_NDEV_INDEX"] == ifindex
    port = records.port(from_doit)
    assert (port.device, port.port, port.state, port.physical_state, port.netdev) == (
        device,
        1,
        PortState.ACTIVE,
        PhysState.LINK_UP,
        netdev,
    )
    # RoCE: the kernel sends no LID, SM LID, LMC nor capability mask.
    assert (port.lid, port.sm_lid, port.lmc, port.cap_mask) == (None, None, None, None)
    sysfs = SysfsSource(str(RXE_PAIR)).port(device, 1)
    assert (port.state, port.physical_state, port.netdev) == (
        sysfs.state,
        sysfs.physical_state,
        sysfs.netdev,
    )


def test_res_get_dump_nests_without_nla_f_nested():
    raw = captured("res_get_dump.bin")
    assert struct.unpack_from("=HH", raw, 0x24) == (0xB0, 15)  # RES_SUMMARY, no flag
    types, replies = decoded("res_get_dump.bin")
    assert types == [5129, 5129, A.NLMSG_DONE]
    summaries = {r["RDMA_NLDEV_ATTR_DEV_NAME"]: records.resource_summary(r) for r in replies}
    # Each rxe device holds the GSI QP ib_core creates, with its PD and CQ.
    expected = {"pd": 1, "cq": 1, "qp": 1, "cm_id": 0, "mr": 0, "ctx": 0, "srq": 0}
    assert summaries == {"rxe0": expected, "rxe1": expected}


@pytest.mark.parametrize("device", ["rxe0", "rxe1"])
def test_res_qp_dump_shows_the_gsi_qp(device):
    types, (qps,) = decoded(f"res_qp_get_dump_{device}.bin")
    assert types == [5130, A.NLMSG_DONE]
    assert qps["RDMA_NLDEV_ATTR_RES_QP"] == [
        {
            "RDMA_NLDEV_ATTR_PORT_INDEX": 1,
            "RDMA_NLDEV_ATTR_RES_LQPN": 1,
            "RDMA_NLDEV_ATTR_RES_KERN_NAME": "ib_core",
            "RDMA_NLDEV_ATTR_RES_SQ_PSN": 0,
            "RDMA_NLDEV_ATTR_RES_TYPE": 1,  # GSI
            "RDMA_NLDEV_ATTR_RES_STATE": 3,  # RTS
        }
    ]


@pytest.mark.parametrize("device", ["rxe0", "rxe1"])
def test_stat_get_nests_with_nla_f_nested(device):
    raw = captured(f"stat_get_{device}_1.bin")
    assert struct.unpack_from("=H", raw, 0x2E)[0] == A.NLA_F_NESTED | 80  # STAT_HWCOUNTERS
    types, (stat,) = decoded(f"stat_get_{device}_1.bin")
    assert types == [5137]
    samples = records.hw_counters(stat)
    assert {s.name for s in samples} == RXE_COUNTERS
    assert samples[0] == CounterSample(device, 1, "sent_pkts", 0, source="hw", via="netlink")
    sysfs = SysfsSource(str(RXE_PAIR)).counters(device, 1)
    assert {s.name for s in sysfs} == RXE_COUNTERS


def test_sys_get_on_debian_12s_kernel():
    types, (reply,) = decoded("sys_get.bin")
    assert types == [5126]
    assert reply == {
        "RDMA_NLDEV_SYS_ATTR_NETNS_MODE": 1,
        "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE": 0,
        "RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK": 1,
    }
    system = records.rdma_system(reply)
    assert (system.netns_mode, system.privileged_qkey, system.monitor, system.copy_on_fork) == (
        NetnsMode.SHARED,
        False,
        None,  # 6.1 has no monitor events
        True,
    )


def test_the_client_reads_the_captured_replies():
    with NldevClient(sock=FakeKernel(replay("get_dump.bin"))) as nl:
        assert [d["RDMA_NLDEV_ATTR_DEV_NAME"] for d in nl.devices()] == ["rxe0", "rxe1"]
    with NldevClient(sock=FakeKernel(replay("port_get_rxe1_1.bin"))) as nl:
        assert records.port(nl.port(1, 1)).netdev == "veth1"
    with NldevClient(sock=FakeKernel(replay("sys_get.bin"))) as nl:
        assert records.rdma_system(nl.system()).netns_mode == NetnsMode.SHARED


@pytest.mark.parametrize("name", sorted(p.name for p in NETLINK.glob("*.bin")))
def test_every_capture_decodes(name):
    types, replies = decoded(name)
    assert replies
    assert all(A.command_of(t) is not None or t == A.NLMSG_DONE for t in types)

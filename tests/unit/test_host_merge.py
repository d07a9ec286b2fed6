"""`-d`: devices and ports merged from netlink (where it answers) and sysfs, each field with its
source — on the sysfs tree and the netlink replies captured from the same testbed kernel."""

from __future__ import annotations

import errno
import struct

import pytest

from ibtool.host import Host
from ibtool.model.records import PortState
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import client, messages
from ibtool.sources.sysfs.infiniband import SysfsSource
from tests.fixtures import sysfs_trees
from tests.fixtures.netlink import FakeKernel, client_on, replay


def captured_kernel(request: bytes, seq: int) -> list[bytes]:
    (msg,) = messages.parse(request)
    command = A.command_of(msg["header"]["type"])
    index = messages.attributes(msg).get("RDMA_NLDEV_ATTR_DEV_INDEX")
    if command == A.RDMA_NLDEV_CMD_GET:
        return replay("get_dump.bin")(request, seq)
    if command == A.RDMA_NLDEV_CMD_PORT_GET:
        return replay(f"port_get_dump_rxe{index}.bin")(request, seq)
    raise AssertionError(f"unexpected request {command}")


class Kernel:
    """The kernel behind the host's NETLINK_RDMA sockets: each a FakeKernel answering as
    `answer` does (the captured kernel unless a test says otherwise), kept in `sockets`;
    with `refusal`, opening one raises it instead."""

    def __init__(self):
        self.answer = captured_kernel
        self.refusal: Exception | None = None
        self.sockets: list[FakeKernel] = []

    def socket(self) -> FakeKernel:
        if self.refusal is not None:
            raise self.refusal
        self.sockets.append(FakeKernel(self.answer))
        return self.sockets[-1]


@pytest.fixture
def kernel() -> Kernel:
    return Kernel()


@pytest.fixture
def host(kernel):
    warnings: list[str] = []
    sysfs = SysfsSource(str(sysfs_trees.CAPTURED_RXE), warnings.append)
    # no verbs on this host: MTUs stay unknown, quietly
    h = Host(
        warn=warnings.append,
        details=True,
        sysfs=sysfs,
        netlink=client_on(kernel.socket),
        verbs=lambda: None,
    )
    h.sockets, h.warnings = kernel.sockets, warnings
    return h


def test_device_fields_netlink_answers_come_from_netlink(host):
    (rxe0,) = host.devices("rxe0")
    # rxe has no firmware version (an empty fw_ver file, no FW_VERSION attribute), no HCA
    # type, board id or driver link: fields no source answers have no source
    assert rxe0.sources == {
        "node_type": "netlink",
        "protocol": "netlink",
        "node_guid": "netlink",
        "sys_image_guid": "netlink",
        "port_count": "netlink",
        "node_desc": "sysfs",
        "parent": "sysfs",
        "netdevs": "sysfs",
    }
    # the two sources agree on the captured kernel: merging changed no value
    plain = Host(str(sysfs_trees.CAPTURED_RXE), details=True).devices("rxe0")[0]
    assert rxe0 == plain
    # one socket for the run, closed with the host
    assert len(host.sockets) == 1 and host.sockets[0].client_end.fileno() != -1
    host.close()
    assert host.sockets[0].client_end.fileno() == -1


def test_port_state_lid_and_netdev_from_netlink_rate_from_sysfs(host):
    (port,) = host.ports("rxe0/1")
    assert port.state == PortState.ACTIVE and port.netdev == "veth0"
    assert port.sources["state"] == "netlink"
    assert port.sources["physical_state"] == "netlink"
    assert port.sources["netdev"] == "netlink"
    assert port.sources["rate"] == "sysfs"
    assert port.sources["link_layer"] == "sysfs"
    assert "active_mtu" not in port.sources  # no verbs here


def test_netlink_wins_where_the_sources_disagree(host, kernel):
    # a port that went down between the sysfs read and the netlink reply: the kernel's answer
    def down(request, seq):
        out = captured_kernel(request, seq)
        if A.command_of(struct.unpack_from("=H", request, 4)[0]) == A.RDMA_NLDEV_CMD_PORT_GET:
            data = bytearray(out[0])
            offset = 16
            while offset < len(data):
                length, kind = struct.unpack_from("=HH", data, offset)
                if kind == 12:  # RDMA_NLDEV_ATTR_PORT_STATE
                    data[offset + 4] = 1  # DOWN
                offset += (length + 3) & ~3
            out[0] = bytes(data)
        return out

    kernel.answer = down
    (port,) = host.ports("rxe0/1")
    assert port.state == PortState.DOWN and port.sources["state"] == "netlink"


def test_without_rdma_netlink_every_field_is_sysfs_and_a_note_says_why(host, kernel):
    kernel.refusal = client.socket_error(OSError(errno.EPROTONOSUPPORT, "Protocol not supported"))
    (port,) = host.ports("rxe0/1")
    assert set(port.sources.values()) == {"sysfs"}
    assert host.warnings == ["sysfs only: RDMA netlink: no RDMA netlink in this kernel"]


def test_without_details_netlink_is_not_asked(host):
    host.details = False
    (device,) = host.devices("rxe0")
    assert device.sources is None and host.sockets == []

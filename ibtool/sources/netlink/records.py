"""Decoded NLDEV replies ({uapi name: value}) as ibtool's model records.

A reply without an attribute the kernel always sends (a device without DEV_NAME) is a DataError
naming it; attributes that depend on the kernel version or the port type become None.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

from ibtool.model.records import (
    CmIdResource,
    CmState,
    CounterSample,
    CqResource,
    CtxResource,
    Device,
    HwCounterStatus,
    MrResource,
    NetnsMode,
    NodeType,
    Owner,
    PathMigState,
    PdResource,
    PhysState,
    PollContext,
    Port,
    PortSpace,
    PortState,
    Protocol,
    QpResource,
    QpState,
    QpType,
    RdmaSystem,
    SrqResource,
    SrqType,
)
from ibtool.sources.netlink.errors import malformed

Reply = Mapping[str, Any]


def guid(value: int | None) -> str | None:
    """A host-order u64 GUID as sysfs and rdma(8) print it: four groups of four hex digits."""
    if value is None:
        return None
    text = f"{value:016x}"
    return ":".join(text[i : i + 4] for i in range(0, 16, 4))


def _required(reply: Reply, name: str, what: str) -> Any:
    if name not in reply:
        raise malformed(f"{what} without {name}")
    return reply[name]


def _flag(value: int | None) -> bool | None:
    return None if value is None else bool(value)


def device(reply: Reply) -> Device:
    """A GET reply. Its PORT_INDEX is the number of ports (rdma_end_port), not a port."""
    protocol = reply.get("RDMA_NLDEV_ATTR_DEV_PROTOCOL")
    node_type = reply.get("RDMA_NLDEV_ATTR_DEV_NODE_TYPE")
    return Device(
        name=_required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a device"),
        node_type=NodeType.parse(node_type) if node_type is not None else None,
        protocol=next((p for p in Protocol if p.value == protocol), None),
        fw_ver=reply.get("RDMA_NLDEV_ATTR_FW_VERSION"),
        node_guid=guid(reply.get("RDMA_NLDEV_ATTR_NODE_GUID")),
        sys_image_guid=guid(reply.get("RDMA_NLDEV_ATTR_SYS_IMAGE_GUID")),
        port_count=reply.get("RDMA_NLDEV_ATTR_PORT_INDEX", 0),
    )


def port(reply: Reply) -> Port:
    """A PORT_GET reply. LID, SM LID, LMC and capabilities come only for InfiniBand ports."""
    state = reply.get("RDMA_NLDEV_ATTR_PORT_STATE")
    phys = reply.get("RDMA_NLDEV_ATTR_PORT_PHYS_STATE")
    caps = reply.get("RDMA_NLDEV_ATTR_CAP_FLAGS")
    return Port(
        device=_required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a port"),
        port=_required(reply, "RDMA_NLDEV_ATTR_PORT_INDEX", "a port"),
        state=PortState.parse(state) if state is not None else None,
        physical_state=PhysState.parse(phys) if phys is not None else None,
        lid=reply.get("RDMA_NLDEV_ATTR_LID"),
        sm_lid=reply.get("RDMA_NLDEV_ATTR_SM_LID"),
        lmc=reply.get("RDMA_NLDEV_ATTR_LMC"),
        # Low 32 bits: PortInfo CapabilityMask, what sysfs cap_mask holds; high: CapabilityMask2.
        cap_mask=caps & 0xFFFFFFFF if caps is not None else None,
        netdev=reply.get("RDMA_NLDEV_ATTR_NDEV_NAME"),
        netdev_index=reply.get("RDMA_NLDEV_ATTR_NDEV_INDEX"),
    )


def rdma_system(reply: Reply) -> RdmaSystem:
    """A SYS_GET reply: each setting the kernel reports; a kernel reports those it has."""
    mode = reply.get("RDMA_NLDEV_SYS_ATTR_NETNS_MODE")
    return RdmaSystem(
        netns_mode=NetnsMode.parse(mode) if mode is not None else None,
        privileged_qkey=_flag(reply.get("RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE")),
        monitor=_flag(reply.get("RDMA_NLDEV_SYS_ATTR_MONITOR_MODE")),
        copy_on_fork=_flag(reply.get("RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK")),
    )


def hw_counters(reply: Reply) -> list[CounterSample]:
    """A STAT_GET reply for a port: its default (driver) counters, optional ones included."""
    device = _required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a counter reply")
    port = _required(reply, "RDMA_NLDEV_ATTR_PORT_INDEX", "a counter reply")
    samples = []
    for entry in reply.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTERS", []):
        if not isinstance(entry, Mapping):
            continue  # a bare STAT_HWCOUNTER_INDEX: only requests carry those
        name = _required(entry, "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME", "a counter")
        value = entry.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE")
        samples.append(CounterSample(device, port, name, value, source="hw", via="netlink"))
    return samples


def hw_counter_status(reply: Reply) -> list[HwCounterStatus]:
    """A STAT_GET_STATUS reply: each driver counter of the port, optional ones marked."""
    device = _required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a counter status reply")
    port = _required(reply, "RDMA_NLDEV_ATTR_PORT_INDEX", "a counter status reply")
    counters = []
    for entry in reply.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTERS", []):
        if not isinstance(entry, Mapping):
            continue
        name = _required(entry, "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME", "a counter")
        index = _required(entry, "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_INDEX", f"counter {name}")
        dynamic = entry.get("RDMA_NLDEV_ATTR_STAT_HWCOUNTER_DYNAMIC")
        counters.append(
            HwCounterStatus(device, port, name, index, dynamic is not None, dynamic != 0)
        )
    return counters


def resource_summary(reply: Reply) -> dict[str, int | None]:
    """A RES_GET reply: resource type ("pd", "cq", "qp", ...) -> how many exist now. A type
    the kernel does not count is not in it (srq before 5.13: nldev.c fill_res_info names the
    types it counts); a count it left out is None, never 0."""
    summary = {}
    for entry in reply.get("RDMA_NLDEV_ATTR_RES_SUMMARY", []):
        name = _required(entry, "RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_NAME", "a resource summary")
        summary[name] = entry.get("RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_CURR")
    return summary


# -- resource tracking: RES_{QP,CM_ID,CQ,MR,PD,CTX,SRQ}_GET dumps --------------------------------

_R = "RDMA_NLDEV_ATTR_RES_"


def _enum(kind, value: int | None):
    """The enum member for a kernel number, the bare number if the enum does not know it."""
    if value is None:
        return None
    member = kind.parse(value)
    return value if member is None else member


def _owner(entry: Reply) -> Owner:
    return Owner(pid=entry.get(_R + "PID"), kern_name=entry.get(_R + "KERN_NAME"))


def _common(entry: Reply, device: tuple[str, int]) -> dict[str, Any]:
    return {
        "device": device[0],
        "device_index": device[1],
        "owner": _owner(entry),
        "driver": dict(entry.get("RDMA_NLDEV_ATTR_DRIVER", {})),
    }


def qp(entry: Reply, device: tuple[str, int]) -> QpResource:
    what = "a QP"
    return QpResource(
        lqpn=_required(entry, _R + "LQPN", what),
        type=_enum(QpType, _required(entry, _R + "TYPE", what)),
        state=_enum(QpState, _required(entry, _R + "STATE", what)),
        sq_psn=_required(entry, _R + "SQ_PSN", what),
        port=entry.get("RDMA_NLDEV_ATTR_PORT_INDEX"),
        rqpn=entry.get(_R + "RQPN"),
        rq_psn=entry.get(_R + "RQ_PSN"),
        path_mig_state=_enum(PathMigState, entry.get(_R + "PATH_MIG_STATE")),
        pdn=entry.get(_R + "PDN"),
        **_common(entry, device),
    )


def sockaddr(raw: bytes | None) -> str | None:
    """A struct __kernel_sockaddr_storage as "ADDRESS:PORT" (rdma's spelling); None for a
    family other than IPv4 and IPv6 (AF_IB)."""
    if raw is None or len(raw) < 4:
        return None
    family = struct.unpack_from("=H", raw)[0]
    port = struct.unpack_from("!H", raw, 2)[0]
    if family == socket.AF_INET and len(raw) >= 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[4:8])}:{port}"
    if family == socket.AF_INET6 and len(raw) >= 24:
        return f"{socket.inet_ntop(socket.AF_INET6, raw[8:24])}:{port}"
    return None


def cm_id(entry: Reply, device: tuple[str, int]) -> CmIdResource:
    what = "a CM ID"
    return CmIdResource(
        state=_enum(CmState, _required(entry, _R + "STATE", what)),
        ps=_enum(PortSpace, _required(entry, _R + "PS", what)),
        port=entry.get("RDMA_NLDEV_ATTR_PORT_INDEX"),
        cm_idn=entry.get(_R + "CM_IDN"),
        lqpn=entry.get(_R + "LQPN"),
        qp_type=_enum(QpType, entry.get(_R + "TYPE")),
        src_addr=sockaddr(entry.get(_R + "SRC_ADDR")),
        dst_addr=sockaddr(entry.get(_R + "DST_ADDR")),
        **_common(entry, device),
    )


# Before the shared CQ pool (Linux 5.8) enum ib_poll_context began with IB_POLL_DIRECT.
_OLD_POLL_CONTEXT = {0: 3, 1: 0, 2: 1, 3: 2}


def cq(entry: Reply, device: tuple[str, int], *, old_poll_context: bool = False) -> CqResource:
    what = "a CQ"
    poll = entry.get(_R + "POLL_CTX")
    if poll is not None and old_poll_context:
        poll = _OLD_POLL_CONTEXT.get(poll, poll)
    dim = entry.get("RDMA_NLDEV_ATTR_DEV_DIM")
    return CqResource(
        cqe=_required(entry, _R + "CQE", what),
        users=_required(entry, _R + "USECNT", what),
        cqn=entry.get(_R + "CQN"),
        poll_ctx=_enum(PollContext, poll),
        adaptive_moderation=bool(dim) if dim in (0, 1) else None,
        ctxn=entry.get(_R + "CTXN"),
        **_common(entry, device),
    )


def mr(entry: Reply, device: tuple[str, int]) -> MrResource:
    return MrResource(
        mrlen=_required(entry, _R + "MRLEN", "an MR"),
        mrn=entry.get(_R + "MRN"),
        rkey=entry.get(_R + "RKEY"),
        lkey=entry.get(_R + "LKEY"),
        iova=entry.get(_R + "IOVA"),
        pdn=entry.get(_R + "PDN"),
        **_common(entry, device),
    )


def pd(entry: Reply, device: tuple[str, int]) -> PdResource:
    return PdResource(
        users=_required(entry, _R + "USECNT", "a PD"),
        pdn=entry.get(_R + "PDN"),
        local_dma_lkey=entry.get(_R + "LOCAL_DMA_LKEY"),
        unsafe_global_rkey=entry.get(_R + "UNSAFE_GLOBAL_RKEY"),
        ctxn=entry.get(_R + "CTXN"),
        **_common(entry, device),
    )


def ctx(entry: Reply, device: tuple[str, int]) -> CtxResource:
    return CtxResource(ctxn=_required(entry, _R + "CTXN", "a context"), **_common(entry, device))


def _qpn_ranges(table: list) -> tuple[tuple[int, int], ...]:
    ranges = []
    for element in table:
        if not isinstance(element, Mapping):
            continue
        if _R + "LQPN" in element:
            ranges.append((element[_R + "LQPN"], element[_R + "LQPN"]))
        elif "RDMA_NLDEV_ATTR_MIN_RANGE" in element and "RDMA_NLDEV_ATTR_MAX_RANGE" in element:
            ranges.append(
                (element["RDMA_NLDEV_ATTR_MIN_RANGE"], element["RDMA_NLDEV_ATTR_MAX_RANGE"])
            )
        else:
            raise malformed("a QP of an SRQ without LQPN or MIN_RANGE/MAX_RANGE")
    return tuple(ranges)


def srq(entry: Reply, device: tuple[str, int]) -> SrqResource:
    return SrqResource(
        srqn=_required(entry, _R + "SRQN", "an SRQ"),
        type=_enum(SrqType, entry.get(_R + "TYPE")),
        lqpns=_qpn_ranges(entry.get(_R + "QP", [])),
        pdn=entry.get(_R + "PDN"),
        cqn=entry.get(_R + "CQN"),
        **_common(entry, device),
    )


# object name (as `rdma res show` takes it) -> (dump table attribute, entry decoder)
RESOURCE_TABLES: dict[str, tuple[str, Callable[..., Any]]] = {
    "qp": (_R + "QP", qp),
    "cm_id": (_R + "CM_ID", cm_id),
    "cq": (_R + "CQ", cq),
    "mr": (_R + "MR", mr),
    "pd": (_R + "PD", pd),
    "ctx": (_R + "CTX", ctx),
    "srq": (_R + "SRQ", srq),
}


def resources(kind: str, replies: list[Reply], **options: Any) -> list[Any]:
    """Every object in the parts of one RES_*_GET dump (each part: the device's index and
    name, then as many entries as fit), in the kernel's order."""
    table, decode = RESOURCE_TABLES[kind]
    found = []
    for reply in replies:
        device = (
            _required(reply, "RDMA_NLDEV_ATTR_DEV_NAME", "a resource dump"),
            _required(reply, "RDMA_NLDEV_ATTR_DEV_INDEX", "a resource dump"),
        )
        for entry in reply.get(table, []):
            if isinstance(entry, Mapping):
                found.append(decode(entry, device, **options))
    return found

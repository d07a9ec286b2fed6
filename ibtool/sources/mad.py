"""MADs through rdma-core's own libraries: libibumad (the /dev/infiniband/umadN transport and
the local CAs), libibnetdisc (the subnet's discovery, as ibnetdiscover does it) and libibmad
(SMP and PMA queries, and the decoding of every field with its own field table), through ctypes.

The structures ctypes needs are declared here as rdma-core's public headers lay them out
(libibmad/mad.h ib_portid_t, libibnetdisc/ibnetdisc.h ibnd_node_t, ibnd_port_t, ibnd_fabric_t,
ibnd_config_t, libibumad/umad.h umad_ca_t, umad_port_t); the same in every release from v33,
and tests/unit/test_mad_abi.py compiles the headers where they are installed and compares. A
scan checks what it read against the field decoder (each node's GUID as its NodeInfo says it):
a library laid out otherwise is refused in one line, never read wrong.

Field numbers are libibmad's enum MAD_FIELDS, which rdma-core only appends to; the ones used
here are in every release from v33.

Bounded as libibnetdisc bounds itself: a window of outstanding SMPs (max_smps), a timeout and
retries per MAD; a port that is up but whose far end never answered is named, not waited for.
What the libraries print on their standard error during a call (ibwarn lines) is passed on
as warnings, not left on the terminal.
"""

from __future__ import annotations

import contextlib
import ctypes as C
import dataclasses
import os
import tempfile
import threading
from collections.abc import Callable, Iterator

from ibtool.errors import IbtoolError, NotFoundError, PermissionDeniedError, UnsupportedError
from ibtool.model.deferred import dataclass
from ibtool.model.fabric import (
    Bounds,
    Cable,
    Fabric,
    FabricNode,
    FabricPort,
    NodeType,
    PortSpeed,
)
from ibtool.model.records import PhysState, PortState

LIBRARIES = {"umad": "libibumad.so.3", "mad": "libibmad.so.5", "nd": "libibnetdisc.so.5"}
INSTALL = (
    "install rdma-core's MAD libraries (Debian/Ubuntu: apt install libibumad3 libibmad5 "
    "libibnetdisc5; RHEL/Fedora: dnf install rdma-core infiniband-diags)"
)
UMAD_DIR = "/dev/infiniband"
UMAD_SYSFS = "/sys/class/infiniband_mad"  # the umad devices the kernel has

# libibmad/mad.h
SMP_DATA_SIZE = 64  # IB_SMP_DATA_SIZE
MAD_SIZE = 256  # IB_MAD_SIZE
SUBNET_PATH_HOPS_MAX = 64  # IB_SUBNET_PATH_HOPS_MAX
QP1_QKEY = 0x80010000  # IB_DEFAULT_QP1_QKEY
SMI_CLASS, SMI_DIRECT_CLASS, SA_CLASS, PERFORMANCE_CLASS = 0x01, 0x81, 0x03, 0x04
ATTR_NODE_DESC, ATTR_NODE_INFO, ATTR_SWITCH_INFO, ATTR_PORT_INFO = 0x10, 0x11, 0x12, 0x15
ATTR_LINEAR_FORWARDING_TABLE, ATTR_SM_INFO = 0x19, 0x20
GSI_PORT_COUNTERS, GSI_PORT_COUNTERS_EXT, GSI_CLASS_PORT_INFO = 0x12, 0x1D, 0x01
# libibnetdisc/ibnetdisc.h
CHASSIS_TYPE_SIZE = 20
# libibumad/umad.h
UMAD_CA_NAME_LEN, UMAD_CA_MAX_PORTS, UMAD_MAX_DEVICES = 20, 10, 32

# enum MAD_FIELDS (libibmad/mad.h): the position of each field in libibmad's table
FIELDS = {
    "IB_PORT_LID_F": 29,
    "IB_PORT_SMLID_F": 30,
    "IB_PORT_CAPMASK_F": 31,
    "IB_PORT_LINK_WIDTH_ENABLED_F": 35,
    "IB_PORT_LINK_WIDTH_SUPPORTED_F": 36,
    "IB_PORT_LINK_WIDTH_ACTIVE_F": 37,
    "IB_PORT_LINK_SPEED_SUPPORTED_F": 38,
    "IB_PORT_STATE_F": 39,
    "IB_PORT_PHYS_STATE_F": 40,
    "IB_PORT_LMC_F": 43,
    "IB_PORT_LINK_SPEED_ACTIVE_F": 44,
    "IB_PORT_LINK_SPEED_ENABLED_F": 45,
    "IB_NODE_TYPE_F": 77,
    "IB_NODE_NPORTS_F": 78,
    "IB_NODE_SYSTEM_GUID_F": 79,
    "IB_NODE_GUID_F": 80,
    "IB_NODE_PORT_GUID_F": 81,
    "IB_NODE_DEVID_F": 83,
    "IB_NODE_LOCAL_PORT_F": 85,
    "IB_NODE_VENDORID_F": 86,
    "IB_SMINFO_GUID_F": 142,
    "IB_SMINFO_KEY_F": 143,
    "IB_SMINFO_ACT_F": 144,
    "IB_SMINFO_PRIO_F": 145,
    "IB_SMINFO_STATE_F": 146,
    "IB_PORT_CAPMASK2_F": 323,
    "IB_PORT_LINK_SPEED_EXT_ACTIVE_F": 324,
    "IB_PORT_LINK_SPEED_EXT_SUPPORTED_F": 325,
    "IB_PORT_LINK_SPEED_EXT_ENABLED_F": 326,
}
F = FIELDS
# PortCounters (attribute 0x12) and PortCountersExtended (0x1D), IBTA 16.1.3.5 and 16.1.4.11:
# each counter by its name (libibmad's mad_field_name), with its MAD_FIELDS number in
# PortCounters, its width there in bits (it saturates at all ones) and its number in
# PortCountersExtended (the 64-bit one, where the port has it; 0: none).
PORT_COUNTERS = {
    "SymbolErrorCounter": (123, 16, 644),
    "LinkErrorRecoveryCounter": (124, 8, 645),
    "LinkDownedCounter": (125, 8, 646),
    "PortRcvErrors": (126, 16, 647),
    "PortRcvRemotePhysicalErrors": (127, 16, 648),
    "PortRcvSwitchRelayErrors": (128, 16, 649),
    "PortXmitDiscards": (129, 16, 650),
    "PortXmitConstraintErrors": (130, 8, 651),
    "PortRcvConstraintErrors": (131, 8, 652),
    "LocalLinkIntegrityErrors": (133, 4, 653),
    "ExcessiveBufferOverrunErrors": (134, 4, 654),
    "VL15Dropped": (135, 16, 655),
    "PortXmitData": (136, 32, 196),
    "PortRcvData": (137, 32, 197),
    "PortXmitPkts": (138, 32, 198),
    "PortRcvPkts": (139, 32, 199),
    "PortXmitWait": (140, 32, 656),
}
DATA_COUNTERS = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
CPI_CAPMASK_F, CPI_CAPMASK2_F = 208, 209  # the PMA's ClassPortInfo
# PMA ClassPortInfo.CapabilityMask (IBTA 16.1.3.1, table 255 note) and CapabilityMask2
PMA_EXT_WIDTH, PMA_EXT_WIDTH_NOIETF, PMA_XMIT_WAIT = 0x200, 0x400, 0x1000
PMA_EXT_ERRORS = 0x2  # CapabilityMask2: IsAdditionalPortCountersExtendedSupported
PMA_ALL_PORT_SELECT = 0x100  # CapabilityMask: PortSelect 0xFF sums every port
ALL_PORTS = 0xFF
IS_EXTENDED_SPEEDS_SUPPORTED = 1 << 14  # PortInfo.CapabilityMask bit 14 (IBTA 14.2.5.6)


# -- the structures ------------------------------------------------------------------------


class DrPath(C.Structure):  # ib_dr_path_t
    _fields_ = [
        ("cnt", C.c_int),
        ("p", C.c_uint8 * SUBNET_PATH_HOPS_MAX),
        ("drslid", C.c_uint16),
        ("drdlid", C.c_uint16),
    ]


class PortId(C.Structure):  # ib_portid_t
    _fields_ = [
        ("lid", C.c_int),
        ("drpath", DrPath),
        ("grh_present", C.c_int),
        ("gid", C.c_uint8 * 16),
        ("qp", C.c_uint32),
        ("qkey", C.c_uint32),
        ("sl", C.c_uint8),
        ("pkey_idx", C.c_uint),
    ]


def _node_fields(node, port, desc: int) -> list:
    return [
        ("next", C.POINTER(node)),
        ("path_portid", PortId),
        ("smalid", C.c_uint16),
        ("smalmc", C.c_uint8),
        ("smaenhsp0", C.c_int),
        ("switchinfo", C.c_uint8 * SMP_DATA_SIZE),
        ("guid", C.c_uint64),
        ("type", C.c_int),
        ("numports", C.c_int),
        ("info", C.c_uint8 * SMP_DATA_SIZE),
        ("nodedesc", C.c_char * desc),
        ("ports", C.POINTER(C.POINTER(port))),
        ("next_chassis_node", C.POINTER(node)),
        ("chassis", C.c_void_p),
        ("ch_type", C.c_ubyte),
        ("ch_type_str", C.c_char * CHASSIS_TYPE_SIZE),
        ("ch_anafanum", C.c_ubyte),
        ("ch_slotnum", C.c_ubyte),
        ("ch_slot", C.c_ubyte),
        ("ch_found", C.c_ubyte),
        ("htnext", C.POINTER(node)),
        ("type_next", C.POINTER(node)),
    ]


class NdPort(C.Structure):  # ibnd_port_t
    _fields_ = [
        ("guid", C.c_uint64),
        ("portnum", C.c_int),
        ("ext_portnum", C.c_int),
        ("node", C.c_void_p),  # the node's address: read through the layout in use
        ("remoteport", C.c_void_p),  # an NdPort
        ("base_lid", C.c_uint16),
        ("lmc", C.c_uint8),
        ("info", C.c_uint8 * SMP_DATA_SIZE),
        ("ext_info", C.c_uint8 * SMP_DATA_SIZE),
        ("htnext", C.c_void_p),
    ]


class NdNode(C.Structure):  # ibnd_node_t from rdma-core v43: nodedesc[IB_SMP_DATA_SIZE + 1]
    pass


class NdNode42(C.Structure):  # ibnd_node_t to rdma-core v42: nodedesc[IB_SMP_DATA_SIZE]
    pass


NdNode._fields_ = _node_fields(NdNode, NdPort, SMP_DATA_SIZE + 1)
NdNode42._fields_ = _node_fields(NdNode42, NdPort, SMP_DATA_SIZE)
NODE_DESC_GREW = 43  # rdma-core v43.0 (its commit d974c4e39): the node description's NUL


class NdFabric(C.Structure):  # ibnd_fabric_t, as far as ibtool reads it
    _fields_ = [
        ("from_node", C.c_void_p),
        ("from_portnum", C.c_int),
        ("nodes", C.c_void_p),
        ("chassis", C.c_void_p),
        ("maxhops_discovered", C.c_uint),
        ("total_mads_used", C.c_uint),
    ]


class NdConfig(C.Structure):  # ibnd_config_t
    _fields_ = [
        ("max_smps", C.c_uint),
        ("show_progress", C.c_uint),
        ("max_hops", C.c_uint),
        ("debug", C.c_uint),
        ("timeout_ms", C.c_uint),
        ("retries", C.c_uint),
        ("flags", C.c_uint32),
        ("mkey", C.c_uint64),
        ("pad", C.c_uint8 * 44),
    ]


class UmadPort(C.Structure):  # umad_port_t
    _fields_ = [
        ("ca_name", C.c_char * UMAD_CA_NAME_LEN),
        ("portnum", C.c_int),
        ("base_lid", C.c_uint),
        ("lmc", C.c_uint),
        ("sm_lid", C.c_uint),
        ("sm_sl", C.c_uint),
        ("state", C.c_uint),
        ("phys_state", C.c_uint),
        ("rate", C.c_uint),
        ("capmask", C.c_uint32),
        ("gid_prefix", C.c_uint64),
        ("port_guid", C.c_uint64),
        ("pkeys_size", C.c_uint),
        ("pkeys", C.POINTER(C.c_uint16)),
        ("link_layer", C.c_char * UMAD_CA_NAME_LEN),
    ]


class UmadCa(C.Structure):  # umad_ca_t
    _fields_ = [
        ("ca_name", C.c_char * UMAD_CA_NAME_LEN),
        ("node_type", C.c_uint),
        ("numports", C.c_int),
        ("fw_ver", C.c_char * 20),
        ("ca_type", C.c_char * 40),
        ("hw_ver", C.c_char * 20),
        ("node_guid", C.c_uint64),
        ("system_guid", C.c_uint64),
        ("ports", C.POINTER(UmadPort) * UMAD_CA_MAX_PORTS),
    ]


STRUCTS = {  # C name -> ctypes type, for the layout test (ibnd_node_t: structs() picks it)
    "ib_dr_path_t": DrPath,
    "ib_portid_t": PortId,
    "ibnd_port_t": NdPort,
    "ibnd_config_t": NdConfig,
    "umad_port_t": UmadPort,
    "umad_ca_t": UmadCa,
}
PARTIAL = {"ibnd_fabric_t": NdFabric}  # declared as far as ibtool reads it: offsets, not size


# -- the libraries -------------------------------------------------------------------------


@dataclass
class Libraries:
    umad: C.CDLL
    mad: C.CDLL
    nd: C.CDLL
    version: int | None  # rdma-core's major release, from libibnetdisc's file name
    node: type  # ibnd_node_t as that release lays it out


def rdma_core_version(soname: str, maps: str = "/proc/self/maps") -> int | None:
    """The rdma-core release a loaded library comes from: rdma-core names the file
    <soname>.<minor>.<release> (buildlib/rdma_functions.cmake), e.g. libibnetdisc.so.5.0.44.0,
    and the process's maps say which file was loaded."""
    try:
        with open(maps) as f:
            text = f.read(1 << 22)
    except OSError:
        return None
    for line in text.splitlines():
        path = line.rpartition(" ")[2]
        name = os.path.basename(path)
        if name.startswith(soname + "."):
            parts = name[len(soname) + 1 :].split(".")
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def node_struct(version: int | None) -> type:
    """ibnd_node_t's layout for an rdma-core release (the newer one when unknown: a scan then
    checks it against each node's ports before trusting it)."""
    return NdNode42 if version is not None and version < NODE_DESC_GREW else NdNode


def structs() -> dict[str, type]:
    """STRUCTS with the ibnd_node_t of the libibnetdisc loaded."""
    return {**STRUCTS, "ibnd_node_t": libraries().node}


_loaded: Libraries | None = None


# One caller at a time in rdma-core's MAD libraries, in this process: libibumad's CA table
# (umad_init, umad_get_ca) and libibnetdisc's discovery keep state of their own, and the
# exporter asks from two threads (its polls' health checks, its fabric scan). A port opened
# with mad_port is held until it is closed: its MADs and their answers are one conversation.
ONE_AT_A_TIME = threading.RLock()


def libraries() -> Libraries:
    """The three libraries, loaded once, their functions typed; UnsupportedError naming the
    one missing and how to install it."""
    global _loaded
    if _loaded is not None:
        return _loaded
    found = {}
    for key, soname in LIBRARIES.items():
        try:
            found[key] = C.CDLL(soname)
        except OSError:
            raise UnsupportedError(
                f"ibtool fabric needs rdma-core's {soname}, which is not installed", INSTALL
            ) from None
    version = rdma_core_version(LIBRARIES["nd"])
    libs = Libraries(**found, version=version, node=node_struct(version))
    u, m, n = libs.umad, libs.mad, libs.nd
    _sig(u.umad_init, C.c_int, [])
    _sig(u.umad_get_cas_names, C.c_int, [C.c_void_p, C.c_int])
    _sig(u.umad_get_ca, C.c_int, [C.c_char_p, C.POINTER(UmadCa)])
    _sig(u.umad_release_ca, C.c_int, [C.POINTER(UmadCa)])
    _sig(m.mad_get_field, C.c_uint32, [C.c_void_p, C.c_int, C.c_int])
    _sig(m.mad_get_field64, C.c_uint64, [C.c_void_p, C.c_int, C.c_int])
    _sig(m.mad_rpc_open_port, C.c_void_p, [C.c_char_p, C.c_int, C.POINTER(C.c_int), C.c_int])
    _sig(m.mad_rpc_close_port, None, [C.c_void_p])
    _sig(m.mad_rpc_set_timeout, None, [C.c_void_p, C.c_int])
    _sig(m.mad_rpc_set_retries, None, [C.c_void_p, C.c_int])
    _sig(m.madrpc_show_errors, None, [C.c_int])
    query = [C.c_void_p, C.POINTER(PortId), C.c_uint, C.c_uint, C.c_uint, C.c_void_p]
    _sig(m.smp_query_via, C.c_void_p, query)
    _sig(m.pma_query_via, C.c_void_p, [C.c_void_p, C.POINTER(PortId), C.c_int, C.c_uint,
                                        C.c_uint, C.c_void_p])  # fmt: skip
    _sig(n.ibnd_discover_fabric, C.POINTER(NdFabric),
         [C.c_char_p, C.c_int, C.POINTER(PortId), C.POINTER(NdConfig)])  # fmt: skip
    _sig(n.ibnd_destroy_fabric, None, [C.POINTER(NdFabric)])
    m.madrpc_show_errors(0)  # a MAD that times out is ours to name, not libibmad's to print
    _loaded = libs
    return libs


def _sig(fn, restype, argtypes) -> None:
    fn.restype, fn.argtypes = restype, argtypes


WIDE = frozenset(n for n in FIELDS if n.endswith("GUID_F") or n == "IB_SMINFO_KEY_F")


def field(buf, name: str) -> int:
    """A field of an attribute's data, decoded by libibmad's table (64-bit fields too)."""
    m = (_loaded or libraries()).mad
    if name in WIDE:
        return m.mad_get_field64(buf, 0, F[name])
    return m.mad_get_field(buf, 0, F[name])


@contextlib.contextmanager
def _stderr_to(warn: Callable[[str], None], prefix: str) -> Iterator[None]:
    """Whatever C code writes to fd 2 while inside, passed to `warn` a line at a time."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read(64 * 1024).decode("utf-8", "replace")
            for line in text.splitlines()[:50]:
                if line.strip():
                    warn(f"{prefix}: {line.strip()}")


# -- the local ports -----------------------------------------------------------------------


@dataclass(frozen=True)
class LocalPort:
    ca: str
    port: int
    link_layer: str
    state: int
    lid: int
    sm_lid: int
    guid: int


def local_ports(warn: Callable[[str], None]) -> list[LocalPort]:
    """Every port of every CA libibumad sees (the kernel's, or a simulator's under umad2sim),
    with its link layer, state, LID and SM LID."""
    with ONE_AT_A_TIME:
        return _local_ports(warn)


def _local_ports(warn: Callable[[str], None]) -> list[LocalPort]:
    u = libraries().umad
    with _stderr_to(warn, "libibumad"):
        if u.umad_init() < 0:
            raise UnsupportedError("libibumad could not start (umad_init failed)")
        names = (C.c_char * UMAD_CA_NAME_LEN * UMAD_MAX_DEVICES)()
        count = u.umad_get_cas_names(names, UMAD_MAX_DEVICES)
    found = []
    for i in range(max(count, 0)):
        name = names[i].value
        ca = UmadCa()
        if u.umad_get_ca(name, C.byref(ca)) < 0:
            # With no CA at all, libibumad names a default one (mthca0) that is not there.
            if os.path.isdir(UMAD_SYSFS):
                warn(f"{name.decode(errors='replace')}: libibumad could not read it")
            continue
        try:
            for p in ca.ports:
                if not p:
                    continue
                port = p.contents
                found.append(
                    LocalPort(
                        ca=name.decode(errors="replace"),
                        port=port.portnum,
                        link_layer=port.link_layer.decode(errors="replace"),
                        state=port.state,
                        lid=port.base_lid,
                        sm_lid=port.sm_lid,
                        guid=int.from_bytes(port.port_guid.to_bytes(8, "little"), "big"),
                    )
                )
        finally:
            u.umad_release_ca(C.byref(ca))
    return found


def choose_port(ports: list[LocalPort], ca: str | None, port: int | None) -> LocalPort:
    """The port a scan goes out from: the one asked, else the first active InfiniBand port
    (as libibumad's umad_get_port would pick). One line saying why none serves."""
    if not ports:
        raise UnsupportedError(
            "no InfiniBand device here: libibumad sees no CA",
            "ibtool fabric runs on a node with an InfiniBand HCA (or under ibsim's umad2sim)",
        )
    mine = [p for p in ports if (ca is None or p.ca == ca) and (port is None or p.port == port)]
    if not mine:
        shown = f"{ca}/{port}" if port is not None else str(ca)
        have = ", ".join(f"{p.ca}/{p.port}" for p in ports)
        raise NotFoundError(f"no port {shown} among libibumad's: {have}")
    # the kernel says "InfiniBand" (sysfs link_layer), ibsim's umad2sim "IB"
    ib = [p for p in mine if p.link_layer in ("InfiniBand", "IB")]
    if not ib:
        raise UnsupportedError(
            f"{mine[0].ca}/{mine[0].port} is {mine[0].link_layer}: a RoCE port has no subnet "
            "to scan",
            "ibtool fabric needs an InfiniBand port",
        )
    active = [p for p in ib if p.state == PortState.ACTIVE]
    if not active:
        p = ib[0]
        raise IbtoolError(
            f"{p.ca}/{p.port} is not active (state {p.state}): no subnet answers through it",
            "check its cable and that a subnet manager runs (ibtool fabric sm)",
        )
    return active[0]


def check_access(warn: Callable[[str], None]) -> None:
    """PermissionDeniedError when the umad devices exist and cannot be opened (not root)."""
    try:
        names = [n for n in os.listdir(UMAD_DIR) if n.startswith("umad")]
    except OSError:
        return  # no /dev/infiniband: libibumad says what it sees (a simulator, or nothing)
    if names and not any(os.access(os.path.join(UMAD_DIR, n), os.R_OK | os.W_OK) for n in names):
        raise PermissionDeniedError(
            f"cannot open {UMAD_DIR}/{names[0]}: MADs need root (or the umad devices' group)",
            "run it as root, or grant access to /dev/infiniband/umad* (udev rule)",
        )


# -- discovery -----------------------------------------------------------------------------


def discover(start: LocalPort, bounds: Bounds, warn: Callable[[str], None]) -> Fabric:
    """The subnet as libibnetdisc discovers it from `start`, read into records at once (the C
    fabric is freed on every exit)."""
    libs = libraries()
    config = NdConfig(
        max_smps=bounds.max_smps,
        timeout_ms=bounds.timeout_ms,
        retries=bounds.retries,
        max_hops=bounds.max_hops,
    )
    with ONE_AT_A_TIME:
        with _stderr_to(warn, "libibnetdisc"):
            raw = libs.nd.ibnd_discover_fabric(start.ca.encode(), start.port, None, C.byref(config))
        return _discovered(libs, raw, start)


def _discovered(libs, raw, start: LocalPort) -> Fabric:
    if not raw:
        raise IbtoolError(
            f"the subnet could not be discovered through {start.ca}/{start.port}",
            "is a subnet manager running? (ibtool fabric sm, sminfo)",
        )
    try:
        return _read(raw.contents, start)
    finally:
        libs.nd.ibnd_destroy_fabric(raw)


def _read(raw: NdFabric, start: LocalPort) -> Fabric:
    node_type = libraries().node
    as_node = C.POINTER(node_type)
    nodes: dict[int, FabricNode] = {}
    unanswered = []
    address = raw.nodes
    while address:
        n = C.cast(address, as_node).contents
        _check_layout(n, address)
        try:
            kind = NodeType(n.type)
        except ValueError:
            kind = None
        p0 = n.ports[0] if kind == NodeType.SWITCH else None
        # a switch's port 0 says whether it speaks the extended speeds, for all its ports
        switch_caps = field(p0.contents.info, "IB_PORT_CAPMASK_F") if p0 else None
        ports = {}
        first = 0 if kind == NodeType.SWITCH else 1
        for number in range(first, n.numports + 1):
            p = n.ports[number]
            if not p:
                continue
            port = _port(p.contents, as_node, switch_caps)
            ports[number] = port
            if (
                port.remote is None
                and number
                and port.state in (PortState.INIT, PortState.ARMED, PortState.ACTIVE)
            ):
                unanswered.append((n.nodedesc, number))
        desc = n.nodedesc.decode("utf-8", "replace")
        if kind is not None:
            nodes[n.guid] = FabricNode(
                guid=n.guid,
                type=kind,
                description=desc,
                port_count=n.numports,
                ports=ports,
                system_guid=field(n.info, "IB_NODE_SYSTEM_GUID_F"),
                vendor_id=field(n.info, "IB_NODE_VENDORID_F"),
                device_id=field(n.info, "IB_NODE_DEVID_F"),
            )
        address = C.cast(n.next, C.c_void_p).value
    local = (0, start.port)
    if raw.from_node:
        local = (C.cast(raw.from_node, as_node).contents.guid, raw.from_portnum)
    return Fabric(
        nodes=nodes,
        local=local,
        ca=start.ca,
        ca_port=start.port,
        mads=raw.total_mads_used,
        max_hops=raw.maxhops_discovered,
        unanswered=tuple(
            f"{d.decode('utf-8', 'replace')}/{p}: up, and its far end did not answer"
            for d, p in unanswered
        ),
    )


def _check_layout(n, address: int) -> None:
    """The node as read must be the node libibnetdisc wrote: its GUID as its NodeInfo says,
    and each of its ports pointing back at it. Otherwise the library is laid out otherwise
    than this rdma-core release's headers say, and nothing more is read."""
    said = field(n.info, "IB_NODE_GUID_F")
    ports_ok = bool(n.ports) and 0 <= n.numports <= 255
    if ports_ok:
        for i in range(n.numports + 1):
            p = n.ports[i]
            if p and p.contents.node != address:
                ports_ok = False
                break
    if said != n.guid or not ports_ok:
        raise UnsupportedError(
            "libibnetdisc's node structure is not laid out as ibtool reads it "
            f"(rdma-core {libraries().version or 'of unknown release'})",
            "report this rdma-core release to ibtool's authors",
        )


def _port(p: NdPort, as_node, switch_caps: int | None) -> FabricPort:
    # A switch's external ports carry no LID of their own: port 0's is the switch's.
    remote = None
    if p.remoteport:
        r = C.cast(p.remoteport, C.POINTER(NdPort)).contents
        if r.node:
            remote = (C.cast(r.node, as_node).contents.guid, r.portnum)
    return _port_info(
        p.info, p.portnum, p.guid, p.base_lid, p.lmc, switch_caps, remote, p.ext_portnum
    )


def _port_info(
    info,
    number: int,
    guid: int,
    lid: int,
    lmc: int,
    switch_caps: int | None,
    remote: tuple[int, int] | None = None,
    ext_number: int = 0,
) -> FabricPort:
    """A port's record from its PortInfo (`info`, the SMP's data) and what the caller knows
    of it beside: its GUID, its LID (a switch's external port: the switch's), what is cabled
    to it. A switch's ports take its port 0's CapabilityMask (`switch_caps`)."""
    capmask = field(info, "IB_PORT_CAPMASK_F") if switch_caps is None else switch_caps
    extended = bool(capmask & IS_EXTENDED_SPEEDS_SUPPORTED)
    speed = PortSpeed(
        active=field(info, "IB_PORT_LINK_SPEED_ACTIVE_F"),
        enabled=field(info, "IB_PORT_LINK_SPEED_ENABLED_F"),
        supported=field(info, "IB_PORT_LINK_SPEED_SUPPORTED_F"),
        ext_active=field(info, "IB_PORT_LINK_SPEED_EXT_ACTIVE_F") if extended else 0,
        ext_enabled=field(info, "IB_PORT_LINK_SPEED_EXT_ENABLED_F") if extended else 0,
        ext_supported=field(info, "IB_PORT_LINK_SPEED_EXT_SUPPORTED_F") if extended else 0,
    )
    return FabricPort(
        number=number,
        guid=guid,
        lid=lid,
        lmc=lmc,
        state=_enum(PortState, field(info, "IB_PORT_STATE_F")),
        phys_state=_enum(PhysState, field(info, "IB_PORT_PHYS_STATE_F")),
        width_active=field(info, "IB_PORT_LINK_WIDTH_ACTIVE_F"),
        width_enabled=field(info, "IB_PORT_LINK_WIDTH_ENABLED_F"),
        width_supported=field(info, "IB_PORT_LINK_WIDTH_SUPPORTED_F"),
        speed=speed,
        remote=remote,
        ext_number=ext_number,
        cap_mask=capmask,
    )


def _enum(kind, value: int):
    try:
        return kind(value)
    except ValueError:
        return None


# -- the ports' counters (PMA) -------------------------------------------------------------


@dataclass(frozen=True)
class Queried:
    """A port's PMA counters: by name (PORT_COUNTERS), each with the width it saturates at."""

    values: dict[str, int]
    bits: dict[str, int]


def port_counters(
    start: LocalPort,
    targets: list[tuple[int, int]],
    bounds: Bounds,
    warn: Callable[[str], None],
    clean: Callable[[Queried], bool] | None = None,
    data: bool = True,
    pace: Callable[[], None] | None = None,
) -> tuple[dict[tuple[int, int], Queried], set[int], dict[int, int]]:
    """Every (LID, port) of `targets` asked for its PortCounters, and its PortCountersExtended
    where its ClassPortInfo says it has them (the 64-bit error counters too where CapabilityMask2
    says so), as ibqueryerrors and perfquery ask: one MAD at a time, each with the bounds'
    timeout and retries. A LID that did not answer is not asked again for its other ports.

    With `clean`, a LID of several ports (a switch) whose PMA can sum them (ClassPortInfo's
    AllPortSelect) is asked for the sum first (PortSelect 0xFF), as ibqueryerrors asks: when
    `clean` says the sum holds nothing to look at, its ports are not asked one by one.

    Without `data`, PortCountersExtended is asked only for its 64-bit error counters, where a
    port has them (the data counters are PortCounters' 32-bit ones).

    `pace`, where given, is called before each MAD (to hold a rate of MADs a second).

    Returns what was read, the LIDs that did not answer, and the ports left to their sum (by
    LID)."""
    m = libraries().mad
    by_lid: dict[int, list[int]] = {}
    for lid, port in targets:
        if lid:
            by_lid.setdefault(lid, []).append(port)
    found: dict[tuple[int, int], Queried] = {}
    dead: set[int] = set()
    summed: dict[int, int] = {}
    with mad_port(start, bounds, warn, (PERFORMANCE_CLASS,), "performance") as handle:
        buf = (C.c_uint8 * MAD_SIZE)()
        with _stderr_to(warn, "libibmad"):
            for lid, ports in by_lid.items():
                if _pma(m, handle, buf, lid, ports[0], GSI_CLASS_PORT_INFO, bounds, pace) is None:
                    dead.add(lid)
                    continue
                caps = (m.mad_get_field(buf, 0, CPI_CAPMASK_F),
                        m.mad_get_field(buf, 0, CPI_CAPMASK2_F))  # fmt: skip
                if clean is not None and len(ports) > 1 and caps[0] & PMA_ALL_PORT_SELECT:
                    total = _read_port(
                        m, handle, buf, lid, ALL_PORTS, caps, bounds, data=False, pace=pace
                    )
                    if total is None:
                        dead.add(lid)
                        continue
                    if clean(total):
                        summed[lid] = len(ports)
                        continue
                for port in ports:
                    got = _read_port(m, handle, buf, lid, port, caps, bounds, data, pace)
                    if got is None:
                        dead.add(lid)
                        break
                    found[lid, port] = got
    return found, dead, summed


def _read_port(
    m, handle, buf, lid: int, port: int, caps, bounds: Bounds, data: bool = True, pace=None
):
    """One port's PortCounters, then its PortCountersExtended where it has them (for the data
    counters, unless not `data`, and the 64-bit error counters where CapabilityMask2 says so);
    None when the PortCounters did not answer."""
    mask, mask2 = caps
    if _pma(m, handle, buf, lid, port, GSI_PORT_COUNTERS, bounds, pace) is None:
        return None
    values = {n: m.mad_get_field(buf, 0, f) for n, (f, _, _) in PORT_COUNTERS.items()}
    bits = {n: b for n, (_, b, _) in PORT_COUNTERS.items()}
    if not mask & PMA_XMIT_WAIT:
        del values["PortXmitWait"], bits["PortXmitWait"]
    wide = [n for n in values] if mask2 & PMA_EXT_ERRORS else list(DATA_COUNTERS) if data else []
    if wide and mask & (PMA_EXT_WIDTH | PMA_EXT_WIDTH_NOIETF):
        if _pma(m, handle, buf, lid, port, GSI_PORT_COUNTERS_EXT, bounds, pace) is not None:
            for name in wide:
                values[name] = m.mad_get_field64(buf, 0, PORT_COUNTERS[name][2])
                bits[name] = 64
    return Queried(values, bits)


def _pma(m, handle, buf, lid: int, port: int, attribute: int, bounds: Bounds, pace=None):
    if pace is not None:
        pace()
    portid = PortId(lid=lid)
    C.memset(buf, 0, MAD_SIZE)
    return m.pma_query_via(buf, C.byref(portid), port, bounds.timeout_ms, attribute, handle)


# -- subnet managers (SMInfo) --------------------------------------------------------------


@dataclass(frozen=True)
class SmInfo:
    guid: int
    activity: int
    priority: int
    state: int


@contextlib.contextmanager
def mad_port(
    start: LocalPort, bounds: Bounds, warn: Callable[[str], None], classes, what: str
) -> Iterator:
    """libibmad's port through `start` for the management `classes`, with the bounds' timeout
    and retries, closed on every exit."""
    m = libraries().mad
    wanted = (C.c_int * len(classes))(*classes)
    with ONE_AT_A_TIME:
        with _stderr_to(warn, "libibmad"):
            handle = m.mad_rpc_open_port(start.ca.encode(), start.port, wanted, len(classes))
        yield from _opened(m, handle, start, bounds, what)


def _opened(m, handle, start: LocalPort, bounds: Bounds, what: str) -> Iterator:
    if not handle:
        raise IbtoolError(
            f"cannot open {start.ca}/{start.port} for {what} MADs",
            "is the umad device there and yours? (ls -l /dev/infiniband)",
        )
    try:
        m.mad_rpc_set_timeout(handle, bounds.timeout_ms)
        m.mad_rpc_set_retries(handle, bounds.retries)
        yield handle
    finally:
        m.mad_rpc_close_port(handle)


def smp_port(start: LocalPort, bounds: Bounds, warn: Callable[[str], None]):
    """libibmad's port for SMPs through `start` (mad_port)."""
    return mad_port(start, bounds, warn, (SMI_CLASS, SMI_DIRECT_CLASS), "subnet management")


def _smp(handle, lid: int, attribute: int, modifier: int, bounds: Bounds, warn) -> bytes | None:
    """One attribute's data by a LID-routed SMP GET (smp_query_via); None when it did not
    answer (the caller names what did not: libibmad's lines about it say no more)."""
    return _get(handle, PortId(lid=lid), attribute, modifier, bounds, warn)


def _dr_smp(
    handle, path: tuple[int, ...], attribute: int, modifier: int, bounds: Bounds, warn
) -> bytes | None:
    """One attribute's data by a directed-route SMP GET along `path` (the out port at each
    hop; () is the local node), as `smpquery -D 0,P` asks: libibmad sends an SMP with LID 0
    through the directed-route class (libibmad/smp.c), its path laid out as str2drpath lays it
    (p[0] the start, p[1..cnt] the hops)."""
    portid = PortId(lid=0)
    portid.drpath.cnt = len(path)
    for i, out in enumerate(path, 1):
        portid.drpath.p[i] = out
    return _get(handle, portid, attribute, modifier, bounds, warn)


def _get(handle, portid: PortId, attribute: int, modifier: int, bounds: Bounds, warn):
    m = libraries().mad
    buf = (C.c_uint8 * SMP_DATA_SIZE)()
    said: list[str] = []
    with _stderr_to(said.append, "libibmad"):
        got = m.smp_query_via(buf, C.byref(portid), attribute, modifier, bounds.timeout_ms, handle)
    if not got:
        return None
    for line in said:
        warn(line)
    return bytes(buf)


def sm_info(handle, lid: int, bounds: Bounds, warn: Callable[[str], None]) -> SmInfo | None:
    """The SMInfo of the SM behind `lid` (as sminfo asks); None when it did not answer."""
    buf = _smp(handle, lid, ATTR_SM_INFO, 0, bounds, warn)
    if buf is None:
        return None
    return SmInfo(
        guid=field(buf, "IB_SMINFO_GUID_F"),
        activity=field(buf, "IB_SMINFO_ACT_F"),
        priority=field(buf, "IB_SMINFO_PRIO_F"),
        state=field(buf, "IB_SMINFO_STATE_F"),
    )


# -- routes (the switches' linear forwarding tables) -----------------------------------------

LFT_BLOCK = 64  # LinearForwardingTable: 64 one-byte port entries a block (IBTA 14.2.5.10)


def lft_block(
    handle, switch_lid: int, block: int, bounds: Bounds, warn: Callable[[str], None]
) -> bytes | None:
    """Block `block` of a switch's LinearForwardingTable (the out port of LIDs block*64 to
    block*64+63), asked by LID as ibtracert and ibroute ask; None when it did not answer."""
    return _smp(handle, switch_lid, ATTR_LINEAR_FORWARDING_TABLE, block, bounds, warn)


# -- a local port's cable, end to end (directed route) --------------------------------------


def _node(buf: bytes) -> tuple[int, NodeType | None, int, int]:
    """(node GUID, type, port count, the port the SMP entered by) of a NodeInfo."""
    return (
        field(buf, "IB_NODE_GUID_F"),
        _enum(NodeType, field(buf, "IB_NODE_TYPE_F")),
        field(buf, "IB_NODE_NPORTS_F"),
        field(buf, "IB_NODE_LOCAL_PORT_F"),
    )


def _description(buf: bytes | None) -> str:
    """A NodeDescription's text: up to its first NUL (IBTA 14.2.5.2, 64 bytes)."""
    return buf.split(b"\0", 1)[0].decode("utf-8", "replace") if buf else ""


def node_info(handle, lid: int, bounds: Bounds, warn: Callable[[str], None]):
    """(node GUID, type, port count, the port the SMP entered by) of the node behind `lid`,
    by one LID-routed SMP; None when it did not answer."""
    info = _smp(handle, lid, ATTR_NODE_INFO, 0, bounds, warn)
    return None if info is None else _node(info)


def node_at(handle, lid: int, bounds: Bounds, warn: Callable[[str], None]) -> FabricNode | None:
    """The node behind `lid` as its NodeInfo and NodeDescription say (no ports read), by
    LID-routed SMPs; None when it did not answer."""
    info = node_info(handle, lid, bounds, warn)
    if info is None:
        return None
    guid, kind, count, _ = info
    desc = _description(_smp(handle, lid, ATTR_NODE_DESC, 0, bounds, warn))
    return FabricNode(guid, kind or NodeType.CA, desc, count, {})


def cable(handle, ca: str, port: int, bounds: Bounds, warn: Callable[[str], None]) -> Cable:
    """The cable of local port `port` of `ca`: this end's NodeInfo and PortInfo, then, where
    the port is up, the far node's NodeInfo, NodeDescription and the PortInfo of the port the
    cable enters by (and a switch's port 0, its LID and capabilities), by directed route (as
    `smpquery -D nodeinfo 0,P` asks): 2 SMPs, 6 with the far end (5 where it is a channel
    adapter)."""
    info = _dr_smp(handle, (), ATTR_NODE_INFO, 0, bounds, warn)
    guid, kind, count, _ = _node(info) if info is not None else (0, None, 0, 0)
    near = FabricNode(guid, kind or NodeType.CA, ca, count, {})
    mine = port_by_path(handle, (), port, near, info, bounds, warn) if info else None
    if mine is None:
        return Cable(ca, near, None, why=f"{ca}/{port}: its own SMA did not answer")
    near = dataclasses.replace(near, ports={port: mine})
    if mine.state not in (PortState.INIT, PortState.ARMED, PortState.ACTIVE):
        state = mine.state.name if mine.state is not None else "unknown"
        return Cable(ca, near, None, why=f"{ca}/{port} is {state}")
    found = node_by_path(handle, (port,), bounds, warn)
    if found is None:
        return Cable(ca, near, None, why=f"{ca}/{port} is up, and its far end did not answer")
    far, entered, far_info = found
    caps = None
    if far.type == NodeType.SWITCH:
        p0 = port_by_path(handle, (port,), 0, far, far_info, bounds, warn)
        if p0 is not None:
            caps = p0.cap_mask
            far = dataclasses.replace(far, ports={0: p0})
    there = port_by_path(handle, (port,), entered, far, far_info, bounds, warn, caps)
    if there is None:
        why = f"{ca}/{port} is up, and its far end's PortInfo did not answer"
        return Cable(ca, near, None, why=why)
    near = dataclasses.replace(
        near, ports={port: dataclasses.replace(mine, remote=(far.guid, entered))}
    )
    far = dataclasses.replace(
        far, ports={**far.ports, entered: dataclasses.replace(there, remote=(guid, port))}
    )
    return Cable(ca, near, far, entered)


# -- a route walked by directed route (as ibtracert walks it) --------------------------------


def node_by_path(
    handle, path: tuple[int, ...], bounds: Bounds, warn: Callable[[str], None]
) -> tuple[FabricNode, int, bytes] | None:
    """The node at the end of directed route `path` (() is the local node): its NodeInfo and
    NodeDescription, as ibtracert's get_node asks them (infiniband-diags ibtracert.c), with no
    port read yet; and the port the SMP entered it by (NodeInfo.LocalPortNum), and the
    NodeInfo itself. None when it did not answer."""
    info = _dr_smp(handle, path, ATTR_NODE_INFO, 0, bounds, warn)
    if info is None:
        return None
    guid, kind, count, entered = _node(info)
    desc = _description(_dr_smp(handle, path, ATTR_NODE_DESC, 0, bounds, warn))
    node = FabricNode(guid, kind or NodeType.CA, desc, count, {},
                      system_guid=field(info, "IB_NODE_SYSTEM_GUID_F"),
                      vendor_id=field(info, "IB_NODE_VENDORID_F"),
                      device_id=field(info, "IB_NODE_DEVID_F"))  # fmt: skip
    return node, entered, info


def port_by_path(
    handle,
    path: tuple[int, ...],
    number: int,
    node: FabricNode,
    info: bytes,
    bounds: Bounds,
    warn: Callable[[str], None],
    switch_caps: int | None = None,
) -> FabricPort | None:
    """Port `number` of the node at the end of `path` (`node`, `info` its NodeInfo), as its
    PortInfo says; a switch's external port takes the switch's LID (`node`'s port 0, read
    first) and its port 0's CapabilityMask (`switch_caps`). None when it did not answer."""
    buf = _dr_smp(handle, path, ATTR_PORT_INFO, number, bounds, warn)
    if buf is None:
        return None
    switch = node.type == NodeType.SWITCH
    lid = node.lid if switch and number else field(buf, "IB_PORT_LID_F")
    guid = node.guid if switch else field(info, "IB_NODE_PORT_GUID_F")
    return _port_info(
        buf, number, guid, lid, field(buf, "IB_PORT_LMC_F"), switch_caps if switch else None
    )


def lft_block_by_path(
    handle, path: tuple[int, ...], block: int, bounds: Bounds, warn: Callable[[str], None]
) -> bytes | None:
    """Block `block` of the LinearForwardingTable of the switch at the end of `path`, by
    directed route (as ibtracert's switch_lookup asks it); None when it did not answer."""
    return _dr_smp(handle, path, ATTR_LINEAR_FORWARDING_TABLE, block, bounds, warn)

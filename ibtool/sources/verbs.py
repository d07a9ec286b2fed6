"""pyverbs: which one this host has, and device and port facts through it.

Imported only when a command needs verbs. pyverbs must match the system libibverbs, so it comes
from the distribution (python3-pyverbs), never from PyPI: the PyPI build links to a newer
rdma-core's private ABI and fails to import.

This is the one module that knows how pyverbs differs between releases (rdma-core 33 to 65):

- the enum module is `pyverbs.enums` up to rdma-core 58 and `pyverbs.libibverbs_enums` from 50
  (pyverbs/libibverbs_enums.pyx, "pyverbs: Fix runtime warnings in Fedora 39"; pyverbs/enums.pyx
  went in 59, "pyverbs: Align code to support Cython 3.1.0 format"); the same for
  `pyverbs.cm_enums` and `pyverbs.librdmacm_enums`;
- built with Cython >= 3.1 (Debian's 65), the constants live only inside the enum classes
  (`ibv_qp_type.IBV_QPT_RC`): the flat module names (`IBV_QPT_RC`) are gone. The classes exist
  in every release (IntEnum from Cython 0.29, IntFlag from Cython 3), so ibtool uses nothing else;
- `CMID.reject` exists from rdma-core 38 (pyverbs/cmid.pyx, "pyverbs: Add rdmacm reject support").

Features are probed once and cached, never inferred from a version: `pyverbs.__version__`
exists only from rdma-core 65.
"""

from __future__ import annotations

import errno as errno_mod
import functools
import importlib
from types import ModuleType, SimpleNamespace
from typing import Any

from ibtool.errors import IbtoolError, PermissionDeniedError, UnsupportedError
from ibtool.model.deferred import dataclass

PYVERBS_INSTALL = (
    "install the distribution's python3-pyverbs (Debian/Ubuntu: apt install python3-pyverbs; "
    "RHEL/Fedora: dnf install python3-pyverbs)"
)
PYVERBS_HINT = PYVERBS_INSTALL + "; in a venv, create it with --system-site-packages"
LIBIBVERBS_HINT = (
    "install rdma-core's libraries of python3-pyverbs' own release (Debian/Ubuntu: apt install "
    "python3-pyverbs ibverbs-providers rdma-core; RHEL/Fedora: dnf install python3-pyverbs "
    "libibverbs rdma-core)"
)
RDMACM_HINT = (
    "install the distribution's python3-pyverbs with librdmacm (Debian/Ubuntu: apt install "
    "python3-pyverbs librdmacm1; RHEL/Fedora: dnf install python3-pyverbs librdmacm)"
)
UPGRADE_HINT = (
    "ibtool needs the python3-pyverbs of rdma-core 33 or later: upgrade python3-pyverbs, "
    "rdma-core and ibverbs-providers together"
)

# The classes the data path builds, by pyverbs module (all there since rdma-core 24).
VERBS_CLASSES = {
    "device": ("Context",),
    "pd": ("PD",),
    "cq": ("CQ",),
    "mr": ("MR",),
    "qp": ("QP", "QPAttr", "QPInitAttr", "QPCap"),
    "wr": ("SendWR", "RecvWR", "SGE"),
    "addr": ("AH", "AHAttr", "GlobalRoute", "GID"),
}
# The libibverbs enum classes, with the members the data path hands to pyverbs.
VERBS_ENUMS = {
    "ibv_qp_type": ("IBV_QPT_RC", "IBV_QPT_UD"),
    "ibv_qp_state": ("IBV_QPS_RESET", "IBV_QPS_INIT", "IBV_QPS_RTR", "IBV_QPS_RTS"),
    "ibv_wr_opcode": (
        "IBV_WR_SEND",
        "IBV_WR_RDMA_WRITE",
        "IBV_WR_RDMA_WRITE_WITH_IMM",
        "IBV_WR_RDMA_READ",
        "IBV_WR_ATOMIC_FETCH_AND_ADD",
        "IBV_WR_ATOMIC_CMP_AND_SWP",
    ),
    "ibv_create_cq_wc_flags": ("IBV_WC_EX_WITH_BYTE_LEN", "IBV_WC_EX_WITH_IMM"),
}
VERBS_ENUM_MODULES = ("pyverbs.libibverbs_enums", "pyverbs.enums")
# What ping reads from an extended CQ in place (completions.in_place); without them, a plain CQ.
CQEX_READS = (
    "start_poll",
    "end_poll",
    "status",
    "read_opcode",
    "read_imm_data",
    "read_vendor_err",
    "read_byte_len",
)

CM_CLASSES = ("CMID", "CMEventChannel", "CMEvent", "AddrInfo", "ConnParam")
# What `ping --compat rping` calls on a CMID (ibtool/rdma/cm.py): all in rdma-core 33's
# pyverbs/cmid.pyx; dev_name and port_num (34 and later) are optional.
CMID_METHODS = (
    "bind_addr",
    "listen",
    "accept",
    "resolve_addr",
    "resolve_route",
    "connect",
    "disconnect",
    "create_qp",
    "post_send",
    "post_recv",
    "post_read",
    "post_write",
)
CM_ENUMS = {
    "rdma_port_space": ("RDMA_PS_TCP", "RDMA_PS_UDP"),
    "rdma_cm_event_type": (
        "RDMA_CM_EVENT_ADDR_RESOLVED",
        "RDMA_CM_EVENT_ROUTE_RESOLVED",
        "RDMA_CM_EVENT_CONNECT_REQUEST",
        "RDMA_CM_EVENT_ESTABLISHED",
        "RDMA_CM_EVENT_REJECTED",
        "RDMA_CM_EVENT_DISCONNECTED",
    ),
}
CM_ENUM_MODULES = ("pyverbs.librdmacm_enums", "pyverbs.cm_enums")


@dataclass(frozen=True)
class Pyverbs:
    """pyverbs as the data path (ladder, loopback, ping) uses it."""

    addr: ModuleType
    cq: ModuleType
    device: ModuleType
    mr: ModuleType
    pd: ModuleType
    qp: ModuleType
    wr: ModuleType
    e: SimpleNamespace  # the VERBS_ENUMS classes only: e.ibv_qp_type.IBV_QPT_RC
    Error: type
    RDMAError: type
    enums_module: str  # where `e` came from
    cqex: bool  # extended CQs with the CQEX_READS (else ping polls a plain CQ)


@dataclass(frozen=True)
class RdmaCm:
    """librdmacm's part of pyverbs."""

    cmid: ModuleType
    e: SimpleNamespace  # the CM_ENUMS classes only: e.rdma_port_space.RDMA_PS_TCP
    enums_module: str
    reject: bool  # CMID.reject


@functools.cache
def pyverbs() -> Pyverbs:
    """pyverbs for the data path, loaded and probed once; an UnsupportedError naming what to
    install when it is missing or too old."""
    try:
        modules = {name: importlib.import_module(f"pyverbs.{name}") for name in VERBS_CLASSES}
        errors = importlib.import_module("pyverbs.pyverbs_error")
    except ImportError as e:
        raise unavailable("pyverbs", e, PYVERBS_HINT) from None
    for name, classes in VERBS_CLASSES.items():
        _require(modules[name], classes)
    enums_module, e = _enum_classes(VERBS_ENUM_MODULES, VERBS_ENUMS, "pyverbs", PYVERBS_HINT)
    return Pyverbs(
        **modules,
        e=e,
        Error=errors.PyverbsError,
        RDMAError=errors.PyverbsRDMAError,
        enums_module=enums_module,
        cqex=_has_cqex(modules["cq"]),
    )


@functools.cache
def rdmacm() -> RdmaCm:
    """librdmacm's part of pyverbs, loaded and probed once."""
    try:
        importlib.import_module("pyverbs")
    except ImportError as e:
        raise unavailable("pyverbs", e, PYVERBS_HINT) from None
    what = "librdmacm's part of pyverbs"
    try:
        cmid = importlib.import_module("pyverbs.cmid")
    except ImportError as e:
        raise unavailable(what, e, RDMACM_HINT) from None
    _require(cmid, CM_CLASSES)
    for method in CMID_METHODS:
        if not hasattr(cmid.CMID, method):
            raise too_old(f"pyverbs.cmid.CMID.{method}")
    enums_module, e = _enum_classes(CM_ENUM_MODULES, CM_ENUMS, what, RDMACM_HINT)
    return RdmaCm(cmid, e, enums_module, reject=hasattr(cmid.CMID, "reject"))


def too_old(what: str, since: int | None = None) -> UnsupportedError:
    """The error for a pyverbs that lacks `what` (present from rdma-core `since`)."""
    release = f" (rdma-core {since} and later have it)" if since else ""
    return UnsupportedError(f"this pyverbs has no {what}{release}", UPGRADE_HINT)


def unavailable(what: str, e: ImportError, hint: str) -> UnsupportedError:
    text = str(e)
    if "librdmacm" in text:
        hint = RDMACM_HINT
    elif ".so" in text or "undefined symbol" in text:
        # The module is there; a library it links to is not, or is older than pyverbs.
        hint = LIBIBVERBS_HINT
    elif isinstance(e, ModuleNotFoundError) and e.name == "pyverbs" and hint == PYVERBS_HINT:
        from ibtool.sources.versions import why_no_pyverbs

        why = why_no_pyverbs()
        hint = f"{PYVERBS_INSTALL}; {why}" if why else hint
    return UnsupportedError(f"{what} is not available ({e})", hint)


def _require(module: ModuleType, names) -> None:
    for name in names:
        if not hasattr(module, name):
            raise too_old(f"{module.__name__}.{name}")


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # the package itself, or something the module imports
            raise
        return None


def _enum_classes(candidates, wanted, what: str, hint: str) -> tuple[str, SimpleNamespace]:
    """The first of the candidate enum modules that has every wanted member, and the wanted
    classes from it."""
    lacking = None
    for name in candidates:
        try:
            module = _optional_module(name)
        except ImportError as e:
            raise unavailable(what, e, hint) from None
        if module is None:
            continue
        missing = [
            f"{cls}.{member}"
            for cls, members in wanted.items()
            for member in members
            if not hasattr(getattr(module, cls, None), member)
        ]
        if not missing:
            return name, SimpleNamespace(**{cls: getattr(module, cls) for cls in wanted})
        lacking = lacking or f"{name}.{missing[0]}"
    if lacking:
        raise too_old(lacking)
    raise UnsupportedError(f"{what} has none of the modules {', '.join(candidates)}", hint)


def _has_cqex(cq: ModuleType) -> bool:
    cqex = getattr(cq, "CQEX", None)
    return (
        cqex is not None
        and hasattr(cq, "CqInitAttrEx")
        and hasattr(cq, "PollCqAttr")
        and all(hasattr(cqex, name) for name in CQEX_READS)
    )


IBV_MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
IBV_WIDTH = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
IBV_SPEED = {
    1: "SDR",
    2: "DDR",
    4: "QDR",
    8: "FDR10",
    16: "FDR",
    32: "EDR",
    64: "HDR",
    128: "NDR",
    256: "XDR",
}
ATOMIC_CAPS = {0: "NONE", 1: "HCA", 2: "GLOB"}

IB_DEVICE_AUTO_PATH_MIG = 1 << 4
# ib_device_cap_flags bit positions, named as iproute2 prints them.
DEVICE_CAP_FLAGS = {
    0: "RESIZE_MAX_WR",
    1: "BAD_PKEY_CNTR",
    2: "BAD_QKEY_CNTR",
    3: "RAW_MULTI",
    4: "AUTO_PATH_MIG",
    5: "CHANGE_PHY_PORT",
    6: "UD_AV_PORT_ENFORCE",
    7: "CURR_QP_STATE_MOD",
    8: "SHUTDOWN_PORT",
    9: "INIT_TYPE",
    10: "PORT_ACTIVE_EVENT",
    11: "SYS_IMAGE_GUID",
    12: "RC_RNR_NAK_GEN",
    13: "SRQ_RESIZE",
    14: "N_NOTIFY_CQ",
    15: "LOCAL_DMA_LKEY",
    17: "MEM_WINDOW",
    18: "UD_IP_CSUM",
    19: "UD_TSO",
    20: "XRC",
    21: "MEM_MGT_EXTENSIONS",
    22: "BLOCK_MULTICAST_LOOPBACK",
    23: "MEM_WINDOW_TYPE_2A",
    24: "MEM_WINDOW_TYPE_2B",
    25: "RC_IP_CSUM",
    26: "RAW_IP_CSUM",
    27: "CROSS_CHANNEL",
    29: "MANAGED_FLOW_STEERING",
    30: "SIGNATURE_HANDOVER",
    31: "ON_DEMAND_PAGING",
    32: "SG_GAPS_REG",
    33: "VIRTUAL_FUNCTION",
    34: "RAW_SCATTER_FCS",
    35: "RDMA_NETDEV_OPA_VNIC",
    36: "PCI_WRITE_END_PADDING",
}


def _import_pyverbs():
    # Only what device and port queries need: `dev -d` works whatever the enum modules are.
    try:
        from pyverbs.device import Context
        from pyverbs.pyverbs_error import PyverbsError
    except ImportError as e:
        raise unavailable("pyverbs", e, PYVERBS_HINT) from None
    return Context, PyverbsError


class VerbsSource:
    def __init__(self) -> None:
        self._Context, self._PyverbsError = _import_pyverbs()

    def _open(self, device: str):
        try:
            return self._Context(name=device)
        except self._PyverbsError as e:
            code = getattr(e, "error_code", None)
            if code in (errno_mod.EACCES, errno_mod.EPERM):
                raise PermissionDeniedError(
                    f"{device}: cannot open the verbs device: {e}",
                    "check the permissions of /dev/infiniband/uverbs*",
                ) from None
            raise IbtoolError(f"{device}: cannot open the verbs device: {e}") from None

    def device_caps(self, device: str) -> dict[str, Any]:
        with self._open(device) as ctx:
            a = ctx.query_device()
        return {
            "vendor_id": f"0x{a.vendor_id:04x}",
            "vendor_part_id": a.vendor_part_id,
            "hw_ver": a.hw_ver,
            "phys_port_cnt": a.phys_port_cnt,
            "max_qp": a.max_qp,
            "max_qp_wr": a.max_qp_wr,
            "max_sge": a.max_sge,
            "max_cq": a.max_cq,
            "max_cqe": a.max_cqe,
            "max_mr": a.max_mr,
            "max_mr_size": a.max_mr_size,
            "max_pd": a.max_pd,
            "max_srq": a.max_srq,
            "max_ah": a.max_ah,
            "max_qp_rd_atom": a.max_qp_rd_atom,
            "max_qp_init_rd_atom": a.max_qp_init_rd_atom,
            "atomic_caps": ATOMIC_CAPS.get(a.atomic_caps, str(a.atomic_caps)),
            "max_pkeys": a.max_pkeys,
            "local_ca_ack_delay": a.local_ca_ack_delay,
            "page_size_cap": f"0x{a.page_size_cap:x}",
            "device_cap_flags": [
                DEVICE_CAP_FLAGS.get(b, f"bit{b}") for b in range(64) if a.device_cap_flags >> b & 1
            ],
        }

    def port_attrs(self, device: str, port: int) -> dict[str, Any]:
        with self._open(device) as ctx:
            a = ctx.query_port(port)
            flags = ctx.query_device().device_cap_flags
        return {
            "active_mtu": IBV_MTU_BYTES.get(a.active_mtu),
            "max_mtu": IBV_MTU_BYTES.get(a.max_mtu),
            "lanes": IBV_WIDTH.get(a.active_width),
            "speed": IBV_SPEED.get(a.active_speed),
            "gid_tbl_len": a.gid_tbl_len,
            "pkey_tbl_len": a.pkey_tbl_len,
            "max_vl_num": a.max_vl_num,
            "max_msg_sz": a.max_msg_sz,
            "port_cap_flags": a.port_cap_flags,
            "port_cap_flags2": a.port_cap_flags2,
            "auto_path_mig": bool(flags & IB_DEVICE_AUTO_PATH_MIG),
        }

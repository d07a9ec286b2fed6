"""Device and port facts through libibverbs (pyverbs), imported only when a command needs them.

pyverbs must match the system libibverbs, so it comes from the distribution (python3-pyverbs),
never from PyPI: the PyPI build links to a newer rdma-core's private ABI and fails to import.
"""

from __future__ import annotations

import errno as errno_mod
from typing import Any

from ibtool.errors import IbtoolError, PermissionDeniedError, UnsupportedError

PYVERBS_HINT = (
    "install the distribution's python3-pyverbs (Debian/Ubuntu: apt install python3-pyverbs; "
    "RHEL/Fedora: dnf install python3-pyverbs); in a venv, create it with --system-site-packages"
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
    try:
        from pyverbs.device import Context
        from pyverbs.pyverbs_error import PyverbsError
    except ImportError as e:
        raise UnsupportedError(f"pyverbs is not available ({e})", PYVERBS_HINT) from None
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
        return {
            "active_mtu": IBV_MTU_BYTES.get(a.active_mtu),
            "max_mtu": IBV_MTU_BYTES.get(a.max_mtu),
            "lanes": IBV_WIDTH.get(a.active_width),
            "speed": IBV_SPEED.get(a.active_speed),
            "gid_tbl_len": a.gid_tbl_len,
            "pkey_tbl_len": a.pkey_tbl_len,
            "max_msg_sz": a.max_msg_sz,
            "port_cap_flags": a.port_cap_flags,
            "port_cap_flags2": a.port_cap_flags2,
        }

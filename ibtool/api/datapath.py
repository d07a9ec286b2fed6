"""The verbs data path as plugins drive it: the path to a peer (Ladder, PathSpec), the MTU
codes of enum ibv_mtu (include/infiniband/verbs.h) and their sizes, the wire's modes and the
NIC's hardware clock."""

from __future__ import annotations

from ibtool.rdma.hwclock import HwClock
from ibtool.rdma.ladder import MTU_BYTES, MTU_CODES, Ladder, PathSpec
from ibtool.rdma.wire import MODES, Mode

__all__ = ["MODES", "MTU_BYTES", "MTU_CODES", "HwClock", "Ladder", "Mode", "PathSpec"]

"""The verbs data path as plugins drive it: its command-line options (DataOption,
DATAPATH_OPTIONS, add_datapath_option; a ping's largest payload, MAX_PING_SIZE) and the path
they ask for (path_spec), the path to a peer (Ladder, PathSpec), the MTU codes of enum ibv_mtu
(include/infiniband/verbs.h) and their sizes, the wire's modes and the NIC's hardware clock.

The options are cheap to take in a command's configure (which runs at every start); the
verbs modules behind Ladder, PathSpec, the MTU codes and HwClock are loaded when one of
those is first taken (PEP 562's module __getattr__).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ibtool.rdma.options import (
    DATAPATH_OPTIONS,
    MAX_PING_SIZE,
    DataOption,
    add_datapath_option,
    path_spec,
)
from ibtool.rdma.wire import MODES, Mode

if TYPE_CHECKING:  # what _LAZY loads, for type checkers and readers
    from ibtool.rdma.hwclock import HwClock
    from ibtool.rdma.ladder import MTU_BYTES, MTU_CODES, Ladder, PathSpec

# name -> its module, loaded on first use
_LAZY = {
    "HwClock": "ibtool.rdma.hwclock",
    "MTU_BYTES": "ibtool.rdma.ladder",
    "MTU_CODES": "ibtool.rdma.ladder",
    "Ladder": "ibtool.rdma.ladder",
    "PathSpec": "ibtool.rdma.ladder",
}


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ibtool.api.datapath' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: the next use is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DATAPATH_OPTIONS",
    "MAX_PING_SIZE",
    "MODES",
    "MTU_BYTES",
    "MTU_CODES",
    "DataOption",
    "HwClock",
    "Ladder",
    "Mode",
    "PathSpec",
    "add_datapath_option",
    "path_spec",
]

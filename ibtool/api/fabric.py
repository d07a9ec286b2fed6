"""The InfiniBand fabric: a scan's bounds (Bounds) and records (Fabric, its nodes, ports and
links, ports' counters), the error thresholds (parse_thresholds, judge_counters), and their
text and JSON (view). The scan itself is the Host's: ``host.fabric()``, and
``host.fabric_counters()`` for its ports' counters."""

from __future__ import annotations

from ibtool.model.fabric import (
    ERROR_COUNTERS,
    THRESHOLDS_FILE,
    THRESHOLDS_MAX,
    Bounds,
    Fabric,
    FabricNode,
    FabricPort,
    Link,
    NodeType,
    PortCounters,
    clean_sum,
    fabric_changes,
    fabric_data,
    fabric_from_data,
    judge_counters,
    judge_sms,
    parse_thresholds,
)
from ibtool.model.fabric.cables import judge_cable, judge_sm
from ibtool.views import fabric as view

__all__ = [
    "ERROR_COUNTERS",
    "THRESHOLDS_FILE",
    "THRESHOLDS_MAX",
    "Bounds",
    "Fabric",
    "FabricNode",
    "FabricPort",
    "Link",
    "NodeType",
    "PortCounters",
    "clean_sum",
    "fabric_changes",
    "fabric_data",
    "fabric_from_data",
    "judge_cable",
    "judge_counters",
    "judge_sm",
    "judge_sms",
    "parse_thresholds",
    "view",
]

"""The InfiniBand fabric: pure data and pure functions over it, one module a question.

    records   the subnet as discovered: nodes, ports, links, a scan's bounds (the IBTA's numbers)
    links     each link against what its ends enable and its tier's norm (`fabric links`)
    counters  the ports' PMA counters against infiniband-diags' thresholds (`fabric errors`)
    sm        the subnet managers and what is wrong with them (`fabric sm`)
    route     a route hop by hop, and what names its ends (`fabric route`)
    suspects  the cable the failing paths have in common (`mesh` on InfiniBand)
    saved     a scan as a snapshot keeps it, read back checked, and two scans compared

Decoded from MADs by ibtool.sources.mad; written for people and programs by ibtool.views.fabric.
Every name is here too, so that `from ibtool.model.fabric import Fabric` serves.

May import the rest of ibtool.model, ibtool.errors and ibtool.argtypes only, as the model does.
"""

from __future__ import annotations

from ibtool.model.fabric.counters import (
    CONGESTION,
    ERROR_COUNTERS,
    ERROR_FIXES,
    SYSFS_NAMES,
    THRESHOLDS_FILE,
    THRESHOLDS_MAX,
    CounterFinding,
    CountersRead,
    PortCounters,
    clean_sum,
    judge_counters,
    over,
    parse_thresholds,
)
from ibtool.model.fabric.links import (
    NORM_MIN_LINKS,
    TIERS,
    LinkFinding,
    Norm,
    fastest,
    gbps,
    judge,
    judge_links,
    norms,
    tier,
    up,
    widest,
)
from ibtool.model.fabric.records import (
    IS_SM,
    LANE_GBPS,
    SPEED_ORDER,
    SPEEDS,
    SPEEDS_EXT,
    SPEEDS_EXT2,
    WIDTH_LANES,
    WIDTHS,
    Bounds,
    Cable,
    Fabric,
    FabricNode,
    FabricPort,
    Link,
    LinkEnd,
    NodeType,
    PortSpeed,
    end_name,
    names_of,
    width_name,
)
from ibtool.model.fabric.route import (
    Hop,
    Route,
    resolve,
)
from ibtool.model.fabric.saved import (
    COUNTERS,
    DESCRIPTION_MAX,
    FABRIC_NODES_MAX,
    NODE_PORTS_MAX,
    FabricChange,
    fabric_changes,
    fabric_data,
    fabric_from_data,
)
from ibtool.model.fabric.sm import (
    SmFinding,
    SmScan,
    SmState,
    SubnetManager,
    judge_sms,
)
from ibtool.model.fabric.suspects import (
    CableSuspect,
    cable_name,
    suspect_cables,
)

__all__ = [
    "CONGESTION",
    "COUNTERS",
    "DESCRIPTION_MAX",
    "ERROR_COUNTERS",
    "SYSFS_NAMES",
    "ERROR_FIXES",
    "FABRIC_NODES_MAX",
    "IS_SM",
    "LANE_GBPS",
    "NODE_PORTS_MAX",
    "NORM_MIN_LINKS",
    "SPEEDS",
    "SPEEDS_EXT",
    "SPEEDS_EXT2",
    "SPEED_ORDER",
    "THRESHOLDS_FILE",
    "THRESHOLDS_MAX",
    "TIERS",
    "WIDTHS",
    "WIDTH_LANES",
    "Bounds",
    "Cable",
    "CableSuspect",
    "CounterFinding",
    "CountersRead",
    "Fabric",
    "FabricChange",
    "FabricNode",
    "FabricPort",
    "Hop",
    "Link",
    "LinkEnd",
    "LinkFinding",
    "NodeType",
    "Norm",
    "PortCounters",
    "PortSpeed",
    "Route",
    "SmFinding",
    "SmScan",
    "SmState",
    "SubnetManager",
    "cable_name",
    "clean_sum",
    "end_name",
    "fabric_changes",
    "fabric_data",
    "fabric_from_data",
    "fastest",
    "gbps",
    "judge",
    "judge_counters",
    "judge_links",
    "judge_sms",
    "names_of",
    "norms",
    "over",
    "parse_thresholds",
    "resolve",
    "suspect_cables",
    "tier",
    "up",
    "widest",
    "width_name",
]

"""The InfiniBand fabric: a scan's bounds (Bounds) and records (Fabric, its nodes, ports and
links), and their text and JSON (view). The scan itself is the Host's: ``host.fabric()``."""

from __future__ import annotations

from ibtool.model.fabric import Bounds, Fabric, FabricNode, FabricPort, Link, NodeType
from ibtool.views import fabric as view

__all__ = ["Bounds", "Fabric", "FabricNode", "FabricPort", "Link", "NodeType", "view"]

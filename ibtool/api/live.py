"""The Engine and its faces: the Engine polling its Hosts (hosts_for picks them), the TUI's Feed,
the event watch, and the fabric scanned on its own interval (FabricWatch, watch_for). The
exporter is ibtool.api.exporter."""

from __future__ import annotations

from ibtool.live.engine import Engine, Hosts, hosts_for
from ibtool.live.fabric import FabricWatch, watch_for
from ibtool.live.feed import Feed
from ibtool.live.watch import watching

__all__ = ["Engine", "FabricWatch", "Feed", "Hosts", "hosts_for", "watch_for", "watching"]

"""The Engine and its faces: the Engine polling its Hosts (hosts_for picks them), the TUI's Feed
and the event watch. The exporter is ibtool.api.exporter."""

from __future__ import annotations

from ibtool.live.engine import Engine, Hosts, hosts_for
from ibtool.live.feed import Feed
from ibtool.live.watch import watching

__all__ = ["Engine", "Feed", "Hosts", "hosts_for", "watching"]

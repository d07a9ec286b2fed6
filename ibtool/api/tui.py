"""The dashboard (Dashboard) and its loopback screen's defaults (ITERS, SIZE, TIMEOUT)."""

from __future__ import annotations

from ibtool.tui.app import Dashboard
from ibtool.tui.screens.loopback import ITERS, SIZE, TIMEOUT

__all__ = ["ITERS", "SIZE", "TIMEOUT", "Dashboard"]

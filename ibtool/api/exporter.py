"""`ibtool exporter`: serve the Engine's families over HTTP (serve, poller, its Faults), the
fabric's with --fabric (fabric_watch, FabricSeries), the listen address and request limits it
takes, and the reload of its web config (WebConfigWatcher: exporter-toolkit's
--web.config.file)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ibtool.live.exporter import (
    DEFAULT_PORT,
    FABRIC_INTERVAL,
    FABRIC_INTERVAL_MAX,
    FABRIC_INTERVAL_MIN,
    FABRIC_MADS,
    FABRIC_MADS_MAX,
    FABRIC_MADS_MIN,
    MAX_REQUESTS,
    MAX_REQUESTS_MAX,
    FabricSeries,
    Faults,
    fabric_watch,
    parse_listen,
    poller,
    serve,
)

if TYPE_CHECKING:
    from ibtool.web.config import Watcher as WebConfigWatcher

__all__ = [
    "DEFAULT_PORT",
    "FABRIC_INTERVAL",
    "FABRIC_INTERVAL_MAX",
    "FABRIC_INTERVAL_MIN",
    "FABRIC_MADS",
    "FABRIC_MADS_MAX",
    "FABRIC_MADS_MIN",
    "MAX_REQUESTS",
    "MAX_REQUESTS_MAX",
    "FabricSeries",
    "Faults",
    "WebConfigWatcher",
    "fabric_watch",
    "parse_listen",
    "poller",
    "serve",
]


def __getattr__(name: str) -> Any:
    # The web configuration's reader (YAML, TLS, bcrypt) is loaded only by an exporter that is
    # given --web.config.file: the exporter's options are declared on every start.
    if name == "WebConfigWatcher":
        from ibtool.web.config import Watcher

        return Watcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""`ibtool exporter`: serve the Engine's families over HTTP (serve, poller, its Faults), the
listen address and request limits it takes, and the reload of its web config (WebConfigWatcher:
exporter-toolkit's --web.config.file)."""

from __future__ import annotations

from ibtool.live.exporter import (
    DEFAULT_PORT,
    MAX_REQUESTS,
    MAX_REQUESTS_MAX,
    Faults,
    parse_listen,
    poller,
    serve,
)
from ibtool.web.config import Watcher as WebConfigWatcher

__all__ = [
    "DEFAULT_PORT",
    "MAX_REQUESTS",
    "MAX_REQUESTS_MAX",
    "Faults",
    "WebConfigWatcher",
    "parse_listen",
    "poller",
    "serve",
]

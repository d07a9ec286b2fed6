"""The metric families of every plugin's collectors, and the node_exporter textfile they go to.

node_exporter's textfile collector reads every *.prom file of its directory at each scrape: the
file is written under another name in the same directory and renamed over the old one, so a
scrape never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable

from ibtool.errors import IbtoolError, PermissionDeniedError, UsageError
from ibtool.views.prometheus import MetricFamily, exposition


def collected(plugins, host, warn: Callable[[str], None]) -> list[MetricFamily]:
    """What the ibtool_metrics collectors of `plugins` give for `host`."""
    from ibtool.plugin.hooks import collect_metrics, metric_collectors

    return collect_metrics(metric_collectors(plugins, warn), host, warn)


def write_textfile(path: str, families: Iterable[MetricFamily]) -> None:
    """`families` in the text format at `path`, atomically (temporary file + rename)."""
    check_path(path)
    write_text(path, exposition(families))


def check_path(path: str) -> None:
    """A --textfile's name, refused before any work if node_exporter would not read it."""
    if not path.endswith(".prom"):
        raise UsageError(
            f"--textfile {path}: node_exporter reads only files named *.prom",
            "e.g. --textfile /var/lib/node_exporter/textfile_collector/ibtool.prom",
        )


def write_text(path: str, text: str) -> None:
    """`text` (an exposition) at `path`, atomically (temporary file + rename)."""
    check_path(path)
    directory = os.path.dirname(path) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ibtool.", suffix=".prom.tmp", dir=directory)
    except OSError as e:
        raise _error(e, path) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _error(e, path) from None
        raise


def _error(e: OSError, path: str) -> IbtoolError:
    if isinstance(e, PermissionError):
        return PermissionDeniedError(f"--textfile {path}: {e.strerror}")
    return IbtoolError(f"--textfile {path}: {e.strerror}")

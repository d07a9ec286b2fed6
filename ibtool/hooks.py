"""The registering hooks of ibtool.hookspecs, called for the faces that use them, and the runs of
what they register: health checks and metric collectors.

One plugin's fault costs that plugin only. A hook implementation that raises, or registers a
bad name, a name already taken or something not callable, is one warning, and none of what it
registered is kept; a check that fails is an UNKNOWN result; a metric collector that fails is a
warning and contributes nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ibtool.api import (
    CheckContext,
    HealthCheck,
    HealthResult,
    MetricCollector,
    MetricFamily,
    PanelFactory,
    Status,
)
from ibtool.errors import IbtoolError

if TYPE_CHECKING:
    from ibtool.host import Host
    from ibtool.plugins import Plugins

Warn = Callable[[str], None]
_NAME = re.compile(r"\S+")


class _Register:
    """The `register` one plugin's hook implementation is given: keeps what it registers apart
    until the implementation has returned without error."""

    def __init__(self, what: str, plugin: str, taken: Mapping[str, str]) -> None:
        self.what, self.plugin, self.taken = what, plugin, taken
        self.entries: dict[str, Callable[..., Any]] = {}

    def __call__(self, name: str, function: Callable[..., Any]) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{self.what} name must be a non-empty str without spaces: {name!r}")
        if not callable(function):
            raise ValueError(f"{self.what} {name} is not callable: {type(function).__name__}")
        owner = self.plugin if name in self.entries else self.taken.get(name)
        if owner is not None:
            raise ValueError(f"{self.what} {name} already registered by plugin {owner}")
        self.entries[name] = function


def _collect(plugins: Plugins, hook: str, what: str, warn: Warn) -> dict[str, Any]:
    """name -> what the plugins registered through `hook`, in name order. The implementations
    are called in pluggy's order, the plugin registered last first, as the CLI registers
    commands: of two plugins registering one name, the one registered last keeps it."""
    owners: dict[str, str] = {}
    found: dict[str, Callable[..., Any]] = {}
    for impl in reversed(getattr(plugins.hook, hook).get_hookimpls()):
        register = _Register(what, impl.plugin_name, owners)
        try:
            impl.function(register=register)
        except Exception as e:  # a third-party plugin may fail in any way; the others go on
            warn(f"plugin {impl.plugin_name} failed to register {what}s: {type(e).__name__}: {e}")
            continue
        owners.update(dict.fromkeys(register.entries, impl.plugin_name))
        found.update(register.entries)
    return {name: found[name] for name in sorted(found)}


def health_checks(plugins: Plugins, warn: Warn) -> dict[str, HealthCheck]:
    """The checks of the ibtool_health_checks hook, by name."""
    return _collect(plugins, "ibtool_health_checks", "health check", warn)


def metric_collectors(plugins: Plugins, warn: Warn) -> dict[str, MetricCollector]:
    """The collectors of the ibtool_metrics hook, by name."""
    return _collect(plugins, "ibtool_metrics", "metric collector", warn)


def panel_factories(plugins: Plugins, warn: Warn) -> dict[str, PanelFactory]:
    """The panel factories of the ibtool_tui_panels hook, by name. None is called here: the
    dashboard calls each with the one Feed it shares between them."""
    return _collect(plugins, "ibtool_tui_panels", "panel", warn)


def _error(e: Exception) -> str:
    """An exception as one line: an IbtoolError's message, any other's type and message."""
    if isinstance(e, IbtoolError):
        text = e.message
    else:
        text = f"{type(e).__name__}: {e}" if str(e) else ""
    return " ".join(text.split()) or type(e).__name__


def _call(function: Callable[[Any], object], argument: object) -> object:
    """What `function(argument)` returned; an iterator (a generator function's) as a list, so
    that its faults are raised here."""
    returned = function(argument)
    return list(returned) if isinstance(returned, Iterator) else returned


def _wrong(returned: object, kind: type) -> str | None:
    """What is wrong with a list, tuple or iterator of `kind` that a plugin returned, or None."""
    if not isinstance(returned, (list, tuple)):
        return f"returned {type(returned).__name__}, not a list of ibtool.api.{kind.__name__}"
    bad = [item for item in returned if not isinstance(item, kind)]
    if bad:
        return f"returned {type(bad[0]).__name__}, not ibtool.api.{kind.__name__}"
    return None


def run_health_checks(
    checks: Mapping[str, HealthCheck], context: Callable[[str], CheckContext]
) -> list[HealthResult]:
    """Every check's results, in check order, each with `check` set to its check's name.
    `context(name)` gives each check its CheckContext.

    A check that raises gives one UNKNOWN result instead, whose summary is the exception's
    type and message (an IbtoolError's message only; never a traceback), and so does a check
    that returns anything but a list, tuple or iterator of HealthResult.
    """
    results: list[HealthResult] = []
    for name, check in checks.items():
        try:
            returned = _call(check, context(name))
        except Exception as e:  # any fault of a plugin is its check's UNKNOWN, not ibtool's
            fault: str | None = _error(e)
        else:
            wrong = _wrong(returned, HealthResult)
            fault = None if wrong is None else f"the check {wrong}"
        if fault is not None:
            returned = [HealthResult(Status.UNKNOWN, "", fault)]
        results += [dataclasses.replace(r, check=name) for r in returned]
    return results


def collect_metrics(
    collectors: Mapping[str, MetricCollector], host: Host, warn: Warn
) -> list[MetricFamily]:
    """Every collector's families, in collector order.

    A collector that raises, or returns anything but a list, tuple or iterator of MetricFamily,
    is one warning and contributes nothing; a family whose exposed name an earlier family has
    is a warning and is left out (the text format allows each name once).
    """
    families: list[MetricFamily] = []
    owners: dict[str, str] = {}
    for name, collect in collectors.items():
        try:
            returned = _call(collect, host)
        except Exception as e:
            warn(f"metric collector {name} failed: {_error(e)}")
            continue
        wrong = _wrong(returned, MetricFamily)
        if wrong is not None:
            warn(f"metric collector {name} {wrong}")
            continue
        for family in returned:
            owner = owners.get(family.exposed_name)
            if owner is not None:
                warn(f"metric collector {name}: {family.exposed_name} already collected by {owner}")
                continue
            owners[family.exposed_name] = name
            families.append(family)
    return families

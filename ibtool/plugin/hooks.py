"""The registering hooks of ibtool.plugin.hookspecs, called for the faces that use them, and the
runs of what they register: health checks and metric collectors.

One plugin's fault costs that plugin only. A hook implementation that raises (SystemExit too),
or registers a bad name, a name twice or something not callable, is one warning, and none of
what it registered is kept; a check that fails is an UNKNOWN result; a metric collector that
fails is a warning and contributes nothing. A name another plugin has stays with ibtool's own
plugin, else with the first loaded: the other is named in one warning and keeps the rest.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ibtool.errors import IbtoolError
from ibtool.model.health import HealthResult, Status
from ibtool.plugin.context import CheckContext, HealthCheck, MetricCollector, PanelFactory
from ibtool.views.prometheus import MetricFamily

if TYPE_CHECKING:
    from ibtool.host import Host
    from ibtool.plugin.manager import Plugins

Warn = Callable[[str], None]
_NAME = re.compile(r"\S+")


class _Register:
    """The `register` one plugin's hook implementation is given: keeps what it registers apart
    until the implementation has returned without error."""

    def __init__(self, what: str, plugin: str) -> None:
        self.what, self.plugin = what, plugin
        self.entries: dict[str, Callable[..., Any]] = {}

    def __call__(self, name: str, function: Callable[..., Any]) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{self.what} name must be a non-empty str without spaces: {name!r}")
        if not callable(function):
            raise ValueError(f"{self.what} {name} is not callable: {type(function).__name__}")
        if name in self.entries:
            raise ValueError(f"{self.what} {name} already registered by plugin {self.plugin}")
        self.entries[name] = function


class Registered(dict):
    """name -> what the plugins registered through one hook, in name order; `plugin` says
    whose each is, `first` lists them by precedence (ibtool's own, then load order), and
    `owner(plugin)` is how a warning names a plugin that kept a name."""

    def __init__(
        self, found: Mapping[str, Any], plugin: Mapping[str, str], owner: Callable[[str], str]
    ) -> None:
        super().__init__((name, found[name]) for name in sorted(found))
        self.plugin = dict(plugin)
        self.first = list(found)
        self.owner = owner


def _collect(plugins: Plugins, hook: str, what: str, warn: Warn) -> Registered:
    """What the plugins registered through `hook`. A name stays with ibtool's own plugin, else
    with the first loaded (Plugins.hookimpls); the other is named in one warning and keeps the
    rest of what it registered."""
    from ibtool.plugin.manager import fault

    owners: dict[str, str] = {}
    found: dict[str, Callable[..., Any]] = {}
    for impl in plugins.hookimpls(hook):
        register = _Register(what, impl.plugin_name)
        try:
            impl.function(register=register)
        except KeyboardInterrupt:  # the user's Ctrl-C (or SIGTERM: Terminated)
            raise
        except BaseException as e:  # a third-party plugin may fail in any way, sys.exit too
            warn(f"plugin {impl.plugin_name} failed to register {what}s: {fault(e)}")
            continue
        for name, function in register.entries.items():
            if name in owners:
                warn(
                    f"plugin {impl.plugin_name}: {what} {name!r} is "
                    f"{plugins.owner(owners[name])}: {impl.plugin_name}'s is not registered"
                )
                continue
            owners[name] = impl.plugin_name
            found[name] = function
    return Registered(found, owners, plugins.owner)


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


def _error(e: BaseException) -> str:
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
        except KeyboardInterrupt:  # the user's Ctrl-C (or SIGTERM: Terminated)
            raise
        except BaseException as e:  # any fault of a plugin, sys.exit too, is its check's UNKNOWN
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
    is one warning and contributes nothing. The text format allows each exposed name once: of
    two families with one name, the one of ibtool's own plugins is kept, else the first loaded
    plugin's (`collectors` as metric_collectors gives them; other mappings: the first
    collector's), and the other is one warning and left out.
    """
    returned_by: dict[str, list[MetricFamily]] = {}
    for name, collect in collectors.items():
        try:
            returned = _call(collect, host)
        except KeyboardInterrupt:  # the user's Ctrl-C (or SIGTERM: Terminated)
            raise
        except BaseException as e:  # a plugin's fault, sys.exit too, is its collector's
            warn(f"metric collector {name} failed: {_error(e)}")
            continue
        wrong = _wrong(returned, MetricFamily)
        if wrong is not None:
            warn(f"metric collector {name} {wrong}")
            continue
        returned_by[name] = list(returned)
    plugin: Mapping[str, str] = getattr(collectors, "plugin", {})
    first = [n for n in getattr(collectors, "first", collectors) if n in returned_by]
    owners: dict[str, str] = {}
    kept: set[tuple[str, int]] = set()
    for name in first:
        for i, family in enumerate(returned_by[name]):
            owner = owners.get(family.exposed_name)
            if owner is None:
                owners[family.exposed_name] = name
                kept.add((name, i))
            elif name in plugin and owner in plugin and plugin[name] != plugin[owner]:
                mine, theirs = plugin[name], collectors.owner(plugin[owner])  # type: ignore[attr-defined]
                warn(
                    f"plugin {mine}: metric family {family.exposed_name!r} is {theirs}: "
                    f"{mine}'s is left out"
                )
            else:
                warn(f"metric collector {name}: {family.exposed_name} already collected by {owner}")
    return [
        family
        for name, families in returned_by.items()
        for i, family in enumerate(families)
        if (name, i) in kept
    ]

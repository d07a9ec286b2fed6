"""Plugin manager factory: entry points, blocking (-p no:NAME), IBTOOL_* environment.

Built by ``cli.main()`` for each invocation, never at import time, so tests build their own
managers without reloading modules.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata

import pluggy

from ibtool import hookspecs
from ibtool.errors import UsageError

GROUP = "ibtool"
# The foundation commands; blocking them would leave no tool to speak of.
ESSENTIAL = frozenset({"devices", "ports", "gids"})
ENV_DISABLE_AUTOLOAD = "IBTOOL_DISABLE_PLUGIN_AUTOLOAD"
ENV_PLUGINS = "IBTOOL_PLUGINS"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]
    essential: bool


def _entry_points() -> Iterator[tuple[metadata.EntryPoint, metadata.Distribution]]:
    """Group GROUP's entry points with the distribution of each. Walked per distribution because
    `EntryPoint.dist` and `entry_points(group=)` are Python 3.10+; a distribution found twice on
    sys.path counts once, the first (as `entry_points()` does on 3.10+)."""
    seen = set()
    for dist in metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if name in seen:
            continue
        seen.add(name)
        for ep in dist.entry_points:
            if ep.group == GROUP:
                yield ep, dist


def _is_first_party(dist: metadata.Distribution) -> bool:
    return dist.metadata["Name"] == "ibtool"


class Plugins:
    """A plugin manager plus the distribution each entry-point plugin came from."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.dists: dict[str, metadata.Distribution] = {}

    @property
    def hook(self):
        return self.pm.hook

    def register(self, name: str | None, load: Callable[[], object], warn, dist=None) -> None:
        plugin = None
        try:
            plugin = load()
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as e:  # a third-party plugin may fail in any way; the tool goes on
            if plugin is not None and self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            warn(f"plugin {name or '?'} not loaded: {type(e).__name__}: {e}")
            return
        if dist is not None:
            self.dists[self.pm.get_name(plugin)] = dist

    def describe(self) -> list[PluginInfo]:
        infos = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:  # blocked
                continue
            dist = self.dists.get(name)
            hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
            infos.append(
                PluginInfo(
                    name=name,
                    distribution=dist.metadata["Name"] if dist else None,
                    version=dist.version if dist else None,
                    hooks=hooks,
                    essential=name in ESSENTIAL,
                )
            )
        return sorted(infos, key=lambda i: i.name)


def build_plugins(
    blocked: Iterable[str] = (),
    extra: Iterable[object] = (),
    warn: Callable[[str], None] = lambda message: None,
    environ: Mapping[str, str] | None = None,
) -> Plugins:
    env = os.environ if environ is None else environ
    plugins = Plugins()
    pm = plugins.pm
    for name in blocked:
        if name in ESSENTIAL:
            raise UsageError(
                f"plugin {name!r} is essential and cannot be blocked",
                "see `ibtool plugins` for the plugins that can",
            )
        pm.set_blocked(name)

    autoload = not env.get(ENV_DISABLE_AUTOLOAD)
    for ep, dist in _entry_points():
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        if not autoload and not _is_first_party(dist):
            continue
        plugins.register(ep.name, ep.load, warn, dist=dist)

    for module in filter(None, (s.strip() for s in env.get(ENV_PLUGINS, "").split(","))):
        if not pm.is_blocked(module):
            plugins.register(module, lambda m=module: importlib.import_module(m), warn)

    for plugin in extra:
        plugins.register(getattr(plugin, "__name__", None), lambda p=plugin: p, warn)
    return plugins

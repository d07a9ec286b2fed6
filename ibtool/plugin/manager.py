"""Plugin manager factory: ibtool's own plugins by name, others by entry point, blocking
(-p no:NAME), IBTOOL_* environment.

ibtool's own plugins are registered by name, as pytest registers its own (``default_plugins``
in pytest's ``_pytest/config/__init__.py``): they are the modules of the package
``ibtool_plugins``, which is plugins/ in a clone and needs no installing, so a checkout runs as
``PYTHONPATH=. python3 -m ibtool``. Third-party plugins come from the ``ibtool`` entry-point
group. Built by ``cli.main()`` for each invocation, never at import time, so tests build their
own managers without reloading modules.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from types import FunctionType, ModuleType
from typing import Any

import pluggy

from ibtool.errors import IbtoolError, UsageError
from ibtool.model.deferred import dataclass
from ibtool.plugin import hookspecs
from ibtool.plugin.found import DISTRIBUTION, GROUP, find

MARK = GROUP + "_impl"  # the attribute pluggy's HookimplMarker(GROUP) sets on what it marks
# The foundation commands; blocking them would leave no tool to speak of.
ESSENTIAL = frozenset({"devices", "ports", "gids"})
ENV_DISABLE_AUTOLOAD = "IBTOOL_DISABLE_PLUGIN_AUTOLOAD"
ENV_PLUGINS = "IBTOOL_PLUGINS"
# The package of ibtool's own plugins, and the name of what the core registers itself (the
# plugins command): both are built-ins, whose names no other plugin takes.
BUILTIN_PACKAGE = "ibtool_plugins"
CORE = "core"
# ibtool's own plugins, in the order they are registered (the first keeps a name two take).
BUILTIN = (
    "completion",
    "counters",
    "devices",
    "doctor",
    "fabric",
    "gids",
    "health",
    "loopback",
    "mesh",
    "monitor",
    "ping",
    "ports",
    "res",
    "snapshot",
    "system",
    "topo",
    "tui",
)
REINSTALL = (
    "reinstall ibtool (pip install ./ibtool, or the distribution's package); "
    "from a clone, run it as PYTHONPATH=<the clone> python3 -m ibtool"
)


@dataclass(frozen=True)
class PluginInfo:
    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]
    essential: bool


def builtin_package() -> Any:
    """The package of ibtool's own plugins: installed as ibtool_plugins, or plugins/ beside
    this ibtool package in a clone (setuptools installs that folder under the package's name,
    which a checkout on PYTHONPATH does not have)."""
    try:
        return importlib.import_module(BUILTIN_PACKAGE)
    except ModuleNotFoundError as e:
        if e.name != BUILTIN_PACKAGE:
            raise
    from importlib import util

    folder = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), "plugins"
    )
    init = os.path.join(folder, "__init__.py")
    spec = util.spec_from_file_location(BUILTIN_PACKAGE, init, submodule_search_locations=[folder])
    if spec is None or spec.loader is None or not os.path.isfile(init):
        raise IbtoolError(f"ibtool's own plugins ({BUILTIN_PACKAGE}) are not installed", REINSTALL)
    package = util.module_from_spec(spec)
    sys.modules[BUILTIN_PACKAGE] = package
    spec.loader.exec_module(package)
    return package


def _load_builtin(name: str) -> object:
    """Built-in plugin `name`'s module; an IbtoolError saying how to install when it fails
    to import (a broken install, not a plugin's fault the rest of the tool can do without)."""
    builtin_package()
    try:
        return importlib.import_module(f"{BUILTIN_PACKAGE}.{name}")
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        raise IbtoolError(
            f"ibtool's own plugin {name} failed to load: {fault(e)}", REINSTALL
        ) from None


def fault(e: BaseException) -> str:
    """What a plugin raised, as one line: the exception's type, and its message if it has one
    (a pluggy validation error spans lines)."""
    try:
        text = " ".join(str(e).split())
    except Exception:  # a plugin's exception may fail even to say what it is
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _Manager(pluggy.PluginManager):
    def parse_hookimpl_opts(self, plugin: Any, name: str):
        """pluggy's own answer, asked only of a module's functions that carry the hookimpl
        mark: the rest of a module's names (what it imported, its constants, its other
        functions) are no hook implementation, and pluggy's look at each, through
        inspect.getattr_static, was most of the cost of registering ibtool's own plugins.
        Overriding this method is how pluggy's documentation says to change that discovery."""
        if isinstance(plugin, ModuleType):
            value = plugin.__dict__.get(name)
            if isinstance(value, FunctionType):
                if MARK not in value.__dict__:
                    return None
            elif not callable(value) or isinstance(value, type):
                return None  # no routine (pluggy takes none of these either)
        return super().parse_hookimpl_opts(plugin, name)


class Plugins:
    """A plugin manager plus the distribution each entry-point plugin came from, and which
    plugins are ibtool's own."""

    def __init__(self) -> None:
        self.pm = _Manager(GROUP)
        self.pm.add_hookspecs(hookspecs)
        # plugin name -> (its distribution's name, version), for the plugins installed
        self.dists: dict[str, tuple[str, str | None]] = {}
        self._builtins: dict[str, str] = {}  # plugin name -> its module, for ibtool's own

    @property
    def hook(self):
        return self.pm.hook

    def builtin(self, name: str | None) -> str | None:
        """Where built-in plugin `name` comes from (its module, or "core"); None for any other
        plugin. Not a sandbox: a plugin is code run with the user's rights. This keeps a name
        from changing hands unnoticed."""
        if name == CORE:
            return CORE
        return self._builtins.get(name) if name is not None else None

    def owner(self, name: str) -> str:
        """Plugin `name` as a clash's warning names the one that kept a name."""
        origin = self.builtin(name)
        return f"plugin {name}'s, loaded first" if origin is None else f"ibtool's own ({origin})"

    def hookimpls(self, hook: str) -> list[Any]:
        """The implementations of `hook` in the order that decides who keeps a name: ibtool's
        own first, then the others in load order. Not pluggy's call order, which puts the
        plugin registered last first and lets a plugin's tryfirst put it ahead of all."""
        rank = {name: i for i, (name, _) in enumerate(self.pm.list_name_plugin())}
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return sorted(
            impls,
            key=lambda impl: (self.builtin(impl.plugin_name) is None, rank[impl.plugin_name]),
        )

    def register(self, name: str | None, load: Callable[[], object], warn, dist=None) -> None:
        if name is not None and self._taken(name, warn):
            return
        try:
            plugin = load()
        except (KeyboardInterrupt, IbtoolError):  # the user's Ctrl-C; a built-in's failure
            raise
        except BaseException as e:  # SystemExit too: a plugin never decides the exit status
            warn(f"plugin {name or '?'} not loaded: {fault(e)}")
            return
        if plugin is None or self.pm.get_name(plugin) is not None:
            return  # IBTOOL_PLUGINS naming a module loaded already, such as a built-in's
        name = name or self.pm.get_canonical_name(plugin)
        if self._taken(name, warn):
            return
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # pluggy reads the plugin's attributes: its code runs
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            warn(f"plugin {name} not loaded: {fault(e)}")
            return
        module = getattr(plugin, "__name__", None)
        if (dist is not None and dist[0] == DISTRIBUTION) or (
            isinstance(module, str) and module.startswith(BUILTIN_PACKAGE + ".")
        ):
            self._builtins[name] = module if isinstance(module, str) else name
        if dist is not None:
            self.dists[name] = dist

    def _taken(self, name: str, warn) -> bool:
        """Whether `name` is blocked or taken (told in a warning: pluggy's own error would
        print its whole registry). The core's name is ibtool's own."""
        if self.pm.is_blocked(name):
            return True
        if name == CORE or self.pm.has_plugin(name):
            where = CORE if name == CORE else getattr(self.pm.get_plugin(name), "__name__", name)
            if where != name:  # else the module of that name, named twice: loaded already
                warn(f"plugin {name} not loaded: a plugin of that name is loaded already ({where})")
            return True
        return False

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
                    distribution=dist[0] if dist else None,
                    version=dist[1] if dist else None,
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

    # ibtool's own first, then the others by name: which of two plugins is loaded first, and so
    # keeps a name both register, is the same on every host, whatever the order of sys.path and
    # of the files in its directories (importlib.metadata lists them as the file system does).
    blocked_modules = set()
    found = find(env)
    own = found.own
    for name in BUILTIN:
        if pm.is_blocked(name):
            blocked_modules.add(f"{BUILTIN_PACKAGE}.{name}")
            continue
        plugins.register(name, lambda n=name: _load_builtin(n), warn, dist=own)
    if not env.get(ENV_DISABLE_AUTOLOAD):
        for ep in sorted(found.offered, key=lambda e: e.name):
            if ep.distribution == DISTRIBUTION:
                continue  # an install from before the built-ins were registered by name
            if pm.is_blocked(ep.name):
                blocked_modules.add(ep.module)
                continue
            plugins.register(ep.name, ep.load, warn, dist=(ep.distribution, ep.version))

    for module in filter(None, (s.strip() for s in env.get(ENV_PLUGINS, "").split(","))):
        # -p no:NAME wins over the environment, also when IBTOOL_PLUGINS names NAME's module
        if module not in blocked_modules:
            plugins.register(module, lambda m=module: importlib.import_module(m), warn)

    for plugin in extra:
        plugins.register(getattr(plugin, "__name__", None), lambda p=plugin: p, warn)
    return plugins

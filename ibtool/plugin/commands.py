"""What a plugin's command sees: the registry it adds itself to, and one invocation's context."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import field
from typing import Any, TextIO

from ibtool.model.deferred import dataclass
from ibtool.model.names import escaped
from ibtool.views import render

Run = Callable[["Invocation"], "int | None"]
Configure = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Command:
    name: str
    run: Run
    help: str
    configure: Configure | None = None
    aliases: tuple[str, ...] = ()
    plugin: str | None = None


class CommandRegistry:
    """Passed to the ibtool_register_commands hook.

    A name (a command's or an alias) stays with whoever has it: a built-in's (ibtool's own
    plugins and the core: `builtin(plugin)` says where one comes from, None for any other)
    against any other plugin, whenever that one registers, else the first plugin's. The one that
    does not keep it is named in one warning; its other commands, and the command of a lost
    alias, are registered. A plugin that repeats a name of its own is a ValueError.
    """

    def __init__(
        self,
        warn: Callable[[str], None] = lambda message: None,
        builtin: Callable[[str], str | None] = lambda plugin: "core" if plugin == "core" else None,
    ) -> None:
        self.commands: dict[str, Command] = {}
        self._names: dict[str, Command] = {}  # a command's name and aliases -> the command
        self.current_plugin: str | None = None
        self.warn = warn
        self.builtin = builtin

    def add(
        self,
        name: str,
        run: Run,
        *,
        help: str,
        configure: Configure | None = None,
        aliases: tuple[str, ...] = (),
    ) -> None:
        plugin = self.current_plugin or "?"
        names = (name, *aliases)
        for i, n in enumerate(names):
            if n in names[:i] or (n in self._names and self._names[n].plugin == plugin):
                raise ValueError(f"command {n!r} already registered by plugin {plugin}")
        if not self._keeps(plugin, name):
            owner = self._owner(name)
            self.warn(f"plugin {plugin}: command {name!r} is {owner}: {plugin}'s is not registered")
            return
        kept = []
        for alias in aliases:
            if self._keeps(plugin, alias):
                kept.append(alias)
            else:
                self.warn(
                    f"plugin {plugin}: command {alias!r} is {self._owner(alias)}: {plugin}'s "
                    f"command {name!r} is registered without that alias"
                )
        command = Command(name, run, help, configure, tuple(kept), plugin)
        for n in (name, *kept):
            if n in self._names:
                self._give_up(self._names[n], n, plugin)
            self._names[n] = command
        self.commands[name] = command

    def names(self) -> list[str]:
        """Every command's name and alias."""
        return list(self._names)

    def withdraw(self, plugin: str) -> None:
        """Forget what `plugin` registered: its hook implementation failed half way."""
        for command in [c for c in self.commands.values() if c.plugin == plugin]:
            self.remove(command.name)

    def remove(self, name: str) -> None:
        """Forget command `name` and its aliases."""
        command = self.commands.pop(name)
        for n in (command.name, *command.aliases):
            del self._names[n]

    def _keeps(self, plugin: str, name: str) -> bool:
        """Whether `plugin` gets `name`: free, or held by another plugin while `plugin` is
        ibtool's own and the holder is not."""
        holder = self._names.get(name)
        if holder is None:
            return True
        return self.builtin(plugin) is not None and self.builtin(holder.plugin or "?") is None

    def _owner(self, name: str) -> str:
        holder = self._names[name].plugin or "?"
        origin = self.builtin(holder)
        return f"plugin {holder}'s, loaded first" if origin is None else f"ibtool's own ({origin})"

    def _give_up(self, held: Command, name: str, to: str) -> None:
        """`held`, another plugin's command, gives `name` to built-in plugin `to`."""
        plugin = held.plugin or "?"
        taken = f"plugin {plugin}: command {name!r} is ibtool's own ({self.builtin(to)}):"
        if name == held.name:
            self.warn(f"{taken} {plugin}'s is not registered")
            del self.commands[held.name]
            for n in held.aliases:
                del self._names[n]
            return
        self.warn(f"{taken} {plugin}'s command {held.name!r} is registered without that alias")
        kept = dataclasses.replace(held, aliases=tuple(a for a in held.aliases if a != name))
        self.commands[held.name] = kept
        for n in (kept.name, *kept.aliases):
            self._names[n] = kept


HostFactory = Callable[["Invocation"], Any]


class Opened:
    """A host opened for a poll or a command: `host`, and `close()` ending what it holds (a
    snapshot's tree with it)."""

    def __init__(self, host, close: Callable[[], None]) -> None:
        self.host, self.close = host, close


def open_host(
    inv: Invocation, warn: Callable[[str], None] | None = None, details: bool | None = None
) -> Opened:
    """The one place that decides where a host comes from: the snapshot file `inv` names
    (--snapshot), else its host factory (the running host, a --root tree, a test's fixture).
    `warn` and `details` default to the invocation's."""
    warn = inv.warn if warn is None else warn
    details = inv.details if details is None else details
    if inv.snapshot is not None:
        from ibtool.snapshot.save import SnapshotHost

        capture = SnapshotHost(inv.snapshot, warn, details, **inv.snapshot_kwargs())
        return Opened(capture.host, capture.close)
    if warn is not inv.warn or details != inv.details:
        inv = dataclasses.replace(inv, warn=warn, details=details)
    host = inv.host_factory(inv)
    return Opened(host, host.close)


def default_host(inv: Invocation):
    """The host `inv` names by its options: the running one, or a --root tree."""
    from ibtool.host import Host

    return Host(root=inv.root, warn=inv.warn, details=inv.details)


@dataclass
class Invocation:
    args: argparse.Namespace
    json: bool = False
    pretty: bool = False
    details: bool = False
    root: str = "/"
    snapshot: str | None = None  # a snapshot file read instead of the host
    snapshot_limits: Any = None  # snaplimits.Limits given by --snapshot-limit, else the defaults
    out: TextIO = field(default_factory=lambda: sys.stdout)
    warn: Callable[[str], None] = lambda message: None
    plugins: Any = None
    # What builds the host a command reads when no --snapshot is given, from this invocation
    # (its root, warn, details); called once, on first use. Tests give a Host of their own.
    host_factory: HostFactory = default_host
    # The parser the arguments were parsed with: the command run, with its options, or every
    # command's and alias's, with the options of each.
    parser: argparse.ArgumentParser | None = None
    # What builds the parser of every command and alias, with the options of each, where
    # `parser` holds only the command run (`ibtool completion` writes the shells' completion
    # from it); None: `parser` is that parser.
    whole_parser: Callable[[], argparse.ArgumentParser] | None = None

    _opened: Any = field(default=None, init=False, repr=False)

    @property
    def host(self):
        """The facade over the host's sources (or a snapshot's), built on first use."""
        if self._opened is None:
            self._opened = open_host(self)
        return self._opened.host

    def snapshot_kwargs(self) -> dict[str, Any]:
        """What SnapshotHost takes of the command line, for every snapshot a command reads."""
        return {} if self.snapshot_limits is None else {"limits": self.snapshot_limits}

    def close(self) -> None:
        """Ends what the run opened (the host's netlink session, a snapshot's replay)."""
        if self._opened is not None:
            self._opened.close()

    def emit_json(self, data: Any) -> None:
        render.dump_json(data, self.out, self.pretty)

    def print(self, line: str = "", *, sgr: bool = False) -> None:
        """One line of text on stdout. Whatever a line holds that a terminal would obey (ESC,
        BEL, CR, a newline that would forge a line of its own, U+202E) is written as its
        escape; `sgr` keeps the colour sequences (ESC [ ... m) a view wrote itself."""
        if not line.isprintable():
            line = _terminal_safe(line, sgr)
        self.out.write(line + "\n")


_SGR = re.compile(r"(\x1b\[[0-9;]*m)")


def _terminal_safe(line: str, sgr: bool) -> str:
    if not sgr:
        return escaped(line)
    return "".join(p if i % 2 else escaped(p) for i, p in enumerate(_SGR.split(line)))


def add_selector(parser: argparse.ArgumentParser) -> None:
    """The `[show] [DEV[/PORT]]` words every object command takes."""
    parser.add_argument("words", nargs="*", metavar="[show] [DEV[/PORT]]")


def selector(args: argparse.Namespace) -> str | None:
    from ibtool.errors import UsageError

    words = list(args.words)
    if words and words[0] == "show":
        words.pop(0)
    if len(words) > 1:
        raise UsageError(
            f"unexpected arguments: {' '.join(words[1:])}", "give at most one DEV or DEV/PORT"
        )
    return words[0] if words else None

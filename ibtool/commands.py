"""What a plugin's command sees: the registry it adds itself to, and one invocation's context."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from ibtool import render

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
    """Passed to the ibtool_register_commands hook."""

    def __init__(self) -> None:
        self.commands: dict[str, Command] = {}
        self._names: dict[str, str] = {}
        self.current_plugin: str | None = None

    def add(
        self,
        name: str,
        run: Run,
        *,
        help: str,
        configure: Configure | None = None,
        aliases: tuple[str, ...] = (),
    ) -> None:
        for n in (name, *aliases):
            if n in self._names:
                raise ValueError(f"command {n!r} already registered by {self._names[n]}")
        command = Command(name, run, help, configure, tuple(aliases), self.current_plugin)
        self.commands[name] = command
        for n in (name, *aliases):
            self._names[n] = self.current_plugin or "?"


@dataclass
class Invocation:
    args: argparse.Namespace
    json: bool = False
    pretty: bool = False
    details: bool = False
    root: str = "/"
    snapshot: str | None = None  # a snapshot file read instead of the host
    out: TextIO = field(default_factory=lambda: sys.stdout)
    warn: Callable[[str], None] = lambda message: None
    plugins: Any = None
    _host: Any = None

    _snapshot: Any = None

    @property
    def host(self):
        """The facade over the host's sources (or a snapshot's), built on first use."""
        if self._host is None:
            if self.snapshot is not None:
                from ibtool.snapshot import SnapshotHost

                self._snapshot = SnapshotHost(self.snapshot, self.warn, self.details)
                self._host = self._snapshot.host
            else:
                from ibtool.host import Host

                self._host = Host(root=self.root, warn=self.warn, details=self.details)
        return self._host

    def close(self) -> None:
        """Ends what the run opened (the host's netlink session, a snapshot's tree)."""
        if self._snapshot is not None:
            self._snapshot.close()
        elif self._host is not None:
            self._host.close()

    def emit_json(self, data: Any) -> None:
        render.dump_json(data, self.out, self.pretty)

    def print(self, line: str = "") -> None:
        self.out.write(line + "\n")


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

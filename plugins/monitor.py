"""`ibtool monitor`: RDMA devices and ports as they change, one line (or JSON object) per event.

The events, and how they are seen (the kernel's monitor events where it sends them, polling
netlink or sysfs for the rest), are the core's: ibtool.changes and ibtool.watch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ibtool import hookimpl
from ibtool.commands import Invocation

if TYPE_CHECKING:
    from ibtool.changes import Event

DEFAULT_INTERVAL = 1.0


# -- the command ----------------------------------------------------------------------------------


class _Enough(Exception):
    """--count events have been shown."""


def _positive(kind: type, what: str) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, not {text!r}") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{what} must be above 0, not {text}")
        return value

    return parse


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=_positive(float, "--interval"),
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"poll every SECONDS (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument(
        "--count", type=_positive(int, "--count"), metavar="N", help="stop after N events"
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float, "--timeout"),
        metavar="SECONDS",
        help="stop after SECONDS",
    )


def run(inv: Invocation) -> None:
    from ibtool.changes import event_json, event_line
    from ibtool.watch import watching

    args = inv.args
    deadline = time.monotonic() + args.timeout if args.timeout else math.inf
    shown = 0

    def emit(event: Event) -> None:
        nonlocal shown
        event = dataclasses.replace(event, time=_timestamp())
        if inv.json:
            inv.emit_json(event_json(event))
        else:
            inv.print(event_line(event))
        inv.out.flush()
        shown += 1
        if args.count is not None and shown >= args.count:
            raise _Enough

    with watching(inv.host, args.interval) as watch:
        if watch.note:
            inv.warn(watch.note)
        try:
            for event in watch.events(deadline):
                emit(event)
        except _Enough:
            pass


def _timestamp() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "monitor",
        run,
        help="RDMA device, port and netdev changes as they happen, one line per event",
        configure=_configure,
    )

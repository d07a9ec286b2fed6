"""`ibtool monitor`: RDMA devices and ports as they change, one line (or JSON object) per event.

The events, and how they are seen (the kernel's monitor events where it sends them, polling
netlink or sysfs for the rest), are the core's: ibtool.model.events and ibtool.live.watch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from typing import TYPE_CHECKING

from ibtool.api import Invocation, UsageError, hookimpl, number

if TYPE_CHECKING:
    from ibtool.api.events import Event

DEFAULT_INTERVAL = 1.0


# -- the command ----------------------------------------------------------------------------------


class _Enough(Exception):
    """--count events have been shown."""


# Polls closer than a millisecond are a busy loop, not a watch; a day apart is as rare as a
# poll is useful. --timeout and --count as far as ping(8)'s -w and rc_pingpong's -n go: iputils
# keeps a time in milliseconds in a C int (ping/ping.c: "bad timing interval" above
# INT_MAX / 1000 s), ibv_rc_pingpong its count in a C int.
INTERVAL = (0.001, 86400.0)
TIMEOUT_MAX = 2147483.0
COUNT_MAX = 2**31 - 1


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=number(float, *INTERVAL, unit="seconds"),
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"poll every SECONDS (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument(
        "--count", type=number(int, 1, COUNT_MAX), metavar="N", help="stop after N events"
    )
    parser.add_argument(
        "--timeout",
        type=number(float, 0, TIMEOUT_MAX, unit="seconds", low_open=True),
        metavar="SECONDS",
        help="stop after SECONDS",
    )


def run(inv: Invocation) -> None:
    from ibtool.api.events import event_json, event_line
    from ibtool.api.live import watching

    args = inv.args
    if inv.snapshot is not None:
        # A snapshot is one moment: polling it would wait forever for a change that cannot
        # come. A --root tree is polled, as something (a test, a copy being updated, another
        # host's sysfs mounted there) may change it.
        raise UsageError(
            "ibtool monitor watches for changes, and a snapshot never changes",
            "ibtool snapshot diff A B shows what changed between two snapshots",
        )
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

    with watching(inv, args.interval) as watch:
        if watch.note:
            inv.warn(watch.note)
        try:
            for event in watch.events(deadline):
                emit(event)
        except _Enough:
            pass


def _timestamp() -> str:
    from datetime import datetime

    return datetime.now().astimezone().isoformat(timespec="milliseconds")


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "monitor",
        run,
        help="RDMA device, port and netdev changes as they happen, one line per event",
        configure=_configure,
    )

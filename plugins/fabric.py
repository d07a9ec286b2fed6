"""`ibtool fabric`: the InfiniBand subnet beyond this host, discovered with MADs through
rdma-core's libibnetdisc: every switch, channel adapter and router, and every link with both
ends, as ibnetdiscover finds them."""

from __future__ import annotations

from ibtool.api import Invocation, UsageError, hookimpl, number

USAGE = "ibtool fabric [--via DEV[/PORT]]"


def _configure(parser) -> None:
    parser.add_argument("words", nargs="*", metavar="", help="(nothing yet: the subnet)")
    parser.add_argument(
        "--via",
        metavar="DEV[/PORT]",
        help="the local InfiniBand port to scan through (default: the first active one)",
    )
    parser.add_argument(
        "--timeout",
        type=number(int, 1, 60000),
        default=200,
        metavar="MS",
        help="each MAD's timeout in milliseconds (default 200)",
    )
    parser.add_argument(
        "--retries",
        type=number(int, 0, 20),
        default=3,
        metavar="N",
        help="retries of a MAD that timed out (default 3)",
    )
    parser.add_argument(
        "--max-smps",
        type=number(int, 1, 64),
        default=2,
        metavar="N",
        help="SMPs outstanding at once (default 2, as ibnetdiscover)",
    )


def run(inv: Invocation) -> None:
    from ibtool.api.fabric import Bounds, view

    if inv.args.words:
        raise UsageError(f"unknown fabric action {inv.args.words[0]!r}", USAGE)
    bounds = Bounds(
        max_smps=inv.args.max_smps, timeout_ms=inv.args.timeout, retries=inv.args.retries
    )
    fabric = inv.host.fabric(inv.args.via, bounds)
    for line in fabric.unanswered:
        inv.warn(line)
    if inv.json:
        inv.emit_json(view.as_json(fabric))
        return
    for line in view.text(fabric):
        inv.print(line)


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "fabric",
        run,
        help="the InfiniBand subnet: its switches, channel adapters, routers and links",
        configure=_configure,
    )

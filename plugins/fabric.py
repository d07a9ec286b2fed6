"""`ibtool fabric`: the InfiniBand subnet beyond this host, discovered with MADs through
rdma-core's libibnetdisc: every switch, channel adapter and router, and every link with both
ends, as ibnetdiscover finds them; `links`: each link against what its ends enable and its
tier's norm."""

from __future__ import annotations

from ibtool.api import Invocation, UsageError, hookimpl, number

USAGE = "ibtool fabric [links] [--via DEV[/PORT]]"
ACTIONS = ("links",)


def _configure(parser) -> None:
    parser.add_argument(
        "words",
        nargs="*",
        metavar="links",
        help="links: each link's width and speed against its ends and its tier's norm "
        "(default: the subnet's nodes and links)",
    )
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


def run(inv: Invocation) -> int:
    from ibtool.api.fabric import Bounds, view

    words = inv.args.words
    if words and (words[0] not in ACTIONS or len(words) > 1):
        bad = words[0] if words[0] not in ACTIONS else " ".join(words[1:])
        raise UsageError(f"unknown fabric action {bad!r}", USAGE)
    bounds = Bounds(
        max_smps=inv.args.max_smps, timeout_ms=inv.args.timeout, retries=inv.args.retries
    )
    fabric = inv.host.fabric(inv.args.via, bounds)
    for line in fabric.unanswered:
        inv.warn(line)
    if words == ["links"]:
        checked = view.links_checked(fabric)
        if inv.json:
            inv.emit_json(view.links_json(fabric, checked))
        else:
            for line in view.links_text(fabric, checked):
                inv.print(line)
        return int(view.links_status(checked[2]))
    if inv.json:
        inv.emit_json(view.as_json(fabric))
        return 0
    for line in view.text(fabric):
        inv.print(line)
    return 0


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "fabric",
        run,
        help="the InfiniBand subnet: its switches, channel adapters, routers and links",
        configure=_configure,
    )

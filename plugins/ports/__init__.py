"""`ibtool port` (alias `link`): state, rate, LIDs and netdev of every RDMA port; and, as
`rdma link add/delete` does, software RDMA devices (rxe, siw) created on a netdev and deleted
(NEWLINK, DELLINK over netlink); the port health check and the port metrics.

- show: `port [show]`, a port's line and its details (-d)
- link: `link add` and `link delete`, their words read and checked
- check: the port health check
- metrics: the port metrics
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibtool.api import Invocation, add_selector, hookimpl

if TYPE_CHECKING:
    from ibtool.api import CheckContext

# Each part is imported where it is used: a command that is not `port` pays for none of them.


def run(inv: Invocation) -> None:
    words = list(inv.args.words)
    if words and words[0] in ("add", "delete"):
        from ibtool_plugins.ports import link

        (link.add if words[0] == "add" else link.delete)(inv.host, words[1:])
        return
    from ibtool_plugins.ports import show

    show.show(inv)


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "port",
        run,
        help="show RDMA ports: state, rate, LIDs, netdev; add or delete rxe/siw links",
        configure=add_selector,
        aliases=("link",),
    )


def check_ports(ctx: CheckContext):
    """Every port ACTIVE with its link up at the rate it should have; an IB port with a LID
    and a subnet manager; a RoCE port with a RoCE v2 GID on its netdev; no carrier flap of
    its netdev since the last run; the configured devices, ports and RoCE netdevs present."""
    from ibtool_plugins.ports import check

    yield from check.run(ctx)


@hookimpl
def ibtool_health_checks(register):
    register("port", check_ports)


@hookimpl
def ibtool_metrics(register):
    from ibtool_plugins.ports import metrics

    register("port", metrics.port_metrics)

"""`ibtool ping HOST` / `ibtool ping --server`: RC ping-pong over RDMA, reported like ping(8);
and the `peers` health check.

- options: the command line, its ranges, and what a run fills in or refuses by the peer
- protocols: each protocol's run (native, rc_pingpong, rping, rdma_cm), either side
- report: the client's pings and their report
- health: the `peers` check
"""

from __future__ import annotations

from ibtool_plugins.ping import options

from ibtool.api import Invocation, hookimpl


def run(inv: Invocation) -> int:
    # The data path's modules are loaded where a ping runs, not where any command starts.
    from ibtool_plugins.ping import protocols

    return protocols.run(inv)


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "ping",
        run,
        configure=options.configure,
        help="RC ping-pong over RDMA with another host or process",
    )


@hookimpl
def ibtool_health_checks(register):
    from ibtool_plugins.ping import health

    register("peers", health.check_peers)

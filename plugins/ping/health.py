"""The `peers` health check (ibtool health --datapath): an RDMA ping to each configured peer."""

from __future__ import annotations

from ibtool.api import IbtoolError, PortState

PEER_PINGS = 3


def _ping_peer(ctx, device: str, port: int, gid_index, peer: str):
    import time

    from ibtool.api import HealthResult, Perfdata, Status
    from ibtool.api.datapath import Ladder, Mode
    from ibtool.api.ping import DEFAULT_PORT, Client, PingStats, run_client

    left = ctx.deadline - time.monotonic()
    if left <= 0:
        budget = f"{ctx.config.datapath_budget:g} s"
        return HealthResult(Status.UNKNOWN, peer, f"not pinged: the {budget} were spent")
    stats, rtts = PingStats(), []
    with Ladder(device, port, gid_index) as ladder:
        client = Client(ladder, peer, DEFAULT_PORT, 64, Mode.SEND, min(2.0, left))
        try:
            run_client(client, PEER_PINGS, 0.0, left, lambda *reply: None, lambda s, e: None,
                            stats, rtts)  # fmt: skip
        finally:
            client.close()
    lost = stats.sent - stats.received
    if not rtts:
        return HealthResult(Status.CRITICAL, peer, f"RDMA ping: {stats.sent} sent, none answered")
    median = sorted(rtts)[len(rtts) // 2]
    rtt = Perfdata(f"{peer} rtt", round(median, 1), "us", min=0)
    summary = (
        f"RDMA ping from {device}/{port}: {stats.received}/{stats.sent}, median {median:.0f} us"
    )
    return HealthResult(Status.WARNING if lost else Status.OK, peer, summary, (rtt,))


def check_peers(ctx):
    """With --datapath only: an RDMA ping (RC SEND, 3 of 64 bytes) to each `[datapath] peers`
    host running `ibtool ping --server`, from the first ACTIVE port, within the budget."""
    from ibtool.api import HealthResult, Status

    if not ctx.datapath or not ctx.config.peers:
        return
    if not ctx.host.live:
        yield HealthResult(Status.UNKNOWN, "", f"peers not pinged: {ctx.host.not_live}")
        return
    try:
        active = [p for p in ctx.host.ports(fields=("state",)) if p.state == PortState.ACTIVE]
        if not active:
            yield HealthResult(Status.CRITICAL, "", "peers not pinged: no ACTIVE RDMA port")
            return
        device, port = active[0].device, active[0].port
        gid_index = ctx.host.roce_gid_index(device, port)
    except IbtoolError as e:
        yield HealthResult(Status.UNKNOWN, "", f"peers not pinged: {e.message}")
        return
    for peer in ctx.config.peers:
        try:
            yield _ping_peer(ctx, device, port, gid_index, peer)
        except IbtoolError as e:
            yield HealthResult(Status.CRITICAL, peer, f"RDMA ping: {e.message}")

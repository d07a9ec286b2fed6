"""The active probe at the end of a doctor run: a few RDMA round trips of each operation the
peer's server answers, along the path the checks looked at (the same port and GID).

Against `ibtool ping --server`: RC SEND and RDMA WRITE WITH IMMEDIATE, each on its own
connection (a QP, a CQ, a buffer), destroyed before the next. Against stock peers
(`--compat rc_pingpong` or `rping`): their one operation. Every QP, CQ and MR a probe builds is
destroyed on every way out, Ctrl-C included (the clients' close() in a finally).
"""

from __future__ import annotations

import statistics

from ibtool.errors import IbtoolError
from ibtool.model.doctor import Finding, Verdict

STOCK_MTU = 3  # ibv_mtu IBV_MTU_1024: ibv_rc_pingpong's default -m


def _finding(what: str, sent: int, got: int, rtts: list[float], losses: list[str]) -> Finding:
    if got and got == sent:
        median = statistics.median(rtts)
        return Finding("probe", Verdict.PASS, f"{what}: {got}/{sent} answered, median "
                       f"{median:.0f} us")  # fmt: skip
    why = f": {losses[-1]}" if losses else ""
    verdict = Verdict.WARN if got else Verdict.FAIL
    return Finding(
        "probe",
        verdict,
        f"{what}: {got}/{sent} answered{why}",
        "the FAIL and WARN lines above name the likely cause; a TCP connection that works "
        "while RDMA does not points at UDP 4791, the MTU or the route",
    )


def _run(client, count: int, deadline: float, what: str) -> Finding:
    from ibtool.rdma.ping.client import PingStats, run_client

    stats, rtts, losses = PingStats(), [], []
    try:
        run_client(client, count, 0.0, deadline, lambda *reply: None,
                   lambda seq, why: losses.append(why), stats, rtts)  # fmt: skip
    except IbtoolError as e:
        losses.append(e.message)
    return _finding(what, max(stats.sent, 1), stats.received, rtts, losses)


def _at_mtu(finding: Finding, mtu: int, small: list[Finding]) -> Finding:
    """The full-payload probe's finding: when it fails where the small ones passed, the path
    carries small packets and drops full ones, which is an MTU on the path (a switch port, a
    netdev, a tunnel) below the ends' active MTU."""
    if (
        finding.verdict == Verdict.PASS
        or not small
        or any(f.verdict != Verdict.PASS for f in small)
    ):
        return finding
    return Finding(
        "probe",
        finding.verdict,
        f"{finding.evidence}: {small[0].evidence.split(':')[0]} passed, so the path drops "
        f"packets of {mtu} bytes of payload that both ends' active MTU allows",
        "find the smaller MTU on the path (the switch ports', any netdev or tunnel between): "
        "raise it, or lower both ends' netdev MTU so that their active MTU is below it",
    )


def probe_native(device: str, port: int, gid_index, peer: str, tcp_port: int, count: int,
                 size: int, timeout: float, tclass: int | None,
                 mtu: int | None = None) -> list[Finding]:  # fmt: skip
    """SEND, then WRITE WITH IMM, `count` round trips of `size` bytes each; then, with `mtu`
    (the path MTU the ends negotiate) above `size`, SEND of `mtu` bytes: one packet of full
    payload each way, which a smaller MTU on the path drops while a small probe passes."""
    from ibtool.rdma import wire
    from ibtool.rdma.ladder import DEFAULT_PATH, Ladder, PathSpec
    from ibtool.rdma.ping.client import Client

    path = DEFAULT_PATH if tclass is None else PathSpec(traffic_class=tclass)
    findings = []
    runs = [(wire.Mode.SEND, "RC SEND", size), (wire.Mode.WRITE_IMM, "RDMA WRITE IMM", size)]
    if mtu is not None and mtu > size:
        runs.append((wire.Mode.SEND, f"RC SEND of {mtu} bytes (the path MTU)", mtu))
    with Ladder(device, port, gid_index) as ladder:
        for mode, what, nbytes in runs:
            try:
                client = Client(ladder, peer, tcp_port, nbytes, mode, timeout, path)
            except IbtoolError as e:
                findings.append(_finding(what, count, 0, [], [e.message]))
                continue
            try:
                findings.append(_run(client, count, timeout * count, what))
            finally:
                client.close()
    if len(runs) == 3:
        findings[2] = _at_mtu(findings[2], mtu, findings[:2])
    return findings


def probe_pingpong(device: str, port: int, gid_index, peer: str, tcp_port: int, count: int,
                   size: int, timeout: float) -> list[Finding]:  # fmt: skip
    """One ibv_rc_pingpong session (the stock server's -n must be `count`, its -s `size`), at
    its default path MTU, 1024 (its -m)."""
    from ibtool.rdma.ladder import Ladder, PathSpec
    from ibtool.rdma.ping.pingpong import PingpongClient

    path = PathSpec(mtu=STOCK_MTU)
    with Ladder(device, port, gid_index) as ladder:
        try:
            client = PingpongClient(ladder, peer, tcp_port, size, timeout, path, count)
        except IbtoolError as e:
            return [_finding("RC SEND (rc_pingpong)", count, 0, [], [e.message])]
        try:
            client.connect()
            return [_run(client, count, timeout * count, "RC SEND (rc_pingpong)")]
        except IbtoolError as e:
            return [_finding("RC SEND (rc_pingpong)", count, 0, [], [e.message])]
        finally:
            client.close()


def probe_rping(peer: str, tcp_port: int, count: int, size: int,
                timeout: float) -> list[Finding]:  # fmt: skip
    """An rping session over rdma_cm (SEND and RDMA READ/WRITE, rping's own exchange)."""
    from ibtool.rdma.ping import rping

    what = "rdma_cm SEND/READ/WRITE (rping)"
    try:
        client = rping.Client(peer, tcp_port, size, timeout)
    except IbtoolError as e:
        return [_finding(what, count, 0, [], [e.message])]
    try:
        return [_run(client, count, timeout * count, what)]
    finally:
        client.close()

"""The client's pings and their report, as ping(8) gives it: a line a reply, the statistics,
-j's document."""

from __future__ import annotations

import contextlib

from ibtool.api import IbtoolError, Invocation, Terminated


def ping_and_report(inv: Invocation, open_client) -> int:
    """Ping and report like ping(8). `open_client(stack)` opens the client, pushing its
    close (and that of whatever else it opens) on `stack`, so every way out closes it; it
    gives the client, the first line, and what the report says of the path."""
    from ibtool.api.ping import PingStats, run_client

    args = inv.args
    stats, rtts, replies, hw_rtts = PingStats(), [], [], []
    interrupted: KeyboardInterrupt | None = None
    failure: IbtoolError | None = None
    with contextlib.ExitStack() as stack:
        client, header, report = open_client(stack)
        if not inv.json:
            inv.print(header)

        lines = not inv.json and not args.quiet

        def on_reply(seq, rtt_us, hw_us):
            # Between two pings, where every step lengthens the run (with -i 0): the reply is
            # kept as a tuple and made into the report's entry after the run (_entry).
            replies.append((seq, rtt_us, hw_us))
            if hw_us is not None:
                hw_rtts.append(hw_us)
            if lines:
                hw = f" hw={hw_us:.2f} us" if hw_us is not None else ""
                inv.print(f"{args.size} bytes from {args.host}: seq={seq} rtt={rtt_us:.1f} us{hw}")
                inv.out.flush()

        def on_loss(seq, reason):
            replies.append({"seq": seq, "error": reason})
            inv.warn(f"seq={seq} lost: {reason}")

        try:
            run_client(
                client, args.count, args.interval, args.deadline, on_reply, on_loss, stats, rtts
            )
        except KeyboardInterrupt as e:
            interrupted = e  # Ctrl-C or SIGTERM: the summary still comes
        except IbtoolError as e:
            if not stats.sent:
                raise  # the first exchange failed: the error is the whole story
            failure = e  # the summary of the pings done, then the error (main() says it)
    hw = stats.summary(hw_rtts) if args.hw_timestamps else None
    replies = [_entry(r) for r in replies]
    _summary(inv, args.host, stats, stats.summary(rtts), replies, failure, report, hw)
    if failure is not None:
        raise failure
    if isinstance(interrupted, Terminated):
        raise interrupted
    if interrupted and stats.sent == 0:
        return 130
    incomplete = args.count is not None and stats.received < args.count and not interrupted
    return 1 if stats.received == 0 or incomplete else 0


def _entry(reply) -> dict:
    """A reply (seq, rtt_us, hw_us) or a loss (already a dict) as the report's `replies`
    lists it."""
    if isinstance(reply, dict):
        return reply
    seq, rtt_us, hw_us = reply
    entry = {"seq": seq, "rtt_us": round(rtt_us, 1)}
    if hw_us is not None:
        entry["hw_rtt_us"] = round(hw_us, 2)
    return entry


def header(args, device: str, port: int, gid_index, mtu: int, pkey, path) -> str:
    where = f"{device}/{port}" + (f" gid {gid_index}" if gid_index is not None else "")
    peer = f"{args.host} ({'ibv_' + args.compat})" if args.compat else args.host
    what = f"{args.size} bytes" + ("" if args.compat else f", mode {args.mode}")
    return f"PING {peer} over {where}: {what}, {path.describe(mtu)}, pkey {pkey.label}"


def _rounded(figures: dict, digits: int) -> dict:
    return {k: (round(v, digits) if v is not None else None) for k, v in figures.items()}


def _summary(inv, host, stats, rtt, replies, failure=None, path=None, hw=None) -> None:
    """The end of the report; `path`: what the JSON says of the connection; `hw`: the
    figures of the HCA's clock, with --hw-timestamps."""
    loss = 100.0 * (stats.sent - stats.received) / stats.sent if stats.sent else 0.0
    if inv.json:
        report = {
            "host": host,
            **path,
            "sent": stats.sent,
            "received": stats.received,
            "loss_pct": round(loss, 1),
            "time_ms": round(stats.elapsed * 1000),
            "rtt_us": _rounded(rtt, 1),
            "replies": replies,
        }
        if hw is not None:
            report["hw_rtt_us"] = _rounded(hw, 2)
        if failure is not None:
            report["error"] = failure.message  # what ended the run, as on standard error
        inv.emit_json(report)
        return
    inv.print(f"--- {host} ibtool ping statistics ---")
    inv.print(
        f"{stats.sent} sent, {stats.received} received, {loss:.0f}% loss, "
        f"time {stats.elapsed * 1000:.0f} ms"
    )
    for name, figures, digits in (("rtt", rtt, 1), ("hw rtt", hw, 2)):
        if figures and figures["min"] is not None:
            inv.print(
                f"{name} min/avg/median/max/mdev = "
                + "/".join(
                    f"{figures[k]:.{digits}f}" for k in ("min", "avg", "median", "max", "mdev")
                )
                + " us"
            )

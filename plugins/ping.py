"""`ibtool ping HOST` / `ibtool ping --server`: RC ping-pong over RDMA, reported like ping(8)."""

from __future__ import annotations

import argparse
import contextlib

from ibtool import hookimpl
from ibtool.argtypes import number, parse_size
from ibtool.errors import CommandFailed, IbtoolError, Terminated, UsageError
from ibtool.host import parse_selector
from ibtool.model.records import PortState
from ibtool.plugin.commands import Invocation

COMPAT_TOOLS = ("rc_pingpong", "rping")
MTUS = (256, 512, 1024, 2048, 4096)

# The ranges of the numbers the command line takes, refused at parse time by name (the run-time
# checks below say more where the peer narrows one, as rping's sizes):
# - an SL is 4 bits (IBTA vol. 1, the LRH's SL field), a traffic class 8 (the GRH's TClass);
# - a GID index is a uint8_t in an address vector (rdma-core libibverbs/verbs.h, struct
#   ibv_global_route sgid_index), a P_Key index a uint16_t (struct ibv_qp_attr pkey_index);
# - times as iputils' ping(8) takes them, in milliseconds in a C int (ping/ping.c: -i and -W
#   "bad timing interval" / "bad linger time" above INT_MAX / 1000 s, -W below 0.001 s); the
#   count in a C int, as ibv_rc_pingpong's -n;
# - a payload at most ibtool.rdma.ping.session.MAX_PING_SIZE (not imported here: it loads the verbs
#   modules, which only a ping needs).
SL = (0, 15)
TCLASS = (0, 255)
TCP_PORT = (1, 65535)
GID_INDEX = (0, 255)
PKEY_INDEX = (0, 65535)
COUNT = (1, 2**31 - 1)
LONGEST = 2147483.0  # INT_MAX milliseconds, in seconds
SIZE = (1, 1 << 20)
SESSIONS = (1, 65535)
MEMORY = (1 << 20, 1 << 40)  # at least one largest ping's; at most 1 TiB


def _bytes(text: str) -> int:
    """--max-memory: bytes, or with K, M or G (1024-based), in MEMORY."""

    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not MEMORY[0] <= value <= MEMORY[1]:
        raise argparse.ArgumentTypeError(
            f"must be 1M to 1024G (one largest ping's buffer at least), not {text}"
        )
    return value


def _network(text: str):
    """--allow: an IPv4 or IPv6 network (CIDR) or address."""
    from ibtool.rdma.ping.admission import parse_network

    try:
        return parse_network(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def configure(parser) -> None:
    parser.add_argument("host", nargs="?", help="the host running `ibtool ping --server`")
    parser.add_argument("--server", action="store_true", help="answer pings")
    parser.add_argument(
        "--compat",
        choices=COMPAT_TOOLS,
        help="talk to (or serve) a stock peer: ibv_rc_pingpong (rdma-core) or rping "
        "(librdmacm, over rdma_cm)",
    )
    parser.add_argument(
        "--cm",
        action="store_true",
        help="connect through rdma_cm instead of TCP: HOST (or --bind) is an IP address of an "
        "IPoIB or RoCE netdev, and no TCP port needs to be open",
    )
    parser.add_argument(
        "--sl", type=number(int, *SL), default=0, metavar="N", help="service level 0-15 (default 0)"
    )
    parser.add_argument(
        "--tclass",
        type=number(int, *TCLASS, hint="for DSCP D give --tclass $((D << 2))"),
        default=0,
        metavar="N",
        help="GRH traffic class 0-255; on RoCE v2 the IP DS field: DSCP is N >> 2 (default 0)",
    )
    parser.add_argument(
        "--mtu",
        type=number(int, MTUS[0], MTUS[-1], unit="bytes"),
        choices=MTUS,
        metavar="BYTES",
        help="cap the RC path MTU (256..4096; default: the port's active MTU, "
        "with --compat rc_pingpong 1024 as ibv_rc_pingpong's -m)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="only the summary, no line per reply"
    )
    parser.add_argument(
        "--hw-timestamps",
        action="store_true",
        help="also time each round trip on the HCA's own clock (mlx5), without this side's polling",
    )
    parser.add_argument(
        "--bind", default="", metavar="ADDR", help="server: the address to listen on (default: all)"
    )
    parser.add_argument(
        "--port",
        type=number(int, *TCP_PORT, hint="leave --port out for the default, 18520"),
        default=None,
        metavar="N",
        help="TCP port of the out-of-band exchange (default 18520; rc_pingpong: 18515)",
    )
    parser.add_argument(
        "--dev", metavar="DEV[/PORT]", help="RDMA device and port (default: the first ACTIVE port)"
    )
    parser.add_argument(
        "--gid-index", type=number(int, *GID_INDEX), help="GID index (default: the --best rule)"
    )
    parser.add_argument(
        "--pkey-index",
        type=number(int, *PKEY_INDEX),
        metavar="N",
        help="the slot of the port's P_Key table (its partition) the QP uses (default 0)",
    )
    parser.add_argument(
        "--mode",
        choices=("send", "write-imm"),
        default="send",
        help="SEND/RECV (default) or RDMA WRITE WITH IMMEDIATE",
    )
    parser.add_argument(
        "-c",
        "--count",
        type=number(int, *COUNT),
        help="stop after N pings (rc_pingpong: its -n, 1000)",
    )
    parser.add_argument(
        "-i",
        "--interval",
        type=number(float, 0, LONGEST, unit="seconds"),
        help="seconds between pings (default 1; rc_pingpong: 0); 0: the next as soon as "
        "the reply is in",
    )
    parser.add_argument(
        "-s",
        "--size",
        type=number(int, *SIZE, unit="bytes"),
        help="payload bytes (default 64; rc_pingpong: its -s, 4096)",
    )
    parser.add_argument(
        "-w",
        "--deadline",
        type=number(float, 0, LONGEST, unit="seconds", low_open=True),
        help="stop after this many seconds",
    )
    parser.add_argument(
        "-W",
        "--timeout",
        type=number(float, 0.001, LONGEST, unit="seconds"),
        default=2.0,
        help="seconds to wait for each reply (default 2)",
    )
    limits = parser.add_argument_group(
        "server limits", "what one `ibtool ping --server` lets in (ibtool-ping(8), LIMITS)"
    )
    limits.add_argument(
        "--max-sessions",
        type=number(int, *SESSIONS),
        metavar="N",
        help="clients served at once, in total (default 16)",
    )
    limits.add_argument(
        "--max-per-source",
        type=number(int, *SESSIONS),
        metavar="N",
        help="connections (handshakes and sessions) at once from one address (default 4)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=number(float, 0, LONGEST, unit="seconds", low_open=True),
        metavar="SECONDS",
        help="drop a client that sends nothing this long (default 120; rc_pingpong: -W)",
    )
    limits.add_argument(
        "--max-rate",
        type=number(float, 0, 1e6, unit="per second", low_open=True),
        metavar="N",
        help="new connections a second from one address, with a burst of 2 s of them (default 10)",
    )
    limits.add_argument(
        "--max-memory",
        type=_bytes,
        metavar="BYTES",
        help="memory registered for all clients together, K/M/G suffixes (default 64M)",
    )
    limits.add_argument(
        "--allow",
        type=_network,
        action="append",
        metavar="CIDR",
        help="serve only clients from this network (repeatable; default: everyone)",
    )
    # For tests and scripted runs: serve this many clients, then exit.
    parser.add_argument("--max-clients", type=number(int, *COUNT), help=argparse.SUPPRESS)


def _pick_port(inv: Invocation) -> tuple[str, int]:
    if inv.args.dev:
        name, port = parse_selector(inv.args.dev)
        inv.host.select(inv.args.dev)
        return name, port or inv.host.port_numbers(name)[0]
    ports = inv.host.ports()
    active = [p for p in ports if p.state == PortState.ACTIVE]
    if not active:
        have = ", ".join(f"{p.device}/{p.port} {p.state.name if p.state else '?'}" for p in ports)
        raise CommandFailed("no ACTIVE RDMA port", f"ports here: {have}")
    return active[0].device, active[0].port


# What each peer expects when the command line does not say: (port, size, count, interval, MTU).
DEFAULTS = {
    None: (18520, 64, None, 1.0, None),
    "rc_pingpong": (18515, 4096, 1000, 0.0, 1024),  # ibv_rc_pingpong's -p, -s, -n, -m
    "rping": (7174, 64, None, 1.0, None),  # rping's -p, -S
}


def _settle(args) -> None:
    """Fill in what the command line left out, by the peer; refuse what cannot work."""
    from ibtool.rdma.ping.session import MAX_PING_SIZE

    port, size, count, interval, mtu = DEFAULTS[args.compat]
    args.port = port if args.port is None else args.port
    args.size = size if args.size is None else args.size
    args.count = count if args.count is None else args.count
    args.interval = interval if args.interval is None else args.interval
    args.mtu = mtu if args.mtu is None else args.mtu
    if not 1 <= args.size <= MAX_PING_SIZE:
        raise UsageError(f"-s {args.size}: size must be 1..{MAX_PING_SIZE}")
    if args.interval < 0 or (args.count is not None and args.count < 1):
        raise UsageError("-i must be >= 0 and -c >= 1")
    if not 1 <= args.port <= 65535:
        raise UsageError(
            f"--port {args.port}: a TCP port is 1..65535",
            f"leave --port out for the default, {port}",
        )
    if not 0 <= args.sl <= 15:
        raise UsageError(f"--sl {args.sl}: a service level is 0..15")
    if args.pkey_index is not None and args.pkey_index < 0:
        raise UsageError(f"--pkey-index {args.pkey_index}: an index is 0 or more")
    if not 0 <= args.tclass <= 255:
        raise UsageError(
            f"--tclass {args.tclass}: a traffic class is 0..255",
            "for DSCP D give --tclass $((D << 2))",
        )
    if args.compat == "rping":
        _settle_rping(args)
    if args.cm:
        _settle_cm(args)
    if args.hw_timestamps and (args.server or args.compat == "rping"):
        over = "--server" if args.server else "--compat rping"
        raise UsageError(
            f"--hw-timestamps with {over}",
            "the client times its pings, with ibtool's own protocol (also --cm) or "
            "--compat rc_pingpong: leave one out",
        )
    if args.compat and args.mode != "send":
        raise UsageError(
            f"--mode {args.mode} with --compat {args.compat}",
            f"{args.compat} pings as the stock tool does: leave --mode out",
        )
    given = [f"--{name.replace('_', '-')}" for name in LIMITS if getattr(args, name) is not None]
    if given and not args.server:
        raise UsageError(
            f"{given[0]} is a server option", "give it to `ibtool ping --server`, or leave it out"
        )
    bounds = [f for f in given if f != "--idle-timeout"]
    if bounds and (args.cm or args.compat == "rping"):
        over = "--cm" if args.cm else "--compat rping"
        raise UsageError(
            f"{bounds[0]} with {over}: the rdma_cm servers serve one client at a time",
            "pyverbs gives no rdma_cm peer's address to match --allow or count per source; "
            "the TCP servers (no --cm, or --compat rc_pingpong) take the limits",
        )
    if args.server and args.host:
        raise UsageError("--server takes no HOST", "use --bind ADDR to choose an address")
    if not args.server and not args.host:
        raise UsageError("ping needs a HOST, or --server")


def _settle_rping(args) -> None:
    from ibtool.rdma.ping import rping

    if args.dev or args.gid_index is not None:
        raise UsageError(
            "--compat rping takes no --dev or --gid-index",
            "rdma_cm picks the RDMA device and GID from the IP address",
        )
    if args.pkey_index is not None:
        raise UsageError(
            "--compat rping takes no --pkey-index",
            "rdma_cm takes the P_Key from the address: the partition of its IPoIB netdev, "
            "the default one on RoCE",
        )
    if args.tclass:
        # rping -t sets it with rdma_set_option(RDMA_OPTION_ID_TOS) on the id it connects;
        # pyverbs' CMID.set_option passes on RDMA_OPTION_ID_ACK_TIMEOUT only.
        raise UsageError(
            "--compat rping takes no --tclass: pyverbs cannot set the TOS of an rdma_cm id",
            "rdma_cm's default for a RoCE port is in configfs: mkdir "
            "/sys/kernel/config/rdma_cm/DEV, then write the TOS to its "
            "ports/PORT/default_roce_tos (every rdma_cm connection from that port that sets "
            "none takes it)",
        )
    chosen = [f for f, v in (("--sl", args.sl), ("--mtu", args.mtu)) if v]
    if chosen:
        raise UsageError(
            f"--compat rping takes no {' or '.join(chosen)}",
            "rdma_cm sets the path of an rping connection from the route to the address",
        )
    if not args.server and not rping.MIN_SIZE <= args.size <= rping.MAX_SIZE:
        raise UsageError(
            f"-s {args.size}: an rping ping is {rping.MIN_SIZE}..{rping.MAX_SIZE} bytes",
            "a stock `rping -s` reads into its own -S buffer (default 64): start it with -S "
            "at least this size",
        )


def _settle_cm(args) -> None:
    if args.compat:
        raise UsageError(
            f"--cm with --compat {args.compat}",
            "--cm is ibtool's own ping over rdma_cm; --compat rping already uses rdma_cm",
        )
    if args.dev or args.gid_index is not None:
        raise UsageError(
            "--cm takes no --dev or --gid-index",
            "rdma_cm picks the RDMA device and GID from the IP address",
        )
    if args.pkey_index is not None:
        raise UsageError(
            "--cm takes no --pkey-index",
            "rdma_cm takes the P_Key from the address: the partition of its IPoIB netdev, "
            "the default one on RoCE; leave --cm out to choose it",
        )
    if args.server and not args.bind:
        raise UsageError(
            "--server --cm needs --bind ADDR",
            "give the IP address of the IPoIB or RoCE netdev to serve on (rdma_cm picks the "
            "RDMA device from it)",
        )


LIMITS = ("max_sessions", "max_per_source", "idle_timeout", "max_rate", "max_memory", "allow")


def _limits(args):
    """The server's admission.Limits: the options given, the defaults for the others."""
    from ibtool.rdma.ping.admission import Limits

    given = {name: getattr(args, name) for name in LIMITS if getattr(args, name) is not None}
    if "allow" in given:
        given["allow"] = tuple(given["allow"])
    return Limits(**given)


def _path(args):
    from ibtool.rdma.ladder import MTU_CODES, PathSpec

    mtu = MTU_CODES[args.mtu] if args.mtu else None
    return PathSpec(args.sl, args.tclass, mtu, args.pkey_index or 0)


def run(inv: Invocation) -> int:
    args = inv.args
    inv.host.require_live("ibtool ping uses this host's RDMA devices through verbs")
    _settle(args)
    if args.compat == "rping":
        return _rping(inv)
    if args.cm:
        return _cm(inv)
    device, port = _pick_port(inv)
    gid_index = args.gid_index
    if gid_index is None:
        gid_index = inv.host.roce_gid_index(device, port)
    asked = args.pkey_index is not None
    pkey = inv.host.pkey(device, port, args.pkey_index or 0, asked=asked)
    if args.server:
        return _run_server(inv, lambda log: _serve(args, device, port, gid_index, log, pkey))
    return _verbs_client(inv, device, port, gid_index, pkey)


def _run_server(inv: Invocation, serve) -> int:
    """Serve until interrupted (or --max-clients were served), each event a line."""
    log = _server_log(inv)
    try:
        serve(log)
    except KeyboardInterrupt:
        log("server stopped")
        raise  # main() says so and exits 130 (SIGINT) or 143 (SIGTERM)
    return 0


def _serve(args, device: str, port: int, gid_index, log, pkey) -> None:
    from ibtool.rdma.ping import pingpong, server  # pyverbs is imported only here

    where = (device, port, gid_index, args.bind, args.port, log, args.max_clients, _path(args))
    if args.compat == "rc_pingpong":
        pingpong.serve(*where, idle=args.timeout, pkey=pkey, limits=_limits(args))
    else:
        server.serve(*where, pkey=pkey, limits=_limits(args))


def _server_log(inv: Invocation):
    def log(line: str) -> None:
        if inv.json:
            inv.emit_json({"event": line})
        else:
            inv.print(line)
        inv.out.flush()

    return log


def _rping(inv: Invocation) -> int:
    """--compat rping: librdmacm's rping protocol over rdma_cm, either side."""
    from ibtool.rdma.ping import rping  # pyverbs is imported only here

    args = inv.args
    if args.server:
        serve = rping.serve
        idle = _limits(args).idle_timeout
        return _run_server(
            inv, lambda log: serve(args.bind, args.port, log, args.max_clients, idle)
        )

    def open_client(stack):
        client = rping.Client(args.host, args.port, args.size, args.timeout)
        stack.callback(client.close)
        # rdma_cm's own choice of path: an rping connection takes none of ours
        return (client, *_over_rdma_cm(args, client, "rping", None, "compat rping"))

    return _client(inv, open_client)


def _cm(inv: Invocation) -> int:
    """--cm: ibtool's own ping, connected through rdma_cm, either side."""
    from ibtool.rdma import wire  # pyverbs is imported only here
    from ibtool.rdma.ping import cmping

    args = inv.args
    if args.server:
        serve = cmping.serve
        where, idle = (args.bind, args.port), _limits(args).idle_timeout
        return _run_server(inv, lambda log: serve(*where, log, args.max_clients, _path(args), idle))

    def open_client(stack):
        mode = wire.Mode.WRITE_IMM if args.mode == "write-imm" else wire.Mode.SEND
        client = cmping.Client(
            args.host, args.port, args.size, mode, args.timeout, _path(args), args.hw_timestamps
        )
        stack.callback(client.close)
        # rdma_cm's path, with what was asked of it
        return (client, *_over_rdma_cm(args, client, None, args.mode, f"mode {args.mode}"))

    return _client(inv, open_client)


def _over_rdma_cm(args, client, compat, mode, what: str) -> tuple[str, dict]:
    """The first line and what the report says of the path, for a client that rdma_cm
    connected: `client.used` is the path its QP is on (None: not known); the P_Key is the
    address's, not ibtool's to say."""
    from ibtool.rdma.ladder import MTU_BYTES

    header = f"PING {client.server} over rdma_cm ({client.device}): {args.size} bytes, {what}"
    path = dict(compat=compat, cm=True, mode=mode, mtu=None, sl=None, tclass=None)
    used = client.used
    if used is not None:
        header += f", {used.describe()}"
        path.update(mtu=MTU_BYTES.get(used.mtu), sl=used.sl, tclass=used.traffic_class)
    path.update(pkey_index=None, pkey=None)
    return header, path


def _verbs_client(inv: Invocation, device: str, port: int, gid_index, pkey) -> int:
    """ibtool's own protocol, or --compat rc_pingpong: an RC QP on DEVICE/PORT."""
    from ibtool.rdma import wire  # pyverbs is imported only here
    from ibtool.rdma.hwclock import HwClock
    from ibtool.rdma.ladder import MTU_BYTES, Ladder
    from ibtool.rdma.ping import client as native
    from ibtool.rdma.ping import pingpong

    args = inv.args
    path = _path(args)

    def open_client(stack):
        ladder = stack.enter_context(Ladder(device, port, gid_index))
        hw = HwClock(ladder) if args.hw_timestamps else None
        if args.compat == "rc_pingpong":
            client = pingpong.PingpongClient(
                ladder, args.host, args.port, args.size, args.timeout, path, args.count, hw
            )
        else:
            mode = wire.Mode.WRITE_IMM if args.mode == "write-imm" else wire.Mode.SEND
            client = native.Client(
                ladder, args.host, args.port, args.size, mode, args.timeout, path, hw
            )
        stack.callback(client.close)
        client.on_note = inv.warn
        if args.compat:
            client.connect()  # one session: a peer not there is the whole story
        # This side's MTU; an ibtool server may agree on a smaller one (its port's).
        mtu = MTU_BYTES[ladder.path_mtu(ladder.port_attr.active_mtu, path.mtu)]
        report = dict(compat=args.compat, cm=False, mode=None if args.compat else args.mode)
        report.update(mtu=mtu, sl=args.sl, tclass=args.tclass)
        report.update(pkey_index=pkey.index, pkey=pkey.hex)
        return client, _header(args, device, port, gid_index, mtu, pkey, path), report

    return _client(inv, open_client)


def _client(inv: Invocation, open_client) -> int:
    """Ping and report like ping(8). `open_client(stack)` opens the client, pushing its
    close (and that of whatever else it opens) on `stack`, so every way out closes it; it
    gives the client, the first line, and what the report says of the path."""
    from ibtool.rdma.ping.client import PingStats, run_client

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


def _header(args, device: str, port: int, gid_index, mtu: int, pkey, path) -> str:
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


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "ping", run, configure=configure, help="RC ping-pong over RDMA with another host or process"
    )


# -- health --------------------------------------------------------------------------------------

PEER_PINGS = 3


def _ping_peer(ctx, device: str, port: int, gid_index, peer: str):
    import time

    from ibtool.api import HealthResult, Perfdata, Status
    from ibtool.rdma import wire
    from ibtool.rdma.ladder import Ladder
    from ibtool.rdma.ping.client import Client, PingStats, run_client
    from ibtool.rdma.ping.session import DEFAULT_PORT

    left = ctx.deadline - time.monotonic()
    if left <= 0:
        budget = f"{ctx.config.datapath_budget:g} s"
        return HealthResult(Status.UNKNOWN, peer, f"not pinged: the {budget} were spent")
    stats, rtts = PingStats(), []
    with Ladder(device, port, gid_index) as ladder:
        client = Client(ladder, peer, DEFAULT_PORT, 64, wire.Mode.SEND, min(2.0, left))
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


@hookimpl
def ibtool_health_checks(register):
    register("peers", check_peers)

"""`ibtool ping`'s command line: its options, their ranges, and what a run fills in or refuses
by the peer (settle), before any verbs module is loaded."""

from __future__ import annotations

import argparse

from ibtool.api import (
    CommandFailed,
    Invocation,
    UsageError,
    number,
    parse_selector,
    parse_size,
)

COMPAT_TOOLS = ("rc_pingpong", "rping")

# The ranges of the numbers the command line takes beyond the data path's own
# (ibtool.api.datapath.DATAPATH_OPTIONS says where each of those comes from), refused at parse
# time by name (the run-time checks below say more where the peer narrows one, as rping's
# sizes):
# - times as iputils' ping(8) takes them, in milliseconds in a C int (ping/ping.c: -i and -W
#   "bad timing interval" / "bad linger time" above INT_MAX / 1000 s, -W below 0.001 s); the
#   count in a C int, as ibv_rc_pingpong's -n;
TCP_PORT = (1, 65535)
COUNT = (1, 2**31 - 1)
LONGEST = 2147483.0  # INT_MAX milliseconds, in seconds
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
    from ibtool.api.ping import parse_network

    try:
        return parse_network(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def configure(parser) -> None:
    from ibtool.api.datapath import MAX_PING_SIZE
    from ibtool.api.datapath import add_datapath_option as option

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
    option(parser, "sl", default=0, help="service level 0-15 (default 0)")
    option(
        parser,
        "tclass",
        default=0,
        help="GRH traffic class 0-255; on RoCE v2 the IP DS field: DSCP is N >> 2 (default 0)",
    )
    option(
        parser,
        "mtu",
        help="cap the RC path MTU (256..4096; default: the port's active MTU, "
        "with --compat rc_pingpong 1024 as ibv_rc_pingpong's -m)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="only the summary, no line per reply"
    )
    option(
        parser,
        "qp_timeout",
        default=14,
        help="RC transport timeout: each try waits 4.096 us * 2^N for its ACK (default 14: "
        "67 ms), as perftest's -u",
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
    option(parser, "gid_index", metavar=None)
    option(
        parser,
        "pkey_index",
        help="the slot of the port's P_Key table (its partition) the QP uses (default 0)",
    )
    option(parser, "mode")
    option(parser, "count", metavar=None, help="stop after N pings (rc_pingpong: its -n, 1000)")
    parser.add_argument(
        "-i",
        "--interval",
        type=number(float, 0, LONGEST, unit="seconds"),
        help="seconds between pings (default 1; rc_pingpong: 0); 0: the next as soon as "
        "the reply is in",
    )
    option(
        parser, "size", flags=("-s", "--size"), high=MAX_PING_SIZE, metavar=None,
        help="payload bytes (default 64; rc_pingpong: its -s, 4096)",
    )  # fmt: skip
    parser.add_argument(
        "-w",
        "--deadline",
        type=number(float, 0, LONGEST, unit="seconds", low_open=True),
        help="stop after this many seconds",
    )
    option(
        parser, "timeout", flags=("-W", "--timeout"), low=0.001, low_open=False, metavar=None,
        default=2.0, help="seconds to wait for each reply (default 2)",
    )  # fmt: skip
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
    limits.add_argument(
        "--no-facts",
        action="store_true",
        help="do not answer `ibtool doctor` queries with this side's facts",
    )
    # For tests and scripted runs: serve this many clients, then exit.
    parser.add_argument("--max-clients", type=number(int, *COUNT), help=argparse.SUPPRESS)


def pick_port(inv: Invocation) -> tuple[str, int]:
    """The port --dev names, or the first ACTIVE one."""
    if inv.args.dev:
        name, port = parse_selector(inv.args.dev)
        inv.host.select(inv.args.dev)
        return name, port or inv.host.port_numbers(name)[0]
    ports = inv.host.ports()
    from ibtool.api import PortState  # the records: where ping runs, not at every start

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


def settle(args) -> None:
    """Fill in what the command line left out, by the peer; refuse what cannot work."""
    from ibtool.api.ping import MAX_PING_SIZE

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
    if args.no_facts and (not args.server or args.compat or args.cm):
        raise UsageError(
            "--no-facts is an option of ibtool's own TCP server",
            "only `ibtool ping --server` (no --compat, no --cm) answers doctor queries",
        )
    if args.server and args.host:
        raise UsageError("--server takes no HOST", "use --bind ADDR to choose an address")
    if not args.server and not args.host:
        raise UsageError("ping needs a HOST, or --server")


def _settle_rping(args) -> None:
    from ibtool.api.ping import RPING_MAX_SIZE, RPING_MIN_SIZE

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
    if not args.server and not RPING_MIN_SIZE <= args.size <= RPING_MAX_SIZE:
        raise UsageError(
            f"-s {args.size}: an rping ping is {RPING_MIN_SIZE}..{RPING_MAX_SIZE} bytes",
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


def server_limits(args):
    """The server's admission.Limits: the options given, the defaults for the others."""
    from ibtool.api.ping import Limits

    given = {name: getattr(args, name) for name in LIMITS if getattr(args, name) is not None}
    if "allow" in given:
        given["allow"] = tuple(given["allow"])
    return Limits(**given)

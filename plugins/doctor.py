"""`ibtool doctor [PEER]`: why two hosts do not talk over RDMA, or are slow. A checklist of
this host's side, and with a PEER running `ibtool ping --server`, both sides compared and an
RDMA probe along the path."""

from __future__ import annotations

from ibtool.api import Invocation, hookimpl, number

COMPAT = {"rc_pingpong": 18515, "rping": 7174}  # ibv_rc_pingpong's -p, rping's -p defaults
NATIVE_PORT = 18520  # ibtool ping --server's
STOCK_SIZE = 4096  # ibv_rc_pingpong's -s: its server answers only messages of its own size
# include/linux/threads.h: pid_max is at most this (64-bit kernels), and every PID is below it
PID_MAX_LIMIT = 4 * 1024 * 1024


def configure(parser) -> None:
    from ibtool.api.datapath import MAX_PING_SIZE
    from ibtool.api.datapath import add_datapath_option as option

    parser.add_argument("peer", nargs="?", metavar="PEER",
                        help="the other host (running `ibtool ping --server`, or a stock peer "
                        "with --compat)")  # fmt: skip
    parser.add_argument("--dev", metavar="DEV[/PORT]",
                        help="this host's RDMA device and port (default: the one the kernel "
                        "routes PEER through, else the first ACTIVE port)")  # fmt: skip
    parser.add_argument("--port", type=number(int, 1, 65535), metavar="N",
                        help="the peer's TCP port (default 18520; rc_pingpong 18515, rping "
                        "7174)")  # fmt: skip
    parser.add_argument("--compat", choices=sorted(COMPAT),
                        help="the peer runs a stock ibv_rc_pingpong or rping server: nothing is "
                        "asked of it, the probe speaks its protocol")  # fmt: skip
    option(parser, "gid_index", metavar=None,
           help="the GID index to check and probe with (default: the --best rule)")  # fmt: skip
    option(parser, "tclass", hint=None,
           help="the traffic class the application uses (default: the port's rdma_cm "
           "default_roce_tos, else 0)")  # fmt: skip
    option(parser, "count", high=1000, default=3,
           help="round trips of each probed operation (default 3)")  # fmt: skip
    option(parser, "size", high=MAX_PING_SIZE, unit="",
           help="probe size (default 64; rc_pingpong: its -s, 4096)")  # fmt: skip
    option(parser, "timeout", low=0.1, high=60.0, low_open=False, unit="", default=2.0,
           help="seconds the peer has to answer, from the question (asked first, "
           "answered while this side reads its own), and for each probe's round trip "
           "(default 2)")  # fmt: skip
    parser.add_argument("--no-probe", action="store_true",
                        help="check only: no RDMA round trips")  # fmt: skip
    parser.add_argument("--pid", type=number(int, 1, PID_MAX_LIMIT - 1), metavar="PID",
                        help="judge this process's side (a job's): its memlock limit, rdma "
                        "cgroup and CPUs, not doctor's own")  # fmt: skip


def run(inv: Invocation) -> int:
    from ibtool.api.doctor import Options, diagnose, view

    args = inv.args
    opts = Options(
        peer=args.peer,
        tcp_port=args.port or (COMPAT[args.compat] if args.compat else NATIVE_PORT),
        compat=args.compat,
        gid_index=args.gid_index,
        tclass=args.tclass,
        count=args.count,
        size=args.size or (STOCK_SIZE if args.compat == "rc_pingpong" else 64),
        timeout=args.timeout,
        probe=not args.no_probe and inv.host.live,
        pid=args.pid,
        thresholds=lambda: _thresholds(inv.warn),
    )
    report = diagnose(inv.host, args.dev, opts, inv.warn)
    if inv.json:
        inv.emit_json(report.to_json())
    else:
        inv.print(view.head(report.local, report.peer, report.peer_address))
        for line in view.lines(report.findings):
            inv.print(line)
        inv.print(view.summary(report.findings))
    return report.verdict.exit_code


def _thresholds(warn) -> dict[str, int]:
    """infiniband-diags' error_thresholds, as ibqueryerrors reads them: none where the file
    is missing, and where it cannot be used, none and a warning (any error counts)."""
    from ibtool.api.fabric import THRESHOLDS_FILE, THRESHOLDS_MAX, parse_thresholds
    from ibtool.api.health import NotAFile, read_bounded

    try:
        raw = read_bounded(THRESHOLDS_FILE, THRESHOLDS_MAX)
    except FileNotFoundError:
        return {}
    except NotAFile as e:
        warn(f"thresholds {THRESHOLDS_FILE}: {e.what}; any error counts")
        return {}
    except OSError as e:
        warn(f"thresholds {THRESHOLDS_FILE}: {e.strerror or e}; any error counts")
        return {}
    try:
        return parse_thresholds(raw.decode("utf-8", "replace"), THRESHOLDS_FILE)
    except ValueError as e:
        warn(f"{e}; any error counts")
        return {}


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "doctor",
        run,
        configure=configure,
        help="why two hosts do not talk over RDMA: both ends checked, then probed",
    )

"""`ibtool loopback`: prove a port moves data with every RDMA operation, verified, with timings."""

from __future__ import annotations

import ipaddress

from ibtool.api import (
    CommandFailed,
    IbtoolError,
    Invocation,
    UsageError,
    hookimpl,
    number,
    parse_selector,
    render,
    selector,
)

# The ranges of the numbers the command line takes beyond the data path's own
# (ibtool.api.datapath.DATAPATH_OPTIONS says where each of those comes from):
# - the depth makes a QP of depth + 1 work requests and a CQ of 2 x depth + 4: the device's
#   max_qp_wr and max_cqe (ibtool -d dev: rxe 32767 CQEs) refuse more when they are made;
# - a million iterations of each operation are minutes of a real HCA and each one's latency
#   is kept for the percentiles; an hour for one iteration is a hung device.
ITERS = (1, 1_000_000)
TIMEOUT = (0, 3600.0)
DEPTH = (1, 65536)


def configure(parser) -> None:
    from ibtool.api.datapath import add_datapath_option as option

    parser.add_argument("words", nargs="*", metavar="[DEV[/PORT]]")
    parser.add_argument(
        "--ops",
        default="all",
        help="comma-separated: send,write,write_imm,read,fetch_add,cmp_swap,ud_send,ud_qkey,"
        "mcast,apm (default: all)",
    )
    option(parser, "size", metavar=None, default=4096, help="message size in bytes")
    option(
        parser, "count", flags=("--iters",), low=ITERS[0], high=ITERS[1], metavar=None,
        default=100, help="iterations per operation",
    )  # fmt: skip
    option(parser, "gid_index", metavar=None)
    option(
        parser,
        "pkey_index",
        help="the slot of the port's P_Key table (its partition) the QPs use (default 0)",
    )
    option(
        parser, "timeout", low=TIMEOUT[0], high=TIMEOUT[1], metavar=None, default=5.0,
        help="seconds one iteration may take (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--depth",
        type=number(int, *DEPTH),
        default=16,
        help="operations in flight in the bandwidth phase (default 16)",
    )
    option(
        parser,
        "sl",
        help="service level 0-15 of the address vectors (default 0): InfiniBand maps it to a "
        "VL, RoCE drivers to the frames' priority",
    )
    parser.add_argument(
        "--qkey",
        metavar="Q",
        help="Q_Key of ud_send and ud_qkey, hex (0x...) or decimal (default 0x11111111); "
        "bit 31 set is a controlled Q_Key, which only privileged processes may use",
    )


def _qkey(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text, 0)
    except ValueError:
        value = -1
    if not 0 <= value <= 0xFFFFFFFF:
        raise UsageError(f"--qkey {text}: a Q_Key is 32 bits", "give 0x0..0xffffffff, or decimal")
    return value


def ipv4_of(netdev: str) -> str | None:
    """The IPv4 address of a netdev (SIOCGIFADDR), or None."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", netdev.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(ifreq[20:24])


def _mcast_source(host, device: str, port: int, gid_index: int | None) -> str | None:
    """The address rdma_cm reaches this port by: on RoCE the one in the chosen GID, on
    InfiniBand the IPoIB netdev's IPv4 address."""
    if gid_index is not None:
        for g in host.gids(f"{device}/{port}"):
            if g.index == gid_index and g.ip:
                return None if ipaddress.ip_address(g.ip).is_link_local else g.ip
        return None
    netdev = host.port(device, port, ("netdev",)).netdev
    return ipv4_of(netdev) if netdev else None


SL_NOTES = {
    True: "the SL-to-VL tables of the port and the switches map the SL to a virtual lane",
    False: "on RoCE the SL has no field on the wire: drivers send it as the frames' Ethernet "
    "priority (802.1p PCP, 0-7, on a VLAN netdev), rxe ignores it; the DSCP is the GRH's "
    "traffic class",
}


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


FIELDS = [
    render.Field("op", lambda r: r.op, header="OP"),
    render.Field("status", lambda r: r.status.value, header="STATUS"),
    render.Field("size", lambda r: r.size, header="SIZE"),
    render.Field("iters", lambda r: r.iters, header="ITERS"),
    render.Field("lat_min_us", lambda r: r.summary["min"], header="MIN_us", text=_us),
    render.Field("lat_p50_us", lambda r: r.percentile(50), header="P50_us", text=_us),
    render.Field("lat_p99_us", lambda r: r.percentile(99), header="P99_us", text=_us),
    render.Field("lat_max_us", lambda r: r.summary["max"], header="MAX_us", text=_us),
    render.Field("bw_MBps", lambda r: r.bandwidth_mbps, header="MB/s", text=lambda v: f"{v:.1f}"),
]


def run(inv: Invocation) -> int:
    from ibtool.api.datapath import path_spec
    from ibtool.api.loopback import OPS, OpStatus, selftest  # pyverbs is imported only here

    args = inv.args
    inv.host.require_live("ibtool loopback uses this host's RDMA devices through verbs")
    ops = OPS if args.ops == "all" else tuple(o.strip() for o in args.ops.split(","))
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise UsageError(f"unknown operation {unknown[0]!r}", f"choose from {','.join(OPS)}")
    qkey = _qkey(args.qkey)
    sel = selector(args)
    pairs = inv.host.select(sel)
    device = pairs[0][0]
    port = parse_selector(sel)[1] if sel else None
    port = port or inv.host.port_numbers(device)[0]
    state = inv.host.port(device, port)
    from ibtool.api import PortState  # the records: where a command runs, not at every start

    if state.state is not None and state.state != PortState.ACTIVE:
        phys = state.physical_state.name if state.physical_state is not None else "unknown"
        raise CommandFailed(
            f"{device}/{port} is {state.state.name} (physical state {phys})",
            "bring the link up (cable, switch port, `ip link set NETDEV up` for RoCE) and retry",
        )
    gid_index = args.gid_index
    if gid_index is None:
        gid_index = inv.host.roce_gid_index(device, port)
    asked = args.pkey_index is not None
    pkey = inv.host.pkey(device, port, args.pkey_index or 0, asked=asked)
    path = path_spec(args, pkey_index=pkey.index)
    source = _mcast_source(inv.host, device, port, gid_index) if "mcast" in ops else None
    results = selftest(
        device,
        port,
        gid_index,
        ops,
        args.size,
        args.iters,
        args.timeout,
        args.depth,
        path,
        qkey=qkey,
        mcast_source=source,
    )
    failed = [r for r in results if r.status in (OpStatus.FAIL, OpStatus.TIMEOUT)]
    # What the command line chose beyond the defaults (absent otherwise: the reports of a
    # plain run stay as they were).
    chosen = {"sl": args.sl, "qkey": None if qkey is None else f"{qkey:#010x}"}
    chosen = {k: v for k, v in chosen.items() if v is not None}
    if inv.json:
        inv.emit_json(
            {
                "ifname": device,
                "port": port,
                "gid_index": gid_index,
                "pkey_index": pkey.index,
                "pkey": pkey.hex,
                **chosen,
                "results": [_result_json(r) for r in results],
            }
        )
    else:
        where = f"{device}/{port}" + (f" gid {gid_index}" if gid_index is not None else "")
        where += f", pkey {pkey.label}"
        extra = "".join(f", {k if k == 'sl' else 'Q_Key'} {v}" for k, v in chosen.items())
        inv.print(f"loopback on {where}, {args.size} bytes, {args.iters} iterations{extra}")
        if args.sl is not None:
            inv.print(f"note: sl {args.sl}: {SL_NOTES[gid_index is None]}")
        for line in render.table(results, FIELDS, True):
            inv.print(line)
        for r in results:
            if r.error:
                inv.print(f"{r.op}: {r.error}")
            if r.detail:
                inv.print(f"{r.op}: {r.detail}")
    return 1 if failed else 0


def _result_json(r) -> dict:
    out = {**render.record_json(r, FIELDS, True), "error": r.error, **r.facts}
    if r.detail:
        out["detail"] = r.detail
    return out


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "loopback",
        run,
        configure=configure,
        help="self-test a port with every RDMA operation, data verified",
    )


# -- health --------------------------------------------------------------------------------------

DATAPATH_OPS = ("send", "write", "read")
DATAPATH_SIZE, DATAPATH_ITERS = 4096, 10


def _datapath_port(ctx, device: str, port: int):
    """One port's loopback of SEND, WRITE and READ, as a health result."""
    import time

    from ibtool.api import HealthResult, Perfdata, Status
    from ibtool.api.loopback import OpStatus, selftest

    subject = f"{device}/{port}"
    left = ctx.deadline - time.monotonic()
    if left <= 0:
        budget = f"{ctx.config.datapath_budget:g} s"
        return HealthResult(
            Status.UNKNOWN, subject, f"data path not tested: the {budget} were spent"
        )
    try:
        gid_index = ctx.host.roce_gid_index(device, port)
    except CommandFailed as e:
        return HealthResult(Status.CRITICAL, subject, f"data path: {e.message}")
    results = selftest(
        device, port, gid_index, DATAPATH_OPS, DATAPATH_SIZE, DATAPATH_ITERS, min(5.0, left), 4
    )
    bad = [r for r in results if r.status != OpStatus.PASS]
    if bad:
        text = "; ".join(
            f"{r.op} {r.status.value}" + (f": {r.error}" if r.error else "") for r in bad
        )
        return HealthResult(Status.CRITICAL, subject, f"data path: {text}")
    perfdata = tuple(
        Perfdata(f"{subject} {r.op} p50", round(r.percentile(50), 1), "us", min=0) for r in results
    )
    ops = ", ".join(f"{r.op} {r.percentile(50):.0f}" for r in results)
    how = f"{DATAPATH_ITERS} x {DATAPATH_SIZE} B, p50 us {ops}"
    summary = f"data path: {', '.join(DATAPATH_OPS)} PASS ({how})"
    return HealthResult(Status.OK, subject, summary, perfdata)


def check_datapath(ctx):
    """With --datapath only: SEND, WRITE and READ over two QPs on each ACTIVE port, the data
    verified (ibtool loopback's test, short), within [datapath] budget seconds."""
    from ibtool.api import HealthResult, PortState, Status

    if not ctx.datapath:
        return
    if not ctx.host.live:
        yield HealthResult(Status.UNKNOWN, "", f"data path not tested: {ctx.host.not_live}")
        return
    for p in ctx.host.ports(fields=("state",)):
        if p.state != PortState.ACTIVE or ctx.config.expect(p.device, p.port).ignore:
            continue  # the port check says why
        try:
            yield _datapath_port(ctx, p.device, p.port)
        except IbtoolError as e:  # no pyverbs, no permission: the same for every port
            hint = f" (hint: {e.hint})" if e.hint else ""
            yield HealthResult(Status.UNKNOWN, "", f"data path not tested: {e.message}{hint}")
            return


@hookimpl
def ibtool_health_checks(register):
    register("datapath", check_datapath)

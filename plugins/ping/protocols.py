"""Each protocol's run, either side: the native ping and rc_pingpong over the port's verbs,
rping and the native ping over rdma_cm (`--compat rping`, `--cm`)."""

from __future__ import annotations

from ibtool_plugins.ping.options import pick_port, server_limits, settle
from ibtool_plugins.ping.report import header, ping_and_report

from ibtool.api import Invocation
from ibtool.api.datapath import path_spec


def run(inv: Invocation) -> int:
    args = inv.args
    inv.host.require_live("ibtool ping uses this host's RDMA devices through verbs")
    settle(args)
    if args.compat == "rping":
        return _rping(inv)
    if args.cm:
        return _cm(inv)
    device, port = pick_port(inv)
    gid_index = args.gid_index
    if gid_index is None:
        gid_index = inv.host.roce_gid_index(device, port)
    asked = args.pkey_index is not None
    pkey = inv.host.pkey(device, port, args.pkey_index or 0, asked=asked)
    if args.server:
        facts = None if args.no_facts else _facts(inv, device, port, gid_index)
        return _run_server(inv, lambda log: _serve(args, device, port, gid_index, log, pkey, facts))
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


def _facts(inv: Invocation, device: str, port: int, gid_index):
    """What answers an `ibtool doctor` query: the served port's facts, read anew each time
    (the operator may have just fixed what the last query showed); one query at a time,
    as the Host is not shared between threads."""
    import threading

    lock = threading.Lock()

    def facts() -> bytes:
        from ibtool.api.doctor import collect

        with lock:
            return collect(inv.host, device, port, gid_index).to_wire()

    return facts


def _serve(args, device: str, port: int, gid_index, log, pkey, facts) -> None:
    from ibtool.api import ping  # pyverbs is imported only here

    pingpong = args.compat == "rc_pingpong"
    options = ping.ServeOptions(
        args.bind, args.port, log, device=device, device_port=port, gid_index=gid_index,
        max_clients=args.max_clients, path=path_spec(args), pkey=pkey,
        idle=args.timeout if pingpong else None, limits=server_limits(args),
    )  # fmt: skip
    if pingpong:
        ping.serve_pingpong(options)
    else:
        ping.serve(options, facts=facts)


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
    from ibtool.api import ping  # pyverbs is imported only here

    args = inv.args
    if args.server:
        return _run_server(inv, lambda log: ping.serve_rping(_cm_options(args, log)))

    def open_client(stack):
        client = ping.RpingClient(args.host, args.port, args.size, args.timeout)
        stack.callback(client.close)
        # rdma_cm's own choice of path: an rping connection takes none of ours
        return (client, *_over_rdma_cm(args, client, "rping", None, "compat rping"))

    return ping_and_report(inv, open_client)


def _cm(inv: Invocation) -> int:
    """--cm: ibtool's own ping, connected through rdma_cm, either side."""
    from ibtool.api import ping  # pyverbs is imported only here
    from ibtool.api.datapath import MODES

    args = inv.args
    if args.server:
        return _run_server(
            inv, lambda log: ping.serve_cmping(_cm_options(args, log, path=path_spec(args)))
        )

    def open_client(stack):
        mode = MODES[args.mode]
        client = ping.CmpingClient(
            args.host, args.port, args.size, mode, args.timeout, path_spec(args), args.hw_timestamps
        )
        stack.callback(client.close)
        # rdma_cm's path, with what was asked of it
        return (client, *_over_rdma_cm(args, client, None, args.mode, f"mode {args.mode}"))

    return ping_and_report(inv, open_client)


def _cm_options(args, log, **given):
    """What an rdma_cm server is told: --idle-timeout as its own bound too (it serves one
    client at a time); `given`: what one of them takes beyond (cmping: the path)."""
    from ibtool.api.ping import ServeOptions

    limits = server_limits(args)
    return ServeOptions(
        args.bind, args.port, log, max_clients=args.max_clients, idle=limits.idle_timeout,
        limits=limits, **given,
    )  # fmt: skip


def _over_rdma_cm(args, client, compat, mode, what: str) -> tuple[str, dict]:
    """The first line and what the report says of the path, for a client that rdma_cm
    connected: `client.used` is the path its QP is on (None: not known); the P_Key is the
    address's, not ibtool's to say."""
    from ibtool.api.datapath import MTU_BYTES

    header = f"PING {client.server} over rdma_cm ({client.device}): {args.size} bytes, {what}"
    path = dict(compat=compat, cm=True, mode=mode, mtu=None, sl=None, tclass=None)
    used = client.used
    if used is not None:
        header += f", {used.describe()}"
        path.update(mtu=MTU_BYTES.get(used.mtu), sl=used.sl, tclass=used.traffic_class)
    path.update(pkey_index=None, pkey=None)
    return header, path


def through_lo(host, ladder, target: str) -> str | None:
    """On RoCE, a server at another address of this host: when the kernel routes it from this
    port's address through lo (two ports in one subnet, without a routing table each), the
    pings answer but never leave the host, and say nothing of the ports or the network
    (ibtool mesh sets such pairs aside for the same reason). The note, or None."""
    import ipaddress

    from ibtool.api import IbtoolError, LinkLayer

    if ladder.link_layer != LinkLayer.ETHERNET:
        return None  # InfiniBand goes by LID, not by the kernel's routes
    try:
        dst = ipaddress.ip_address(target)
        gid = ipaddress.IPv6Address(bytes(ladder.gid))
    except ValueError:
        return None  # a host name: the address the RDMA goes to is the server's GID's
    src = gid.ipv4_mapped or gid
    if dst == src or dst.is_loopback or dst.version != src.version:
        return None
    try:
        route = host.route(str(dst), str(src))
    except IbtoolError:
        return None
    if route is None or route.type != "local":
        return None
    return (
        f"the kernel routes {dst}, this host's own address, through lo from {src} "
        f"({ladder.device}/{ladder.port}'s): the pings never leave this host; give each "
        "port a routing table of its own (ip rule add from ADDRESS lookup TABLE) and "
        "sysctl net.ipv4.conf.all.accept_local=1 to ping through the switch"
    )


def _verbs_client(inv: Invocation, device: str, port: int, gid_index, pkey) -> int:
    """ibtool's own protocol, or --compat rc_pingpong: an RC QP on DEVICE/PORT."""
    from ibtool.api import ping  # pyverbs is imported only here
    from ibtool.api.datapath import MODES, MTU_BYTES, HwClock, Ladder

    args = inv.args
    path = path_spec(args)

    def open_client(stack):
        ladder = stack.enter_context(Ladder(device, port, gid_index))
        hw = HwClock(ladder) if args.hw_timestamps else None
        if args.compat == "rc_pingpong":
            client = ping.PingpongClient(
                ladder, args.host, args.port, args.size, args.timeout, path, args.count, hw
            )
        else:
            mode = MODES[args.mode]
            client = ping.Client(
                ladder, args.host, args.port, args.size, mode, args.timeout, path, hw
            )
        stack.callback(client.close)
        client.on_note = inv.warn
        looped = through_lo(inv.host, ladder, args.host)
        if looped:
            inv.warn(looped)
        if args.compat:
            client.connect()  # one session: a peer not there is the whole story
        # This side's MTU; an ibtool server may agree on a smaller one (its port's).
        mtu = MTU_BYTES[ladder.path_mtu(ladder.port_attr.active_mtu, path.mtu)]
        report = dict(compat=args.compat, cm=False, mode=None if args.compat else args.mode)
        report.update(mtu=mtu, sl=args.sl, tclass=args.tclass)
        report.update(pkey_index=pkey.index, pkey=pkey.hex)
        return client, header(args, device, port, gid_index, mtu, pkey, path), report

    return ping_and_report(inv, open_client)

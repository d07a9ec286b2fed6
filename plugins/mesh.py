"""`ibtool mesh NODESET`: an RDMA ping mesh over every node and rail, fanned out through
ClusterShell or Slurm (or every port of this host with --local), that names the bad node,
rail, endpoint or path; and `ibtool mesh --agent`, what it runs on each node."""

from __future__ import annotations

import argparse
import sys

from ibtool.api import Invocation, UsageError, hookimpl, number

TCP_PORT = 18521  # the agents' ping servers (ibtool ping --server's is 18520)


def configure(parser) -> None:
    from ibtool.api.datapath import MAX_PING_SIZE
    from ibtool.api.datapath import add_datapath_option as option

    parser.add_argument(
        "nodeset",
        nargs="?",
        metavar="NODESET",
        help="the nodes, as ClusterShell (clush -w) takes them: node[001-064]; "
        "with --srun, default: the allocation's",
    )
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--srun",
        action="store_true",
        help="fan out through Slurm's srun inside an allocation, one task a node",
    )
    how.add_argument(
        "--local",
        action="store_true",
        help="this host alone: every RDMA port of it is an endpoint (rail to rail "
        "through the switch)",
    )
    how.add_argument(
        "--agent",
        action="store_true",
        help="what the mesh runs on each node (not by hand)",
    )
    parser.add_argument(
        "--connect",
        type=_listen,
        metavar="[ADDR]:PORT",
        help="an agent's: the coordinator it joins (ADDR: where its ssh or srun came from)",
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="an agent's: leave its ssh once joined",
    )
    parser.add_argument(
        "--dev",
        type=device_ports,
        metavar="DEV[/PORT],...",
        help="only these ports of each node, as shell patterns (mlx5_[0-7], mlx5_*/1)",
    )
    parser.add_argument(
        "--exclude",
        type=device_ports,
        metavar="DEV[/PORT],...",
        help="leave these ports of each node out (a storage NIC, an uncabled port)",
    )
    parser.add_argument(
        "--rail",
        type=_rail_map,
        metavar="DEV[/PORT]=N,...",
        help="the rail of each port, as shell patterns (mlx5_0=0,mlx5_1=1); default: by "
        "subnet where each rail is one, else a node's k-th port is rail k",
    )
    parser.add_argument(
        "--all-rails",
        action="store_true",
        help="pair every endpoint with every other, not rail k with rail k",
    )
    option(parser, "count", high=100000, default=20, help="pings per pair (default 20)")
    option(parser, "size", high=MAX_PING_SIZE, default=64, help="ping size (default 64)")
    option(parser, "mode")
    parser.add_argument(
        "--rate",
        type=number(float, 0.1, 1e6),
        default=100.0,
        metavar="N",
        help="pings a second an endpoint sends, at most (default 100)",
    )
    option(
        parser, "timeout", low=0.1, high=60.0, low_open=False, unit="", default=2.0,
        help="seconds for a ping's reply and a pair's connection (default 2)",
    )  # fmt: skip
    option(
        parser,
        "qp_timeout",
        default=18,
        help="RC transport timeout of the pairs' QPs: 4.096 us * 2^N a try (default 18: "
        "1.07 s, a host's stalls are not loss)",
    )
    path = parser.add_argument_group(
        "the path probed", "what a job's QPs use, so that the mesh probes what the job will "
        "(ibtool-mesh(8), THE PATH)"
    )  # fmt: skip
    option(
        path,
        "tclass",
        default=0,
        help="GRH traffic class of the pairs' QPs; on RoCE v2 the IP DS field, DSCP N >> 2 "
        "(NCCL_IB_TC; default 0)",
    )
    option(path, "sl", default=0, help="service level of the pairs' QPs (NCCL_IB_SL; default 0)")
    option(
        path,
        "gid_index",
        help="the GID every RoCE endpoint uses (NCCL_IB_GID_INDEX; default: each port's "
        "RoCE v2 IPv4 GID, as ibtool gids --best)",
    )
    option(
        path,
        "pkey_index",
        default=0,
        help="the slot of each port's P_Key table the QPs use (NCCL_IB_PKEY; default 0)",
    )
    path.add_argument(
        "--full-payload",
        type=number(int, 0, 1000),
        default=3,
        metavar="N",
        help="after a pair's pings, N pings of the path MTU's full payload, which a smaller "
        "MTU on the path drops (default 3; 0: none)",
    )
    path.add_argument(
        "--qps",
        type=number(int, 1, 16),
        default=1,
        metavar="N",
        help="spread a pair's pings over N QPs, each its own UDP source port and so its own "
        "ECMP path (default 1)",
    )
    path.add_argument(
        "--bw",
        action="store_true",
        help="also an RDMA WRITE burst a pair: an endpoint below 0.7 of its rail's median "
        "bandwidth is named",
    )
    parser.add_argument(
        "--rounds",
        type=number(int, 1, 1 << 20),
        metavar="K",
        help="run K of the N-1 shifted rounds, spread evenly (default: all, "
        "every ordered pair once)",
    )
    parser.add_argument(
        "--deadline",
        type=number(float, 1.0, 1e7),
        metavar="S",
        help="seconds for the whole mesh: no round starts after them, the one running is "
        "cut, and the verdicts are on what was probed (default: none)",
    )
    parser.add_argument(
        "--abandon",
        type=number(int, 1, 100000),
        default=3,
        metavar="N",
        help="give a pair up after N pings lost in a row (default 3)",
    )
    parser.add_argument(
        "--slow",
        type=number(float, 1.5, 1000.0),
        default=10.0,
        metavar="FACTOR",
        help="a pair is slow when its p90 RTT is FACTOR times its rail's median (default 10)",
    )
    parser.add_argument(
        "--tcp-port",
        type=number(int, 1, 65535),
        default=TCP_PORT,
        metavar="N",
        help=f"the agents' ping servers' TCP port (default {TCP_PORT})",
    )
    parser.add_argument(
        "--fanout",
        type=number(int, 1, 100000),
        default=64,
        metavar="N",
        help="ssh starting agents at a time, as clush's (default 64)",
    )
    parser.add_argument(
        "--listen",
        type=_listen,
        metavar="ADDR[:PORT]",
        help="where the agents join this host: an address they reach (default: every "
        "address, a free port; each node joins where its ssh came from)",
    )
    parser.add_argument(
        "--ibtool",
        default="ibtool",
        metavar="CMD",
        help="how the nodes run ibtool (default: ibtool, from their PATH)",
    )
    parser.add_argument(
        "--start-timeout",
        type=number(float, 1.0, 3600.0),
        default=120.0,
        metavar="S",
        help="seconds for every node's agent to start (default 120)",
    )
    parser.add_argument(
        "--textfile",
        metavar="PATH",
        help="also write per-pair series for node_exporter's textfile collector",
    )
    parser.add_argument(
        "--plot", metavar="FILE.png", help="also draw the heat map to a PNG (needs matplotlib)"
    )
    parser.add_argument(
        "--no-save",
        action="store_true",
        help="do not keep this mesh as the last one for `ibtool tui`",
    )


def run(inv: Invocation) -> int:
    args = inv.args
    if inv.root != "/" or inv.snapshot is not None:
        raise UsageError(
            "ibtool mesh runs on live hosts, not on a --root tree or a --snapshot",
            "leave --root and --snapshot out",
        )
    if args.agent:
        inv.host.require_live("an ibtool mesh agent serves and pings this host's RDMA ports")
        from ibtool.api.mesh import PortChoice, agent_main

        return agent_main(
            inv.host, chosen=PortChoice(args.dev, args.exclude), gid_index=args.gid_index,
            connect=args.connect, detach=args.detach,
        )  # fmt: skip
    _check_outputs(args)  # before the mesh: a wrong path is known in a second, not after it
    engine, argv = engine_for(inv)
    from ibtool.api.mesh import Options, mesh, name_cables

    options = Options(
        count=args.count,
        size=args.size,
        mode=args.mode,
        rate=args.rate,
        timeout=args.timeout,
        rounds=args.rounds,
        all_rails=args.all_rails,
        slow_factor=args.slow,
        tcp_port=args.tcp_port,
        start_timeout=args.start_timeout,
        qp_timeout=args.qp_timeout,
        deadline=args.deadline,
        abandon=args.abandon,
        sl=args.sl,
        tclass=args.tclass,
        pkey_index=args.pkey_index,
        gid_index=args.gid_index,
        full_payload=args.full_payload,
        qps=args.qps,
        bw=args.bw,
        rail_map=args.rail or (),
    )

    def say(line: str) -> None:
        sys.stderr.write(
            f"ibtool {line}\n" if line.startswith("mesh") else f"ibtool mesh: {line}\n"
        )
        sys.stderr.flush()

    result = mesh(engine, options, argv, say, listen=args.listen or ("", 0))
    name_cables(inv.host, result, say)  # on InfiniBand, where this host reaches the subnet
    _outputs(inv, result)
    return result.exit_code()


def _rail_map(text: str):
    from ibtool.api.mesh import parse_map

    try:
        return parse_map(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _listen(text: str) -> tuple[str, int]:
    from ibtool.api.mesh import parse_listen

    try:
        return parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def device_ports(text: str) -> tuple[str, ...]:
    """--dev and --exclude: DEV or DEV/PORT shell patterns, comma separated."""
    patterns = tuple(p for p in text.split(",") if p)
    if not patterns or any(not p.isprintable() or p.count("/") > 1 for p in patterns):
        raise argparse.ArgumentTypeError(f"{text!r}: not DEV[/PORT],... (mlx5_0,mlx5_1/1)")
    return patterns


def engine_for(inv: Invocation):
    """The engine the command line asks for, and the agent's command line on the nodes."""
    from ibtool.api import mesh as engines

    args = inv.args
    agent = ["mesh", "--agent"]
    for flag, patterns in (("--dev", args.dev), ("--exclude", args.exclude)):
        if patterns:
            agent += [flag, ",".join(patterns)]
    if args.gid_index is not None:
        agent += ["--gid-index", str(args.gid_index)]
    if args.local:
        if args.nodeset:
            raise UsageError("--local takes no NODESET", "leave NODESET out, or --local out")
        inv.host.require_live("ibtool mesh --local pings between this host's RDMA ports")
        # no device here is this host's own error, said once as doctor and loopback say it,
        # not an agent's failure to be reported as a FAIL verdict and saved as the last mesh
        inv.host.select(None)
        return engines.LocalEngine(), [sys.executable, "-m", "ibtool", *agent]
    import shlex

    try:
        remote = shlex.split(args.ibtool)
    except ValueError as e:
        raise UsageError(f"--ibtool {args.ibtool}: {e}", "a command as a shell takes it") from None
    if not remote:
        raise UsageError("--ibtool is empty", "the command that runs ibtool on the nodes")
    if args.srun:
        return engines.SrunEngine(args.nodeset, engines.slurm_overlap()), remote + agent
    if not args.nodeset:
        raise UsageError(
            "ibtool mesh needs the nodes: NODESET, --srun in an allocation, or --local",
            "ibtool mesh 'node[01-16]', or ibtool mesh --local for this host's ports",
        )
    return engines.ClusterShellEngine(args.nodeset, fanout=args.fanout), remote + agent


def _outputs(inv: Invocation, result) -> None:
    from ibtool.api.mesh import view

    args = inv.args
    if inv.json:
        for chunk in view.json_chunks(result):
            inv.out.write(chunk)
        inv.out.write("\n")
    else:
        color = _color(inv)
        for line in view.render_text(result, width=_width(), color=color):
            inv.print(line, sgr=color)
    inv.out.flush()
    if args.textfile:
        _textfile(args.textfile, view.textfile(result))
    if args.plot:
        from ibtool.api.mesh import plot

        plot(result, args.plot)
    if not args.no_save:
        from ibtool.api.mesh import last_path, save_last

        path = last_path()
        try:
            save_last(result, path)
        except OSError as e:
            inv.warn(f"the mesh is not kept for ibtool tui: {path}: {e.strerror or e}")


def _textfile(path: str, text: str) -> None:
    from ibtool.api.health import write_text

    write_text(path, text)


def _check_outputs(args) -> None:
    import os

    if args.textfile:
        from ibtool.api.health import check_path

        check_path(args.textfile)
    for opt, path in (("--textfile", args.textfile), ("--plot", args.plot)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(
                f"{opt} {path}: no such directory", "give a path in a directory that exists"
            )
    if args.plot:
        from ibtool.api.mesh import require_plot as require

        require()


def _color(inv: Invocation) -> bool:
    import os

    out = inv.out
    return bool(getattr(out, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


def _width() -> int:
    import shutil

    return max(40, shutil.get_terminal_size((80, 24)).columns)


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "mesh",
        run,
        configure=configure,
        help="RDMA ping mesh over nodes and rails (ClusterShell, Slurm): names the bad one",
    )

"""`ibtool topo`: which RDMA device serves which GPU. Every GPU and RDMA device with where it
sits in the PCIe tree, the distance matrix in `nvidia-smi topo -m`'s terms, each GPU's closest
RDMA ports; --nccl: the environment a job would export."""

from __future__ import annotations

from ibtool.api import Invocation, hookimpl


def configure(parser) -> None:
    parser.add_argument("--nccl", action="store_true",
                        help="print the NCCL environment for this host (NCCL_IB_HCA, "
                        "NCCL_IB_GID_INDEX, NCCL_SOCKET_IFNAME) as shell exports")  # fmt: skip


def run(inv: Invocation) -> int:
    from ibtool.api.topo import judge_gpudirect, view

    topo = inv.host.topology(gid_indexes=inv.args.nccl)
    if inv.args.nccl:
        env = _environment(inv, topo)
        if inv.json:
            inv.emit_json(view.nccl_json(env))
        else:
            for line in view.nccl_text(env):
                inv.print(line)
        return 0
    findings = judge_gpudirect(topo, inv.host.gpudirect(topo))
    if inv.json:
        inv.emit_json(view.data(topo, findings))
    else:
        for line in view.text(topo, inv.details, findings):
            inv.print(line)
    return 0


def _environment(inv: Invocation, topo):
    """NCCL's variables: the interface of the default route for the bootstrap sockets (the
    running kernel's answer; a tree or a snapshot has none)."""
    from ibtool.api.topo import DEFAULT_ROUTE_PROBE, nccl_environment

    ifname, said = None, None
    if not inv.host.live:
        said = "a capture holds no routes (run it on the host)"
    else:
        route = inv.host.route(DEFAULT_ROUTE_PROBE)
        if route is not None and route.dev is not None and route.type == "unicast":
            ifname = route.dev
        else:
            said = "no default route"
    return nccl_environment(topo, ifname, said)


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "topo",
        run,
        configure=configure,
        help="GPUs and RDMA devices: the PCIe between them, each GPU's closest NIC, --nccl",
    )

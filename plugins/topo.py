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


# -- health ------------------------------------------------------------------------------------

# [checks.gpudirect] of health.toml: the check runs only where the table is (opt-in: a host
# without GPUs has nothing to check). `gpus`: how many GPUs the node has (fewer is CRITICAL: a
# GPU that fell off the bus); `distance`: the farthest GPU-to-NIC distance that is not a
# WARNING (default PXB, NCCL's default GDR level).
HEALTH_OPTIONS = ("gpus", "distance")
_STATUS = {"ok": "OK", "warn": "WARNING", "FAIL": "CRITICAL", "unknown": "UNKNOWN"}

# The kinds of the findings that are not OK, for a program:
# gpu_missing       fewer GPUs than [checks.gpudirect] gpus
# gdr_registration  nvidia-peermem not loaded and dma-buf not usable (or not known)
# gdr_no_rdma       a GPU without any RDMA device with a PCI function
# gdr_distance      a GPU's closest RDMA device farther than `distance`
# gdr_acs           ACS redirects peer-to-peer on a bridge between a GPU and its NIC (or
#                   cannot be read)
# gdr_iommu         the IOMMU translates (or its mode cannot be told)
# gdr_link          a GPU's or RDMA device's link trained below its maximum


def _gpudirect_options(options) -> dict:
    from ibtool.api.topo import DISTANCES

    found = {}
    for key, value in options.items():
        if key not in HEALTH_OPTIONS:
            raise ValueError(f"[checks.gpudirect] names no option {key!r} (gpus, distance)")
        if key == "gpus" and (type(value) is not int or not 1 <= value <= 64):
            raise ValueError("[checks.gpudirect] gpus must be a number from 1 to 64")
        if key == "distance" and value not in DISTANCES[1:]:
            raise ValueError("[checks.gpudirect] distance must be one of PIX, PXB, PHB, NODE, SYS")
        found[key] = value
    return found


def check_gpudirect(ctx):
    """Opt-in, with a [checks.gpudirect] table: the GPUs are all there, and GPUDirect RDMA can
    work between each and its closest RDMA device (ibtool topo's judgement: registration,
    distance, ACS, IOMMU, links)."""
    if "gpudirect" not in ctx.config.checks:
        return  # opt-in: a health run without the table imports nothing of topo's
    from ibtool.api import HealthResult, Status
    from ibtool.api.topo import judge_gpudirect

    try:
        options = _gpudirect_options(ctx.options)
    except ValueError as e:
        yield HealthResult(Status.UNKNOWN, "", f"GPUDirect RDMA not checked: {e}")
        return
    host = ctx.host
    topo = host.topology(gid_indexes=False)
    wanted = options.get("gpus")
    if wanted is not None and len(topo.gpus) < wanted:
        said = f"{len(topo.gpus)} GPUs of {wanted}: a GPU is missing from the PCI bus"
        yield HealthResult(Status.CRITICAL, "", said, kind="gpu_missing")
    elif not topo.gpus:
        said = "no GPU (NVIDIA or AMD, by PCI class) on this host"
        yield HealthResult(Status.WARNING, "", said, kind="gpu_missing")
        return
    level = options.get("distance", "PXB")
    for f in judge_gpudirect(topo, host.gpudirect(topo), level=level):
        subject = "" if f.subject == "registration" else f.subject
        said = f.said + (f" (fix: {f.fix})" if f.fix else "")
        status = Status[_STATUS[f.status]]
        kind = "" if status == Status.OK else f"gdr_{f.kind}"
        yield HealthResult(status, subject, said, kind=kind)


@hookimpl
def ibtool_health_checks(register):
    register("gpudirect", check_gpudirect)

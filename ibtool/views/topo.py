"""`ibtool topo` as text and JSON: the GPUs and RDMA devices with where they sit, the distance
matrix in `nvidia-smi topo -m`'s form, each GPU's closest RDMA ports, NCCL's environment."""

from __future__ import annotations

from typing import Any

from ibtool.model.names import escaped
from ibtool.model.system import PciLink, cpu_list
from ibtool.model.topo import (
    DISTANCES,
    LEGEND,
    Gpu,
    NcclEnvironment,
    Nic,
    PciFunction,
    Topology,
    distance,
)
from ibtool.views import render


def link_text(link: PciLink | None) -> str | None:
    """'16GT/s x16' (as lspci writes it), or '8GT/s x8 (of 16GT/s x16)' where it trained
    below its maximum; None when not PCIe."""
    if link is None or (link.current_speed is None and link.current_width is None):
        return None
    now = _link(link.current_speed, link.current_width)
    top = _link(link.max_speed, link.max_width)
    return now if not link.degraded else f"{now} (of {top})"


def _link(speed: str | None, width: int | None) -> str:
    gts = "?" if speed is None else speed.split()[0].removesuffix(".0")
    return f"{gts}GT/s x{'?' if width is None else width}"


def path_text(fn: PciFunction) -> str:
    """The function, every bridge above it and its host bridge: '0000:07:00.0 < 0000:06:00.0
    < ... < pci0000:00'."""
    return " < ".join([fn.bdf, *fn.bridges, *([fn.host_bridge] if fn.host_bridge else [])])


def _closest_text(topo: Topology, gpu: Gpu) -> str:
    level, nics = topo.closest(gpu)
    if level is None:
        return "no RDMA device"
    return f"{level} " + ", ".join(_ports(nic) for nic in nics)


def _ports(nic: Nic) -> str:
    active = [p for p in nic.ports if p.active]
    if not active:
        return f"{nic.name} (no ACTIVE port)"
    return ", ".join(f"{nic.name}:{p.port}" for p in active)


def _shown(get):
    """A column's getter showing "-" for what is not known, in the tables below."""
    return lambda item: "-" if (value := get(item)) is None else value


_DEVICE_FIELDS = [
    render.Field("pci", _shown(lambda i: i.function.bdf), header="PCI"),
    render.Field("id", _shown(lambda i: i.function.ids), header="ID"),
    render.Field("numa", _shown(lambda i: _numa(i.function)), header="NUMA"),
    render.Field("cpus", _shown(lambda i: cpu_list(i.function.cpus)), header="CPUS"),
    render.Field("link", _shown(lambda i: link_text(i.function.link)), header="LINK"),
]


def _table(name: str, last: render.Field, items) -> list[str]:
    fields = [render.Field("name", lambda i: i.name, header=name), *_DEVICE_FIELDS, last]
    return render.table(items, fields, False)


def text(topo: Topology, details: bool, findings=()) -> list[str]:
    """The devices, the matrix and the legend, then GPUDirect RDMA's `findings`; -d: each
    device's path to its host bridge."""
    out: list[str] = []
    if topo.gpus:
        closest = render.Field("closest", lambda g: _closest_text(topo, g), header="CLOSEST RDMA")
        out += _table("GPU", closest, topo.gpus)
    else:
        out.append("no GPU (NVIDIA or AMD, by PCI class) on this host")
    out.append("")
    if topo.nics:
        out += _table("RDMA", render.Field("ports", _port_states, header="PORTS"), topo.nics)
    else:
        out.append("no RDMA device with a PCI function")
    if topo.elsewhere:
        out.append(f"not on PCI (a netdev's): {', '.join(topo.elsewhere)}")
    if details:
        out.append("")
        for item in (*topo.gpus, *topo.nics):
            out.append(f"{item.name}: {path_text(item.function)}")
    members = [(g.name, g.function) for g in topo.gpus] + [(n.name, n.function) for n in topo.nics]
    if topo.gpus and topo.nics:
        out.append("")
        out += matrix(members, topo.gpus)
        out.append("")
        out.append("Legend (PCIe only: NVLink, nvidia-smi's NV#, is not in sysfs):")
        out += [f"  {d:<4} = {LEGEND[d]}" for d in DISTANCES]
    if findings:
        import textwrap

        out += ["", "GPUDirect RDMA:"]
        indent = " " * 10
        for subjects, f in _merged(findings):
            said = escaped(f"{subjects}: {f.said}")
            out += textwrap.wrap(said, 79, initial_indent=f"  {f.status:<8}",
                                 subsequent_indent=indent, break_on_hyphens=False)  # fmt: skip
            if f.fix:
                fix = escaped(f"fix: {f.fix}")
                out += textwrap.wrap(fix, 79, initial_indent=indent,
                                     subsequent_indent=indent + "  ",
                                     break_on_hyphens=False)  # fmt: skip
    return out


def _merged(findings):
    """(subjects, finding): a finding that is not OK said once for every pair it holds for
    (the IOMMU translating is the host's, not one pair's), where the first of them was; the
    OK lines one each."""
    firsts: dict = {}
    for f in findings:
        key = (f.status, f.said, f.fix) if f.status != "ok" else (id(f),)
        firsts.setdefault(key, []).append(f)
    return [(", ".join(dict.fromkeys(f.subject for f in group)), group[0])
            for group in firsts.values()]  # fmt: skip


def matrix(members: list[tuple[str, PciFunction]], gpus) -> list[str]:
    """`nvidia-smi topo -m`'s matrix: a row and a column per member, the GPU rows with
    their CPU and NUMA affinity."""
    names = [name for name, _ in members]
    width = max(len(n) for n in names) + 2
    head = " " * width + "".join(n.ljust(width) for n in names) + "CPU Affinity    NUMA Affinity"
    lines = [head.rstrip()]
    gpu_names = {g.name for g in gpus}
    for name, fn in members:
        cells = "".join(
            (" X" if other is fn else distance(fn, other)).ljust(width) for _, other in members
        )
        tail = ""
        if name in gpu_names:
            tail = (cpu_list(fn.cpus) or "N/A").ljust(16) + _numa(fn)
        lines.append((name.ljust(width) + cells + tail).rstrip())
    return lines


def _numa(fn: PciFunction) -> str:
    return "N/A" if fn.numa is None else str(fn.numa)


# A port's link layer, short: InfiniBand ports are named by LID, Ethernet ones by netdev.
_LAYER = {"InfiniBand": "IB", "Ethernet": "RoCE"}


def _port_states(nic: Nic) -> str:
    return ", ".join(
        f"{p.port} {p.state or '?'} {_LAYER.get(p.link_layer or '', p.link_layer or '?')}"
        + (f" {p.netdev}" if p.netdev else "")
        for p in nic.ports
    )


def nccl_text(env: NcclEnvironment) -> list[str]:
    """`export NAME=VALUE` lines a shell can source, then what could not be chosen as
    comments."""
    lines = [f"export {name}={_shell(value)}" for name, value in env.variables]
    return lines + [f"# {escaped(note)}" for note in env.notes]


def _shell(value: str) -> str:
    safe = all(c.isalnum() or c in "=_:,.-/" for c in value)
    return value if safe else "'" + value.replace("'", "'\\''") + "'"


# -- JSON -----------------------------------------------------------------------------------------


def function_json(fn: PciFunction) -> dict[str, Any]:
    link = fn.link
    return {
        "pci": fn.bdf,
        "vendor": None if fn.vendor is None else f"0x{fn.vendor:04x}",
        "device": None if fn.device is None else f"0x{fn.device:04x}",
        "class": None if fn.pci_class is None else f"0x{fn.pci_class:06x}",
        "numa_node": fn.numa,
        "cpus": cpu_list(fn.cpus),
        "link": None
        if link is None
        else {
            "speed": link.current_speed,
            "width": link.current_width,
            "max_speed": link.max_speed,
            "max_width": link.max_width,
            "degraded": link.degraded,
        },
        "bridges": list(fn.bridges),
        "host_bridge": fn.host_bridge,
        "driver": fn.driver,
        "iommu_group": fn.iommu_group,
        "physfn": fn.physfn,
    }


def data(topo: Topology, findings=()) -> dict[str, Any]:
    """The whole answer as JSON: GPUs, RDMA devices (with ports), the matrix, closest, and
    GPUDirect RDMA's findings."""
    members = [(g.name, g.function) for g in topo.gpus] + [(n.name, n.function) for n in topo.nics]
    gpus = []
    for g in topo.gpus:
        level, nics = topo.closest(g)
        gpus.append(
            {
                "name": g.name,
                "vendor_name": g.function.vendor_name,
                **function_json(g.function),
                "closest": {"distance": level, "rdma": [n.name for n in nics]},
            }
        )
    return {
        "gpus": gpus,
        "rdma": [
            {
                "name": n.name,
                **function_json(n.function),
                "ports": [
                    {
                        "port": p.port,
                        "state": p.state,
                        "link_layer": p.link_layer,
                        "netdev": p.netdev,
                        "gid_index": p.gid_index,
                    }
                    for p in n.ports
                ],  # fmt: skip
            }
            for n in topo.nics
        ],
        "not_pci": list(topo.elsewhere),
        "matrix": {a: {b: distance(fa, fb) for b, fb in members} for a, fa in members},
        "gpudirect": [
            {"status": f.status.lower(), "subject": f.subject, "said": f.said, "fix": f.fix}
            for f in findings
        ],
    }


def nccl_json(env: NcclEnvironment) -> dict[str, Any]:
    return {"environment": dict(env.variables), "notes": list(env.notes)}

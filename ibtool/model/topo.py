"""The GPUs and RDMA devices of a host and the PCIe between them: which NIC serves which GPU, in
the terms of `nvidia-smi topo -m` (NVML's nvmlGpuTopologyLevel_t), and what a job's NCCL
environment should name.

Distances, from nearest:

    X     the device itself
    PIX   through at most one PCIe bridge, a PCIe switch counted as one (its upstream port
          and the downstream ports below it): two devices under one switch or one root port
    PXB   through several bridges (nested switches), not through the host bridge
    PHB   through a PCIe host bridge (the CPU's root complex): two root ports of one
    NODE  between host bridges of one NUMA node
    SYS   across the interconnect between NUMA nodes (UPI, Infinity Fabric)

They are read from where each PCI function sits in sysfs (/sys/devices/pciDDDD:BB/<root port>/
<bridges>/<function>): NVLink, which nvidia-smi shows between GPUs as NV#, is not in sysfs, so
a GPU pair is given its PCIe path.

Plain frozen records; None in a field means "could not be told" (the reader warned).
"""

from __future__ import annotations

from ibtool.model.deferred import dataclass
from ibtool.model.names import natural_key
from ibtool.model.system import PciLink

# PCI vendor IDs (the PCI-SIG's list, as pci.ids has them) of the GPUs counted.
VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD"}
# Class codes (PCI Code and ID Assignment Specification, base class and subclass) a GPU shows:
# VGA (0x0300: a GPU with a display engine), 3D controller (0x0302: NVIDIA's data-centre
# GPUs), other display controller (0x0380: AMD Instinct up to MI250) and processing
# accelerator (0x1200: AMD Instinct MI300).
GPU_CLASSES = (0x0300, 0x0302, 0x0380, 0x1200)
BRIDGE_CLASS = 0x0604  # PCI-to-PCI bridge: a root port, a switch's upstream or downstream port

X, PIX, PXB, PHB, NODE, SYS = "X", "PIX", "PXB", "PHB", "NODE", "SYS"
DISTANCES = (X, PIX, PXB, PHB, NODE, SYS)
RANK = {d: i for i, d in enumerate(DISTANCES)}
# nvidia-smi topo -m's legend, for the distances read here.
LEGEND = {
    X: "self",
    PIX: "through at most one PCIe bridge (one switch, or one root port)",
    PXB: "through several PCIe bridges, not the host bridge",
    PHB: "through a PCIe host bridge (the CPU)",
    NODE: "between PCIe host bridges of one NUMA node",
    SYS: "across the interconnect between NUMA nodes (UPI, Infinity Fabric)",
}
# NCCL uses GPUDirect RDMA between a GPU and a NIC up to this distance by default
# (NCCL_NET_GDR_LEVEL; src/graph/paths.cc ncclTopoCheckGdr): farther, its data goes
# through host memory.
GDR_DEFAULT_LEVEL = PXB


@dataclass(frozen=True)
class PciFunction:
    """One PCI function and where it sits: `bridges` are the bridges above it, nearest
    first, up to its root port; `host_bridge` the root complex's directory
    ("pci0000:00"); `link` its own PCIe link; `numa` its node (None: -1, none)."""

    bdf: str
    vendor: int | None = None
    device: int | None = None
    pci_class: int | None = None  # the 24-bit class code: 0x030200
    bridges: tuple[str, ...] = ()
    host_bridge: str | None = None
    numa: int | None = None
    cpus: frozenset[int] | None = None
    link: PciLink | None = None
    driver: str | None = None
    iommu_group: int | None = None
    physfn: str | None = None  # an SR-IOV virtual function's physical function (its address)

    @property
    def is_gpu(self) -> bool:
        return (
            self.vendor in VENDORS
            and self.pci_class is not None
            and self.pci_class >> 8 in GPU_CLASSES
        )

    @property
    def vendor_name(self) -> str | None:
        return None if self.vendor is None else VENDORS.get(self.vendor)

    @property
    def ids(self) -> str | None:
        """'10de:2330', as lspci -n prints the vendor and device."""
        if self.vendor is None or self.device is None:
            return None
        return f"{self.vendor:04x}:{self.device:04x}"


def distance(a: PciFunction, b: PciFunction) -> str:
    """How far apart two PCI functions are, in nvidia-smi's terms (see above)."""
    if a.bdf == b.bdf:
        return X
    if a.host_bridge is None or a.host_bridge != b.host_bridge:
        return NODE if a.numa == b.numa else SYS
    common = set(a.bridges).intersection(b.bridges)
    if not common:
        return PHB
    # The bridges each climbs below the nearest one they share: a downstream port of the
    # shared switch (or none, under one root port) is still one switch.
    below_a = next(i for i, bdf in enumerate(a.bridges) if bdf in common)
    below_b = next(i for i, bdf in enumerate(b.bridges) if bdf in common)
    return PIX if below_a <= 1 and below_b <= 1 else PXB


@dataclass(frozen=True)
class NicPort:
    """One port of an RDMA device, as a job would name it (NCCL_IB_HCA's DEV:PORT)."""

    port: int
    link_layer: str | None  # "InfiniBand", "Ethernet"
    state: str | None  # "ACTIVE", "DOWN", ...
    netdev: str | None = None
    gid_index: int | None = None  # RoCE: the index the --best rule picks (None: none)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"


@dataclass(frozen=True)
class Nic:
    """An RDMA device and its PCI function (None: it has none, see Topology.others)."""

    name: str
    function: PciFunction | None
    ports: tuple[NicPort, ...] = ()


@dataclass(frozen=True)
class Gpu:
    """A GPU: `index` counts the GPUs in PCI bus order, as nvidia-smi numbers them
    (CUDA_DEVICE_ORDER=PCI_BUS_ID)."""

    index: int
    function: PciFunction

    @property
    def name(self) -> str:
        return f"GPU{self.index}"


@dataclass(frozen=True)
class Topology:
    """The host's GPUs and the RDMA devices with a PCI function; `others`: the RDMA devices
    without one (rxe, siw: a netdev's, not a slot's), their function None."""

    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    others: tuple[Nic, ...] = ()

    @property
    def elsewhere(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.others)

    def for_jobs(self) -> list[Nic]:
        """The RDMA devices with a PCI function but the SR-IOV virtual functions whose
        physical function is one of them."""
        pfs = {nic.function.bdf for nic in self.nics}
        return [nic for nic in self.nics if nic.function.physfn not in pfs]

    def closest(self, gpu: Gpu) -> tuple[str, tuple[Nic, ...]]:
        """The nearest distance from `gpu` to an RDMA device and every device at it; (None,
        ()) without one. An SR-IOV virtual function whose physical function is an RDMA
        device here is left out: a job on the host uses the PF (a VF is a guest's or a
        pod's, where its PF is not seen)."""
        nics = self.for_jobs()
        if not nics:
            return None, ()
        by = [(RANK[distance(gpu.function, nic.function)], nic) for nic in nics]
        best = min(rank for rank, _ in by)
        return DISTANCES[best], tuple(nic for rank, nic in by if rank == best)


def gpus_in_bus_order(functions) -> tuple[Gpu, ...]:
    """The GPUs of `functions`, numbered in PCI bus order."""
    found = sorted((f for f in functions if f.is_gpu), key=lambda f: f.bdf)
    return tuple(Gpu(i, f) for i, f in enumerate(found))


def sorted_nics(nics) -> tuple[Nic, ...]:
    return tuple(sorted(nics, key=lambda n: natural_key(n.name)))


# -- NCCL's environment --------------------------------------------------------------------------

# An address no route is more specific for than the default one: RFC 5737's TEST-NET-1. The
# route to it names the interface NCCL's bootstrap sockets should use.
DEFAULT_ROUTE_PROBE = "192.0.2.1"


@dataclass(frozen=True)
class NcclEnvironment:
    """What a job would export (name, value) and what the choice could not cover (notes)."""

    variables: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]


def nccl_environment(topo: Topology, socket_ifname: str | None, socket_said: str | None):
    """NCCL_IB_HCA: the active ports of every RDMA device that is the closest to a GPU (each
    GPU's nearest devices, but not where the nearest is SYS: a device reached only across the
    CPUs' interconnect is not chosen for that GPU); without GPUs, or when no GPU has one
    closer than SYS, every active port (never a virtual function beside its physical one).
    "=" makes NCCL match names exactly (mlx5_1 would otherwise take mlx5_10 too).
    NCCL_IB_GID_INDEX: on RoCE, the --best rule's index, when every chosen port has the same
    one. NCCL_SOCKET_IFNAME: `socket_ifname`, the interface of the default route (None:
    `socket_said` says why). The RDMA devices without a PCI function are named only on a host
    without GPUs (an rxe port is no GPU's path)."""
    notes: list[str] = []
    chosen: list[Nic] = []
    for gpu in topo.gpus:
        level, nics = topo.closest(gpu)
        if level is None:
            continue
        if level == SYS:
            notes.append(
                f"{gpu.name} ({gpu.function.bdf}) has no RDMA device closer than SYS: its "
                "network traffic crosses the CPUs' interconnect, without GPUDirect RDMA"
            )
            continue
        chosen.extend(nic for nic in nics if nic not in chosen)
    if not topo.gpus:
        notes.append("no GPU: every active RDMA port is named")
        chosen = [*topo.for_jobs(), *topo.others]
    if not chosen:
        chosen = topo.for_jobs()
    chosen = list(sorted_nics(chosen))
    ports = [(nic, p) for nic in chosen for p in nic.ports if p.active]
    for nic in chosen:
        if nic.ports and not any(p.active for p in nic.ports):
            notes.append(f"{nic.name} has no ACTIVE port: left out of NCCL_IB_HCA")
    variables: list[tuple[str, str]] = []
    if ports:
        variables.append(("NCCL_IB_HCA", "=" + ",".join(f"{n.name}:{p.port}" for n, p in ports)))
    else:
        notes.append("no ACTIVE RDMA port to name: NCCL_IB_HCA is not set")
    roce = [(n, p) for n, p in ports if p.roce]
    indexes = {p.gid_index for _, p in roce}
    if roce and len(indexes) == 1 and None not in indexes:
        variables.append(("NCCL_IB_GID_INDEX", str(indexes.pop())))
    elif roce:
        said = ", ".join(
            f"{n.name}:{p.port} {'none' if p.gid_index is None else p.gid_index}" for n, p in roce
        )
        notes.append(
            f"the RoCE ports' GID indexes differ or are missing ({said}): NCCL_IB_GID_INDEX is "
            "not set (NCCL 2.21 and later pick per port by NCCL_IB_ROCE_VERSION_NUM and "
            "NCCL_IB_ADDR_FAMILY)"
        )
    if socket_ifname is not None:
        variables.append(("NCCL_SOCKET_IFNAME", "=" + socket_ifname))
    elif socket_said:
        notes.append(f"NCCL_SOCKET_IFNAME is not set: {socket_said}")
    return NcclEnvironment(tuple(variables), tuple(notes))


# -- GPUDirect RDMA readiness --------------------------------------------------------------------


@dataclass(frozen=True)
class PciConfig:
    """What a function's configuration space says (lspci -vvv's lines): `readable`, the bytes
    read (64: only the header, as the kernel gives a reader without CAP_SYS_ADMIN; 256: no
    extended space); the PCI Express port type (4 root port, 5 upstream, 6 downstream switch
    port; 0 endpoint); the ACS capability and control registers (None: no ACS); ATS enabled
    (None: no ATS)."""

    readable: int
    port_type: int | None = None
    acs_cap: int | None = None
    acs_ctrl: int | None = None
    ats: bool | None = None


# ACS Control bits (PCIe Base Specification, ACS Extended Capability; pci_regs.h PCI_ACS_*),
# as lspci names them.
ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl",
            "DirectTrans")  # fmt: skip
# The ones that send a peer-to-peer request or completion up to the root complex instead of
# across the switch: P2P Request Redirect, P2P Completion Redirect, P2P Egress Control.
ACS_REDIRECTS = 1 << 2 | 1 << 3 | 1 << 5
# The kernel modules GPUDirect RDMA's registration depends on, as a snapshot records them.
GPUDIRECT_MODULES = ("nvidia_peermem", "nv_peer_mem", "amdgpu")
DMABUF_KERNEL = (5, 12)  # ib_umem_dmabuf: drivers/infiniband/core/umem_dmabuf.c, Linux 5.12
DMABUF_RDMA_CORE = 34  # ibv_reg_dmabuf_mr(3), rdma-core 34


def acs_text(ctrl: int) -> str:
    """lspci's ACSCtl line: 'SrcValid+ TransBlk- ReqRedir+ ...'."""
    return " ".join(f"{name}{'+' if ctrl >> i & 1 else '-'}" for i, name in enumerate(ACS_BITS))


@dataclass(frozen=True)
class GpuDirectFacts:
    """What GPUDirect RDMA depends on beyond the topology. None: could not be told (a capture
    without it). `peermem`: nvidia-peermem (or MLNX_OFED's nv_peer_mem) loaded; `nvidia_open`:
    the NVIDIA driver is the open kernel module (its /proc/driver/nvidia/version says so),
    which dma-buf needs; `amdgpu`: loaded; `kernel`: (major, minor); `rdma_core`: major
    version; `iommu`: whether the kernel has IOMMU groups; `iommu_types`: group -> type;
    `configs`: PCI address -> its configuration space, for the GPUs, the RDMA devices and the
    bridges between them."""

    peermem: bool | None
    nvidia_open: bool | None
    amdgpu: bool | None
    kernel: tuple[int, int] | None
    rdma_core: int | None
    iommu: bool | None
    iommu_types: dict[int, str | None]
    configs: dict[str, PciConfig | None]


OK, WARN, FAIL, UNKNOWN = "ok", "warn", "FAIL", "unknown"


@dataclass(frozen=True)
class GdrFinding:
    """One line of the readiness: its status, what it is about, what was found, the fix."""

    status: str
    subject: str
    said: str
    fix: str | None = None
    # what it is about, for a program: registration, no_rdma, distance, acs, iommu, link
    kind: str = ""


def _tagged(kind: str, findings) -> list[GdrFinding]:
    import dataclasses

    return [dataclasses.replace(f, kind=kind) for f in findings]


def between(a: PciFunction, b: PciFunction) -> tuple[str, ...]:
    """The bridges a peer-to-peer transfer between `a` and `b` crosses below the one they
    share (their ingress and egress ports), nearest to `a` first; () when they share none
    below the host bridge but their root ports (then it is the root ports')."""
    common = set(a.bridges).intersection(b.bridges)
    if not common:
        return a.bridges[-1:] + b.bridges[-1:]
    below_a = next(i for i, bdf in enumerate(a.bridges) if bdf in common)
    below_b = next(i for i, bdf in enumerate(b.bridges) if bdf in common)
    return a.bridges[:below_a] + tuple(reversed(b.bridges[:below_b]))


def judge_gpudirect(
    topo: Topology, facts: GpuDirectFacts, only: str | None = None, level: str = GDR_DEFAULT_LEVEL
) -> list[GdrFinding]:
    """Whether GPUDirect RDMA can work between each GPU and its closest RDMA device: memory
    registration (peermem or dma-buf), the distance, ACS on the bridges between them, the
    IOMMU, and each one's PCIe link. `only`: the GPUs that RDMA device is closest to, with
    it (doctor's port), and the links of those two. `level`: the farthest distance that is
    not a warning (NCCL's default GDR level)."""
    if not topo.gpus:
        return []
    found = _tagged("registration", _registration(topo, facts))
    linked = []
    for gpu in topo.gpus:
        distance_to, nics = topo.closest(gpu)
        if only is not None:
            nics = tuple(n for n in nics if n.name == only)
            if not nics:
                continue
        if distance_to is None:
            said = "no RDMA device with a PCI function"
            found.append(GdrFinding(FAIL, gpu.name, said, kind="no_rdma"))
            continue
        nic = nics[0]
        linked += [gpu, nic]
        pair = f"{gpu.name}-{nic.name}"
        said = [*_tagged("acs", _acs(pair, gpu.function, nic.function, facts)),
                *_tagged("iommu", _iommu(pair, gpu.function, nic.function, facts))]  # fmt: skip
        if RANK[distance_to] > RANK[level]:
            said.insert(0, GdrFinding(
                WARN, pair,
                f"{distance_to}: farther than {level}, so NCCL sends the data through "
                "host memory",
                "put the GPU and the NIC under one PCIe switch, or allow it with "
                f"NCCL_NET_GDR_LEVEL={distance_to} where the CPU forwards peer-to-peer well",
                kind="distance",
            ))  # fmt: skip
        # what holds, on one line; each thing that does not, on its own
        fine = [f.said for f in said if f.status == OK]
        found.append(GdrFinding(OK, pair, "; ".join([distance_to, *fine]), kind="path"))
        found.extend(f for f in said if f.status != OK)
    for item in (*topo.gpus, *topo.nics) if only is None else dict.fromkeys(linked):
        found.extend(_tagged("link", _link(item.name, item.function, isinstance(item, Gpu))))
    return found


def _registration(topo: Topology, facts: GpuDirectFacts):
    vendors = {g.function.vendor_name for g in topo.gpus}
    kernel_ok = None if facts.kernel is None else facts.kernel >= DMABUF_KERNEL
    if "NVIDIA" in vendors:
        if facts.peermem:
            yield GdrFinding(OK, "registration", "nvidia-peermem is loaded")
        elif kernel_ok and facts.nvidia_open and (facts.rdma_core or 0) >= DMABUF_RDMA_CORE:
            yield GdrFinding(OK, "registration", "dma-buf: the open NVIDIA kernel module, "
                             f"Linux {facts.kernel[0]}.{facts.kernel[1]}, rdma-core "
                             f"{facts.rdma_core}")  # fmt: skip
        elif facts.peermem is None:
            yield GdrFinding(UNKNOWN, "registration", "the kernel modules are not in this "
                             "capture: nvidia-peermem loaded or not cannot be told")  # fmt: skip
        else:
            why = [
                *(["the NVIDIA driver is not the open kernel module"]
                  if facts.nvidia_open is False else []),
                *([f"Linux {facts.kernel[0]}.{facts.kernel[1]} is older than 5.12"]
                  if kernel_ok is False else []),
                *([f"rdma-core {facts.rdma_core} is older than 34"]
                  if facts.rdma_core is not None and facts.rdma_core < DMABUF_RDMA_CORE else []),
            ]  # fmt: skip
            said = "nvidia-peermem is not loaded"
            said += f" and dma-buf cannot be used ({'; '.join(why)})" if why else ""
            yield GdrFinding(FAIL, "registration", said, "modprobe nvidia-peermem (and add "
                             "it to /etc/modules-load.d)")  # fmt: skip
    if "AMD" in vendors:
        if facts.amdgpu and kernel_ok:
            yield GdrFinding(OK, "registration", "dma-buf: amdgpu on Linux "
                             f"{facts.kernel[0]}.{facts.kernel[1]}")  # fmt: skip
        elif facts.amdgpu is None or kernel_ok is None:
            yield GdrFinding(UNKNOWN, "registration", "amdgpu and the kernel cannot be told")
        else:
            said = "amdgpu is not loaded or the kernel is older than 5.12: no dma-buf"
            yield GdrFinding(FAIL, "registration", said, "load amdgpu (ROCm's driver)")


def _acs(pair: str, a: PciFunction, b: PciFunction, facts: GpuDirectFacts):
    unreadable, redirecting = [], []
    for bdf in between(a, b):
        config = facts.configs.get(bdf)
        if config is None or config.readable <= 256:
            unreadable.append((bdf, config))
        elif config.acs_ctrl is not None and config.acs_ctrl & ACS_REDIRECTS:
            redirecting.append((bdf, config.acs_ctrl))
    for bdf, ctrl in redirecting:
        yield GdrFinding(
            FAIL, pair,
            f"ACS on bridge {bdf} sends peer-to-peer traffic up to the root complex "
            f"(ACSCtl: {acs_text(ctrl)})",
            f"setpci -s {bdf} ECAP_ACS+0x6.w=0000 (until reboot), or turn ACS off in the "
            "firmware setup",
        )  # fmt: skip
    if unreadable:
        bdfs = ", ".join(bdf for bdf, _ in unreadable)
        if any(c is not None and c.readable == 64 for _, c in unreadable):
            why, fix = "only the header is readable without CAP_SYS_ADMIN", "run it as root"
        elif any(c is not None for _, c in unreadable):
            why, fix = "no extended configuration space (a VM without it?)", None
        else:
            why, fix = "their configuration space is not there", None
        yield GdrFinding(UNKNOWN, pair, f"ACS of {bdfs}: {why}", fix)
    elif not redirecting and between(a, b):
        yield GdrFinding(OK, pair, "no ACS redirect between them")


def _iommu(pair: str, a: PciFunction, b: PciFunction, facts: GpuDirectFacts):
    if facts.iommu is None:
        return
    if not facts.iommu:
        yield GdrFinding(OK, pair, "no IOMMU")
        return
    types = {facts.iommu_types.get(f.iommu_group) if f.iommu_group is not None else None
             for f in (a, b)}  # fmt: skip
    if types <= {"identity"}:
        yield GdrFinding(OK, pair, "IOMMU passthrough")
    elif None in types:
        yield GdrFinding(UNKNOWN, pair, "the IOMMU's mode cannot be told (Linux before 5.11 "
                         "has no group type)")  # fmt: skip
    else:
        ats = facts.configs.get(b.bdf)
        said = f"the IOMMU translates DMA ({', '.join(sorted(t for t in types if t))})"
        if ats is not None and ats.ats:
            said += f"; ATS is on at {b.bdf}, so translated requests may still go direct"
        yield GdrFinding(WARN, pair, said, "boot with iommu=pt (intel_iommu=on iommu=pt, or "
                         "amd_iommu=on iommu=pt)")  # fmt: skip


def _link(name: str, fn: PciFunction, gpu: bool):
    link = fn.link
    if link is None or not link.degraded:
        return
    narrower = (link.current_width or 0) < (link.max_width or 0)
    now = f"x{link.current_width} at {link.current_speed} of x{link.max_width} at {link.max_speed}"
    if gpu and not narrower:
        yield GdrFinding(OK, name, f"link {now}: a GPU slows its link when idle; check it under "
                         "load")  # fmt: skip
        return
    yield GdrFinding(WARN, name, f"link trained below its maximum: {now}",
                     "reseat the card or cable, check the slot's lanes and its setting in the "
                     "firmware")  # fmt: skip

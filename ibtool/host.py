"""One facade over the sources: selection by DEV[/PORT], per-device fault isolation, merging.

The sources are sysfs (always), verbs (only with details on the live host) and RDMA netlink
(on the live host, for what sysfs does not show; one session per run, opened on first use).
Each is passed in, so a snapshot or a test gives its own.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ibtool.errors import (
    DataError,
    IbtoolError,
    NoDevicesError,
    NotFoundError,
    NotLiveError,
    UnsupportedError,
)
from ibtool.model.names import parse_selector
from ibtool.model.records import CounterSample, Device, Gid, LinkLayer, PKey, Port
from ibtool.model.system import (
    Dcb,
    FilterRule,
    Ipv4Conf,
    MemLock,
    Numa,
    PciLink,
    Process,
    RoceDefaults,
    Route,
)
from ibtool.sources.sysfs.fs import DISK
from ibtool.sources.sysfs.infiniband import PORT_DETAILS, PORT_FIELDS, PORT_NETDEV, SysfsSource
from ibtool.sources.sysfs.rooted import RootedFiles
from ibtool.sources.sysfs.stack import StackFiles, module_sign

if TYPE_CHECKING:  # a scan's records are loaded only by a scan
    from ibtool.model.fabric import (
        Bounds,
        Cable,
        CountersRead,
        Fabric,
        Route,
        SmScan,
        SubnetManager,
    )
    from ibtool.model.topo import GpuDirectFacts, Topology

# What `ibtool port` shows without -d: state, rate, LIDs and the netdev, all from sysfs.
PORT_SHOWN = PORT_FIELDS + PORT_NETDEV
# What `ibtool topo` reads of a port: enough to name it in NCCL_IB_HCA.
TOPO_PORT_FIELDS = ("state", "link_layer", "netdev")


def read_comm(pid: int) -> str | None:
    """A process's name as /proc/PID/comm has it (what rdma prints); None once it has exited."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().rstrip("\n")
    except OSError:
        return None


def open_verbs():
    from ibtool.sources.verbs import VerbsSource

    return VerbsSource()


class Host:
    def __init__(
        self,
        root: str = "/",
        warn: Callable[[str], None] | None = None,
        details: bool = False,
        *,
        sysfs: SysfsSource | None = None,
        netlink: Callable[[], Any] | None = None,
        verbs: Callable[[], Any] | None = None,
        release: str | None = None,
        live: bool | None = None,
        not_live: str = "--root trees hold only sysfs",
        comm: Callable[[int], str | None] | None = None,
        rtnetlink: Callable[[], Any] | None = None,
        iproute: Callable[[], Any] | None = None,
        run: Callable[[list], Any] | None = None,
        saved_fabric: tuple | None = None,
        fs: Any = None,
        gpudirect: dict | None = None,
    ):
        """`sysfs`: the source to read instead of root's (tests give the live host a tree);
        `netlink`, `verbs`: what opens an RDMA netlink client and the verbs source (default:
        the running kernel's, and neither under --root); `release`: the kernel release to go
        by (default: the running one's); `live`: whether this is the running kernel, which
        can be changed (default: no --root); `not_live`: why it cannot, when not; `comm`:
        the name of a process by pid (default: /proc's); `rtnetlink`: what opens a
        NETLINK_ROUTE socket for DCB, `iproute`: what opens a pyroute2 IPRoute for routes,
        `run`: what runs nft and iptables-save (argv -> (status, stdout, stderr), None when
        not installed); each defaults to the running kernel's, and none under --root.
        `saved_fabric`: a snapshot's fabric scan (the fabric, its counters, its SMs), which
        the fabric methods answer from instead of MADs. `fs`: where the files under the root
        are read from (ibtool.sources.sysfs.fs; default: the disk). `gpudirect`: a
        snapshot's record of the GPUDirect modules and rdma-core (snapshot.save's)."""
        self.warn = warn or (lambda message: None)
        self.root = root
        self.details = details
        self.live = root == "/" if live is None else live
        self.not_live = not_live
        self.fs = fs or DISK
        self._sysfs = sysfs or SysfsSource(root, self.warn, fs=self.fs)
        self._stack = StackFiles(root, self.fs)
        self._netlink = None
        if netlink is not None or self.live:
            from ibtool.sources.netlink.session import NetlinkSession, open_nldev

            self._netlink = NetlinkSession(
                netlink or open_nldev, self.warn, self.note, self.kernel_before
            )
        self._open_verbs = verbs if verbs is not None or not self.live else open_verbs
        self._release = release
        self._comm = comm
        self._rtnetlink = rtnetlink
        self._iproute = iproute
        self._run = run
        self._saved_fabric = saved_fabric
        self._gpudirect_recorded = gpudirect
        self._files: RootedFiles | None = None
        self._verbs: Any = None
        self._verbs_error: IbtoolError | None = None

    def close(self) -> None:
        """Ends the run's netlink session, if one was opened."""
        if self._netlink is not None:
            self._netlink.close()

    # -- the running kernel ------------------------------------------------------------------

    def require_live(self, what: str, hint: str | None = None) -> None:
        """The one check for what only the running kernel can do: NotLiveError (a usage
        error) under --root or on a snapshot, saying what was asked and why this host cannot."""
        if not self.live:
            raise NotLiveError(f"{what}; {self.not_live}", hint)

    def netlink(self, what: str, hint: str | None = None):
        """The run's RDMA netlink session, for what only netlink answers; NotLiveError where
        there is none (a --root tree)."""
        if self._netlink is None:
            raise NotLiveError(f"{what}; {self.not_live}", hint)
        return self._netlink

    @property
    def netlink_session(self):
        """The netlink session, or None where there is no netlink (a --root tree)."""
        return self._netlink

    def comm(self, pid: int) -> str | None:
        """The name of the process `pid` (the holder of an RDMA object); None once it exited."""
        return (self._comm or read_comm)(pid)

    def kernel_release(self) -> str:
        return self._release if self._release is not None else os.uname().release

    def kernel_version(self) -> tuple[int, int] | None:
        """(major, minor) of the kernel release; None when it does not start with a version
        (a custom build)."""
        m = re.match(r"(\d+)\.(\d+)", self.kernel_release())
        return None if m is None else (int(m.group(1)), int(m.group(2)))

    def kernel_before(self, major: int, minor: int) -> bool:
        """Whether the running kernel is older than major.minor; False when its release string
        does not start with a version (a custom build): the kernel's answer decides then."""
        version = self.kernel_version()
        return version is not None and version < (major, minor)

    # -- selection ---------------------------------------------------------------------------

    def select(self, selector: str | None) -> list[tuple[str, int | None]]:
        """The (device, port) pairs a selector names; port None means every port."""
        names = self._sysfs.device_names()
        if not selector:
            return [(n, None) for n in names]
        name, port = parse_selector(selector)
        if name not in names:
            raise NotFoundError(f"unknown device {name!r}", f"devices here: {', '.join(names)}")
        if port is not None:
            ports = self._sysfs.port_numbers(name)
            if port not in ports:
                have = ", ".join(f"{name}/{p}" for p in ports) or "none"
                raise NotFoundError(f"{name} has no port {port}", f"ports of {name}: {have}")
        return [(name, port)]

    def add_link(self, name: str, link_type: str, netdev: str) -> None:
        """A software RDMA device (rxe, siw) `name` on `netdev`, as `rdma link add` makes it;
        the running kernel only."""
        from ibtool.sources import links

        nl = self._link_session("add")
        since = self.kernel_before(*links.LINK_SINCE)
        links.add(nl, self.kernel_release(), since, name, link_type, netdev)

    def delete_link(self, name: str) -> None:
        """Deletes the software RDMA device `name`, as `rdma link delete`; the running kernel
        only."""
        from ibtool.sources import links

        nl = self._link_session("delete")
        links.delete(nl, self.kernel_release(), self.kernel_before(*links.LINK_SINCE), name)

    def _link_session(self, verb: str):
        what = f"link {verb} changes the running kernel"
        self.require_live(what)
        return self.netlink(what)

    # -- the RDMA stack ----------------------------------------------------------------------

    def stack_captured(self) -> bool:
        """Whether module state can be told here: always on the running kernel; a --root tree
        or a snapshot only when it holds /sys/module or the uverbs class."""
        return self.live or self._stack.captured()

    def module_loaded(self, module: str) -> tuple[bool, str]:
        """Whether kernel module `module` (or its built-in function) is there, and the file
        that tells (relative to the root: /sys/module/NAME, or the class it registers)."""
        return self._stack.module_loaded(module), module_sign(module)

    def uverbs_abi(self) -> str | None:
        """The uverbs ABI version user space needs; None without ib_uverbs."""
        return self._stack.uverbs_abi()

    def uverbs_devices(self) -> dict[str, str]:
        """RDMA device -> its uverbs char device name (uverbsN)."""
        return self._stack.uverbs_devices()

    def device_node_missing(self, uverbs: str) -> bool:
        """Whether /dev/infiniband/`uverbs` is missing on the running kernel (udev did not make
        it); False where there is no /dev to look at (a --root tree, a snapshot)."""
        return self.root == "/" and not os.path.exists(f"/dev/infiniband/{uverbs}")

    # -- names -------------------------------------------------------------------------------

    def device_names(self) -> list[str]:
        """The RDMA devices' names, in natural order (mlx5_2 before mlx5_10)."""
        return self._sysfs.device_names()

    def port_numbers(self, device: str) -> list[int]:
        """The port numbers of `device`, in order."""
        return self._sysfs.port_numbers(device)

    def port(self, device: str, port: int, fields: tuple[str, ...] | None = None) -> Port:
        """One port as sysfs shows it, with `fields` only (default: every field sysfs has)."""
        return self._sysfs.port(device, port, fields)

    def vlans(self) -> dict[str, tuple[int, str]]:
        """VLAN netdev -> (VLAN id, lower netdev), for the GID rule's VLAN match."""
        return self._sysfs.vlans()

    # -- records -----------------------------------------------------------------------------

    def devices(self, selector: str | None = None) -> list[Device]:
        devices = [
            self._sysfs.device(name, details=self.details) for name, _ in self.select(selector)
        ]
        if not self._merging():
            return devices
        merger = self._netlink.merger()
        return [merger.device(d) for d in devices]

    def ports(
        self, selector: str | None = None, fields: tuple[str, ...] | None = None
    ) -> list[Port]:
        """Ports with `fields` read from sysfs (default: what `port` shows, with -d the details
        too); a command that shows less asks for less, and so warns only about what it shows."""
        if fields is None:
            fields = PORT_SHOWN + (PORT_DETAILS if self.details else ())
        ports = []
        for name, port in self.select(selector):
            numbers = [port] if port is not None else self._sysfs.port_numbers(name)
            ports.extend(self._with_verbs(self._sysfs.port(name, p, fields)) for p in numbers)
        if not self._merging():
            return ports
        merger = self._netlink.merger()
        return [merger.port(p) for p in ports]

    def _merging(self) -> bool:
        """Under -d with netlink, devices and ports are what netlink says where it answers,
        sysfs (and verbs) for the rest, each field with its source. Without -d: sysfs alone,
        which needs no netlink library and is as fast as a directory walk."""
        return self.details and self._netlink is not None

    def gids(self, selector: str | None = None) -> list[Gid]:
        gids = []
        for name, port in self.select(selector):
            numbers = [port] if port is not None else self._sysfs.port_numbers(name)
            iwarp = self.is_iwarp(name)
            for p in numbers:
                link_layer = self._sysfs.link_layer(name, p)
                gids.extend(self._sysfs.gids(name, p, link_layer, iwarp=iwarp))
        return gids

    def counters(self, selector: str | None = None) -> list[CounterSample]:
        """Counters of the selected ports; with a whole device, its device-wide ones too.

        sysfs gives the PMA and driver counters; on the live host netlink STAT_GET adds the
        driver counters sysfs does not show: enabled optional counters (never in sysfs) and,
        where sysfs lacks hw_counters/, all of them."""
        samples = []
        netlink = self._netlink.counter_reader() if self._netlink is not None else None
        for name, port in self.select(selector):
            if port is None:
                samples.extend(self._sysfs.counters(name, 0))
            numbers = [port] if port is not None else self._sysfs.port_numbers(name)
            for p in numbers:
                port_samples = self._sysfs.counters(name, p)
                samples.extend(port_samples)
                if netlink is not None:
                    samples.extend(netlink.extra(name, p, port_samples))
        return samples

    def note(self, message: str) -> None:
        """A diagnostic that matters only to someone asking for details (-d)."""
        if self.details:
            self.warn(message)

    def incarnation(self, device: str) -> int | None:
        """What tells a device from one re-created under its name (None: gone)."""
        return self._sysfs.incarnation(device)

    def carrier_changes(self, netdev: str) -> int | None:
        """How often a netdev's carrier went up or down since it was created (None: unknown)."""
        return self._sysfs.carrier_changes(netdev)

    def is_iwarp(self, device: str) -> bool:
        return self._sysfs.iwarp(device)

    def roce_gid_index(self, device: str, port: int, gids: list[Gid] | None = None) -> int | None:
        """The GID index the data path uses on a RoCE port (the `gids --best` rule), or None
        for an InfiniBand port, which is addressed by LID. `gids`: the port's, as gids() just
        read them, not read again (an iWARP port's are: gids() leaves out their RoCE type)."""
        from ibtool.model.gidrule import best_gid

        p = self._sysfs.port(device, port, ("link_layer", "netdev"))
        if p.link_layer != LinkLayer.ETHERNET:
            return None
        if gids is None or self.is_iwarp(device):
            gids = list(self._sysfs.gids(device, port, p.link_layer))
        return best_gid(gids, {(device, port): p}, self._sysfs.vlans(), p.netdev or "").index

    def pkey(self, device: str, port: int, index: int, *, asked: bool = True) -> PKey:
        """Slot `index` of the port's P_Key table, for the data path's QPs. `asked`: the
        operator chose it, so an index outside the table, an empty slot (0x0000: no
        partition) or a port without a table is a NotFoundError naming the table and its
        populated slots, and an unreadable slot a DataError; not asked (the default, 0), the
        slot is what it is (value None when there is none)."""
        slots, entries = self._sysfs.pkey_table(device, port)
        found = next((k for k in entries or () if k.index == index), None)
        if found is not None and found.value is not None or not asked:
            return found or PKey(index, None)
        table = os.path.join(self._sysfs.class_dir, device, "ports", str(port), "pkeys")
        where = f"{device}/{port}"
        if found is not None:
            raise DataError(f"cannot read P_Key index {index} of {where} ({table}/{index})")
        usable = [k for k in entries or () if k.value is not None]
        hint = (
            "populated: " + ", ".join(f"index {k.index} ({k.hex})" for k in usable)
            if usable
            else "no slot of it is populated"
        )
        if slots is None:
            raise NotFoundError(f"{where} has no P_Key table ({table} is absent)", hint)
        if index >= slots:
            raise NotFoundError(
                f"{where} has no P_Key index {index}: {table} has {slots} "
                f"slot{'s' * (slots != 1)} (0..{slots - 1})",
                hint,
            )
        raise NotFoundError(
            f"P_Key index {index} of {where} is empty ({table}/{index}: 0x0000)", hint
        )

    # -- verbs (details only) ----------------------------------------------------------------

    def verbs(self):
        """The verbs source, or None after one warning saying what is missing."""
        if self._verbs is None and self._verbs_error is None:
            if self._open_verbs is None:
                self._verbs_error = IbtoolError("verbs details need the live host, not --root")
            else:
                try:
                    self._verbs = self._open_verbs()
                except IbtoolError as e:
                    self._verbs_error = e
            if self._verbs_error is not None:
                e = self._verbs_error
                self.warn(f"-d: {e.message}" + (f" (hint: {e.hint})" if e.hint else ""))
        return self._verbs

    def device_caps(self, name: str) -> dict[str, Any] | None:
        verbs = self.verbs()
        if verbs is None:
            return None
        try:
            return verbs.device_caps(name)
        except IbtoolError as e:
            self.warn(e.message)
            return None

    def _with_verbs(self, port: Port) -> Port:
        if not self.details or self.verbs() is None:
            return port
        try:
            attrs = self._verbs.port_attrs(port.device, port.port)
        except IbtoolError as e:
            self.warn(e.message)
            return port
        return dataclasses.replace(
            port,
            active_mtu=attrs["active_mtu"],
            max_mtu=attrs["max_mtu"],
            # not in the snapshots of ibtool before they were read
            max_vl_num=attrs.get("max_vl_num"),
            auto_path_mig=attrs.get("auto_path_mig"),
        )

    # -- the host around the devices (what `doctor` checks) -----------------------------------

    def _rooted(self) -> RootedFiles:
        """The files under the root outside the RDMA class (/proc, configfs, /etc), read
        bounded and never through a link out of the root; one warning per file per run."""
        if self._files is None:
            self._files = RootedFiles(self.root, self.warn, fs=self.fs)
        return self._files

    def ipv4_conf(self, netdev: str) -> Ipv4Conf:
        """The IPv4 sysctls of `netdev` and all/ (rp_filter, arp_ignore, arp_announce,
        accept_local) from /proc/sys/net/ipv4/conf; the `effective_*` properties are what the
        kernel goes by. Unreadable values are None, each warned about."""
        from ibtool.sources.proc import ProcFiles

        return ProcFiles(self._rooted()).ipv4_conf(netdev)

    def roce_defaults(self, device: str, port: int) -> RoceDefaults:
        """The RoCE mode and ToS the RDMA CM gives connections on device/port, from configfs
        (/sys/kernel/config/rdma_cm/DEV/ports/PORT/default_roce_{mode,tos}). Never creates
        the configfs directory: without it, configured is False, mode and tos None, and the
        kernel's defaults apply (cma.c cma_add_one: RoCE v2 where the port supports it, ToS
        0; RoceDefaults.effective_mode / effective_tos). `mounted` says whether configfs is
        mounted (None: cannot be told), `rdma_cm` whether rdma_cm's directory is there."""
        from ibtool.sources.configfs import roce_defaults

        return roce_defaults(self._rooted(), device, port)

    def pci_links(self, device: str) -> tuple[PciLink, ...]:
        """The PCIe links from the device's PCI function up through every bridge to the root
        port, nearest first (current and max speed and width as sysfs prints them); () for a
        device without a PCI function (rxe, siw) or whose device link leads out of the root."""
        from ibtool.sources.sysfs.pci import PciFiles

        return PciFiles(self._rooted()).links(device)

    def numa(self, device: str) -> Numa:
        """The NUMA node (None: -1, no node) and local CPUs of the device's PCI function."""
        from ibtool.sources.sysfs.pci import PciFiles

        return PciFiles(self._rooted()).numa(device)

    def topology(self, gid_indexes: bool = True) -> Topology:
        """The GPUs (by PCI vendor and class, from /sys/bus/pci/devices) and the RDMA devices
        with a PCI function, each with where it sits in the PCIe tree, and the devices'
        ports; `gid_indexes`: each RoCE port's --best GID index too (what `--nccl` needs).
        A tree without /sys/bus/pci has no GPUs; no RDMA device is not an error here."""
        from ibtool.model.topo import Nic, NicPort, Topology, gpus_in_bus_order, sorted_nics
        from ibtool.sources.sysfs.pci import PciFiles

        pci = PciFiles(self._rooted())
        gpus = gpus_in_bus_order(pci.describe(f) for f in pci.bus_functions() if pci.is_gpu(f))
        nics, others = [], []
        try:
            names = self.device_names()
        except NoDevicesError:
            names = []
        for name in names:
            fn = pci.function(name)
            ports = []
            for number in self._sysfs.port_numbers(name):
                p = self._sysfs.port(name, number, TOPO_PORT_FIELDS)
                roce = p.link_layer == LinkLayer.ETHERNET
                ports.append(
                    NicPort(
                        number,
                        None if p.link_layer is None else p.link_layer.label,
                        None if p.state is None else p.state.name,
                        p.netdev,
                        self.roce_gid_index(name, number) if roce and gid_indexes else None,
                    )
                )
            if fn is None:
                others.append(Nic(name, None, tuple(ports)))
            else:
                nics.append(Nic(name, pci.describe(fn), tuple(ports)))
        return Topology(gpus, sorted_nics(nics), tuple(others))

    def gpudirect(self, topo: Topology) -> GpuDirectFacts:
        """What GPUDirect RDMA depends on beyond `topo`: nvidia-peermem (or nv_peer_mem) and
        amdgpu loaded, the NVIDIA driver's flavour (/proc/driver/nvidia/version: the open
        kernel module, which dma-buf needs), the kernel and rdma-core versions (the running
        host's; a tree has none), the IOMMU groups and their types, and the configuration
        space of each GPU, RDMA device and bridge between a GPU and its closest RDMA device
        (ACS, ATS). What cannot be told is None."""
        from ibtool.model.topo import GpuDirectFacts, between
        from ibtool.sources.sysfs.pci import PciFiles

        pci = PciFiles(self._rooted())
        captured = self.stack_captured()
        recorded = self._gpudirect_recorded  # a snapshot's: its tree holds no /sys/module

        def loaded(*names: str) -> bool | None:
            if recorded is not None:
                modules = recorded["modules"]
                return None if modules is None else any(modules.get(n, False) for n in names)
            return any(self.module_loaded(n)[0] for n in names) if captured else None

        files = pci.files
        version = files.read(files.path("proc/driver/nvidia/version"), required=False)
        # a tree knows no kernel; the running one or a snapshot's recorded release does
        kernel = self.kernel_version() if self.live or self._release is not None else None
        core = None
        if recorded is not None:
            core = recorded["rdma_core"]
        elif self.live:
            from ibtool.sources.versions import rdma_core as installed

            found = installed()
            core = found[0] if found else None
        major = (core or "").split(".")[0]
        rdma_core = int(major) if major.isascii() and major.isdigit() else None
        wanted: list[str] = []
        for gpu in topo.gpus:
            _, nics = topo.closest(gpu)
            wanted.append(gpu.function.bdf)
            if nics:
                wanted += [nics[0].function.bdf, *between(gpu.function, nics[0].function)]
        configs = {bdf: pci.config(bdf) for bdf in dict.fromkeys(wanted)}
        iommu = pci.iommu_groups()
        if iommu is None and self.live:
            iommu = False  # no iommu_groups directory: no IOMMU support in this kernel
        groups = {f.iommu_group for f in (*(g.function for g in topo.gpus),
                                          *(n.function for n in topo.nics))}  # fmt: skip
        types = {g: pci.iommu_type(g) for g in groups if g is not None} if iommu else {}
        return GpuDirectFacts(
            peermem=loaded("nvidia_peermem", "nv_peer_mem"),
            nvidia_open=None if version is None else "Open Kernel Module" in version,
            amdgpu=loaded("amdgpu"),
            kernel=kernel,
            rdma_core=rdma_core,
            iommu=iommu,
            iommu_types=types,
            configs=configs,
        )

    def open_process(self, pid: int) -> tuple[str, str | None]:
        """/proc/PID/status and /proc/PID/limits of `pid` under the root, or the error that
        ends the run (sources.process.open_process): what `doctor --pid` reads first."""
        from ibtool.sources.process import open_process

        return open_process(self.root, self.warn, pid, self.fs)

    def read_process(self, pid: int, status: str, limits: str | None) -> Process:
        """What doctor judges of process `pid`, from its status and limits (open_process's)
        and its cgroup; what cannot be read is warned about and left None."""
        from ibtool.sources.process import read_process

        return read_process(self.root, self.warn, pid, status, limits, self.fs)

    def node_cpus(self, node: int) -> frozenset[int] | None:
        """The CPUs of NUMA node `node`, its cpulist ("%*pbl": Documentation/ABI/stable/
        sysfs-devices-node), read bounded under the root; None when it is not there."""
        from ibtool.sources.sysfs.pci import parse_cpulist

        files = self._rooted()
        path = files.path("sys/devices/system/node", f"node{node}", "cpulist")
        return files.parsed(path, parse_cpulist, required=False)

    def allowed_cpus(self, pid: int | None = None) -> frozenset[int] | None:
        """The CPUs process `pid` (default: this one) may run on: sched_getaffinity(2) on the
        running host, Cpus_allowed_list of /proc/PID/status (PID 'self' by default) in a
        --root tree. None when unknown (warned)."""
        from ibtool.sources.proc import ProcFiles, live_cpus_allowed

        if self.root == "/":
            return live_cpus_allowed(pid, self.warn)
        return ProcFiles(self._rooted()).cpus_allowed(pid)

    def memlock(self, pid: int | None = None) -> MemLock:
        """RLIMIT_MEMLOCK of `pid` (default: this process; /proc/self/limits under the root),
        in bytes: soft or hard None is unlimited; known=False (after a warning) when the
        file is missing or malformed."""
        from ibtool.sources.proc import ProcFiles

        return ProcFiles(self._rooted()).memlock(pid)

    def netdev_mtu(self, netdev: str) -> int | None:
        """The netdev's MTU (/sys/class/net/NETDEV/mtu); None when unreadable (warned)."""
        from ibtool.sources.proc import ProcFiles

        return ProcFiles(self._rooted()).netdev_mtu(netdev)

    def interface_addresses(self) -> list[tuple[str, str, int]]:
        """(netdev, address, prefix length) of every IPv4 address of the running kernel
        (RTM_GETADDR), for what only the whole host shows; [] under --root. OSError when
        the kernel cannot be asked."""
        if not self.live:
            return []
        from ibtool.sources.rtnetlink import ipv4_addresses

        return list(ipv4_addresses())

    def ipv4_addresses(self, netdev: str) -> tuple[str, ...]:
        """The IPv4 addresses of `netdev` that RoCE GIDs carry (the kernel adds a GID per
        address of a RoCE netdev, gid_attrs/ndevs naming it), in GID-table order: read from
        sysfs, so the same under --root. A netdev no RDMA port uses has none here."""
        found: list[str] = []
        for name in self.device_names():
            for gid in self.gids(name):
                if gid.netdev == netdev and gid.ip and "." in gid.ip and gid.ip not in found:
                    found.append(gid.ip)
        return tuple(found)

    def verbs_providers(self) -> tuple[str, ...]:
        """The libibverbs providers installed (/etc/libibverbs.d/*.driver "driver NAME"),
        sorted; () without the directory."""
        from ibtool.sources.userspace import verbs_providers

        return verbs_providers(self._rooted())

    def dcb(self, netdev: str) -> Dcb | None:
        """The netdev's DCB (PFC, DSCP to priority, trust) as `dcb` shows it, over
        NETLINK_ROUTE (RTM_GETDCB, DCB_CMD_IEEE_GET). None when the netdev has no DCB (the
        kernel answers EOPNOTSUPP: veth, rxe's netdevs), when the kernel cannot be asked
        (a --root tree: see `live`), or after a warning when the request failed."""
        if self._rtnetlink is None and not self.live:
            return None
        from ibtool.sources import rtnetlink

        return rtnetlink.read_dcb(netdev, self.warn, self._rtnetlink or rtnetlink.open_route_socket)

    def route(self, destination: str, source: str | None = None) -> Route | None:
        """The kernel's route to `destination` (an IPv4 or IPv6 address; UsageError
        otherwise), from `source` when given, as `ip route get DST [from SRC]` asks it:
        netdev, source, gateway, type. A destination without a route is type 'unreachable'
        (ENETUNREACH and the like); None under --root or when the kernel could not be asked
        (warned)."""
        if self._iproute is None and not self.live:
            return None
        from ibtool.sources import rtnetlink

        opener = self._iproute or rtnetlink.open_iproute
        return rtnetlink.read_route(destination, self.warn, opener, source)

    def udp_filters(self, port: int = 4791) -> tuple[FilterRule, ...]:
        """Netfilter rules on the input path that would drop or reject UDP to `port` (RoCE
        v2's 4791 by default): from `nft -j list ruleset`, `iptables-save` and
        `ip6tables-save` (each run for at most 5 s, its output capped), a rule with other
        conditions (a source address) included with its text. A tool not installed is no
        rule; one that fails (not root) a warning. () under --root (the rules are the
        running kernel's)."""
        if self._run is None and not self.live:
            return ()
        from ibtool.sources import firewall

        return firewall.udp_filters(port, self.warn, self._run or firewall.run_command)

    # -- the InfiniBand fabric beyond this host ----------------------------------------------

    def fabric(self, via: str | None = None, bounds: Bounds | None = None) -> Fabric:
        """The subnet as libibnetdisc discovers it through `via` (DEV[/PORT]; default: the
        first active InfiniBand port), with MADs; the running host only (a capture holds no
        fabric yet)."""
        if self._saved_fabric is not None:
            return self._saved_fabric[0]
        self.require_live(
            "the fabric is asked with MADs through an InfiniBand port",
            "run ibtool fabric on a node of the subnet, or replay a snapshot saved there with "
            "snapshot save FILE --fabric",
        )
        from ibtool.model.fabric import Bounds
        from ibtool.sources import mad

        ca, port = parse_selector(via) if via else (None, None)
        mad.check_access(self.warn)
        start = mad.choose_port(mad.local_ports(self.warn), ca, port)
        return mad.discover(start, bounds or Bounds(), self.warn)

    def cables(
        self, via: str | None = None, bounds: Bounds | None = None, counters: bool = True
    ) -> list[Cable]:
        """The cable of every InfiniBand port of this host that libibumad sees (or of `via`,
        DEV[/PORT]): both ends' PortInfo and the far node, by directed-route SMPs one hop
        out, and the far port's PMA error counters unless not `counters`; the running host
        only. [] where there is no InfiniBand port."""
        self.require_live(
            "a cable's far end is asked with MADs through this host's InfiniBand port",
            "run it on the node itself",
        )
        from ibtool.model.fabric import Bounds
        from ibtool.sources import subnet

        ca, port = parse_selector(via) if via else (None, None)
        return subnet.cables(ca, port, bounds or Bounds(), self.warn, counters)

    def subnet_manager(
        self, via: str | None = None, bounds: Bounds | None = None
    ) -> tuple[int, SubnetManager | None]:
        """The SM LID the port's PortInfo names (`via`, DEV[/PORT]; default: the first active
        InfiniBand port), and what the SM there answers for its SMInfo (None: it did not, or
        no SM LID is set, 0); the running host only."""
        self.require_live(
            "the subnet manager is asked with MADs through this host's InfiniBand port",
            "run it on the node itself",
        )
        from ibtool.model.fabric import Bounds
        from ibtool.sources import mad, subnet

        ca, port = parse_selector(via) if via else (None, None)
        mad.check_access(self.warn)
        return subnet.subnet_manager(ca, port, bounds or Bounds(), self.warn)

    def lid_route(self, dlid: int, via: str | None = None, bounds: Bounds | None = None) -> Route:
        """The route from this host's port (`via`, DEV[/PORT]; default: the first active
        InfiniBand port) to LID `dlid` hop by hop, as ibtracert walks it, without a scan of
        the subnet: by directed route out of the port, at each switch the forwarding table
        block that holds `dlid`, each hop with both ends' PortInfo; stopped, and said why, at
        a port not up, a switch with no route, a loop, more hops than a directed route holds,
        or what did not answer. The running host only."""
        self.require_live(
            "a route is walked with MADs through this host's InfiniBand port",
            "run it on the node itself",
        )
        from ibtool.model.fabric import Bounds
        from ibtool.sources import mad, subnet

        ca, port = parse_selector(via) if via else (None, None)
        mad.check_access(self.warn)
        return subnet.trace(ca, port, dlid, bounds or Bounds(), self.warn)

    def port_counters(
        self, ports: list, via: str | None = None, bounds: Bounds | None = None
    ) -> CountersRead:
        """The PMA error counters of `ports` ((node, port, LID) each: a switch's port through
        the switch's LID), asked through this host's port (`via`, DEV[/PORT]; default: the
        first active InfiniBand port) with no scan of the subnet; what did not answer, named.
        The running host only."""
        self.require_live(
            "port counters are asked with MADs through this host's InfiniBand port",
            "run it on the node itself",
        )
        from ibtool.model.fabric import Bounds
        from ibtool.sources import mad, subnet

        ca, port = parse_selector(via) if via else (None, None)
        mad.check_access(self.warn)
        return subnet.port_counters(ca, port, ports, bounds or Bounds(), self.warn)

    def fabric_counters(
        self,
        fabric: Fabric,
        bounds: Bounds | None = None,
        ports: list | None = None,
        clean: Callable | None = None,
        data: bool = True,
        pace: Callable[[], None] | None = None,
    ) -> CountersRead:
        """The PMA counters of every port of a scanned fabric that ibqueryerrors reads (or of
        `ports`, (node, port, LID) each), asked through the port the scan went out from; and
        what did not answer, named (a node whose PMA did not answer is not asked again for its
        other ports). With `clean` (given a switch's sum of its ports' counters, whether it
        holds nothing to look at), a switch whose sum is clean is not read port by port: its
        ports are left out, and the answer says which switches were left to their sum.
        Without `data`, the 64-bit data counters are not asked for (PortCountersExtended only
        where it holds 64-bit error counters): what judging errors needs, in fewer MADs.
        `pace`: called before each MAD (a rate limit's wait)."""
        from ibtool.model.fabric import Bounds
        from ibtool.sources import subnet

        wanted = fabric.counter_ports() if ports is None else ports
        if self._saved_fabric is not None:
            return self._saved_counters(wanted)
        return subnet.counters(fabric, wanted, bounds or Bounds(), self.warn, clean, data, pace)

    def _saved_counters(self, wanted: list) -> CountersRead:
        """The saved ports' counters of `wanted`, as a snapshot's fabric scan holds them."""
        from ibtool.model.fabric import CountersRead

        saved = self._saved_fabric[1] if self._saved_fabric is not None else None
        if saved is None:
            raise NotLiveError(
                "this snapshot's fabric scan holds no port counters",
                "save it with snapshot save FILE --fabric on a node of the subnet",
            )
        by_port = {(c.node, c.port): c for c in saved}
        found = [by_port[n.guid, p] for n, p, _ in wanted if (n.guid, p) in by_port]
        return CountersRead(found, [])

    def fabric_sms(
        self, fabric: Fabric, bounds: Bounds | None = None, wait: float = 10.0
    ) -> SmScan:
        """Every subnet manager of a scanned fabric: each port whose PortInfo says an SM runs
        behind it (and the one this port's SM LID names) asked for its SMInfo, as sminfo asks;
        then the master's asked again until its activity count moves, for up to `wait`
        seconds (0: not asked again)."""
        from ibtool.model.fabric import Bounds
        from ibtool.sources import subnet

        if self._saved_fabric is not None:
            if self._saved_fabric[2] is None:
                raise NotLiveError(
                    "this snapshot's fabric scan holds no subnet managers",
                    "save it with snapshot save FILE --fabric on a node of the subnet",
                )
            return self._saved_fabric[2]  # its activity count read once: not watched
        return subnet.subnet_managers(fabric, bounds or Bounds(), self.warn, wait)

    def fabric_routes(
        self, fabric: Fabric, pairs: list[tuple[int, int]], bounds: Bounds | None = None
    ) -> dict[tuple[int, int], Route]:
        """The route of each (source LID, destination LID) of `pairs` whose ends are ports of
        the scanned fabric, walked as fabric_route walks one, each switch's forwarding table
        block asked once for them all (a thousand routes through a tree cost about one block
        a switch); the running host only."""
        from ibtool.model.fabric import Bounds
        from ibtool.sources import subnet

        if self._saved_fabric is not None:
            raise NotLiveError(
                "routes are walked through the switches' forwarding tables, and a snapshot's "
                "fabric scan does not hold them",
                "run it on a node of the subnet",
            )
        return subnet.routes(fabric, pairs, bounds or Bounds(), self.warn)

    def fabric_port_reaching(
        self, targets: list[tuple[int, int]], bounds: Bounds | None = None
    ) -> str | None:
        """The local InfiniBand port (DEV/PORT) whose subnet holds `targets` ((LID, node
        GUID) each): the first active one through which one of the first few answers as that
        node, by LID-routed SMPs. None, said nowhere, where this host has no active
        InfiniBand port that libibumad sees (no rdma-core, no HCA, RoCE only) or none reaches
        them; PermissionDeniedError where the umad devices are there and not ours."""
        if not self.live or self._saved_fabric is not None:
            return None
        from ibtool.model.fabric import Bounds
        from ibtool.sources import mad, subnet

        mad.check_access(self.warn)
        try:
            # libibumad's lines about a host with no HCA are no news to this question
            found = subnet.port_reaching(targets, bounds or Bounds(), lambda line: None)
        except UnsupportedError:
            return None
        return None if found is None else f"{found.ca}/{found.port}"

    def fabric_route(
        self, fabric: Fabric, source: str, dest: str, bounds: Bounds | None = None
    ) -> Route:
        """The route from `source` to `dest` (LIDs, GUIDs or node descriptions) hop by hop, as
        ibtracert walks it: out of the source's port, then at each switch the out port its
        linear forwarding table gives for the destination LID, each table block asked once;
        stopped, and said why, at a port with no cable, a switch with no route (entry 255),
        a loop, or a switch that did not answer."""
        from ibtool.model.fabric import Bounds
        from ibtool.sources import subnet

        if self._saved_fabric is not None:
            raise NotLiveError(
                "a route is walked through the switches' forwarding tables, and a snapshot's "
                "fabric scan does not hold them",
                "run ibtool fabric route on a node of the subnet",
            )
        return subnet.route(fabric, source, dest, bounds or Bounds(), self.warn)

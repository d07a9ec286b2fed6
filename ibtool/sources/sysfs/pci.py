"""An RDMA device's PCI side: the links from its function up to the root port, and its NUMA
node and local CPUs (drivers/pci/pci-sysfs.c; Documentation/ABI/testing/sysfs-bus-pci).

    current_link_speed, max_link_speed   "%s\\n" of pci_speed_string(): "2.5 GT/s PCIe" ...
                                         "64.0 GT/s PCIe", "Unknown" (4.x kernels: "8 GT/s",
                                         "Unknown speed")
    current_link_width, max_link_width   "%u\\n" (lanes)
    numa_node                            "%d\\n", -1 without a node
    local_cpulist                        "%*pbl\\n": "0-15,32-47"
"""

from __future__ import annotations

import os
import re

from ibtool.model.system import Numa, PciLink
from ibtool.model.topo import PciConfig, PciFunction
from ibtool.sources.sysfs.rooted import RootedFiles

_BDF_RE = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HOST_BRIDGE_RE = re.compile(r"pci[0-9a-f]{4,}:[0-9a-f]{2}")
_SPEED_RE = re.compile(r"\d+(\.\d+)? GT/s( PCIe)?")
_UNKNOWN_SPEEDS = ("Unknown", "Unknown speed")
# A PCIe link has at most 32 lanes (x32 in the spec); widths the kernel prints are below 256.
_MAX_WIDTH = 255
# Bridges above a function: a real hierarchy has a few switches at most.
_MAX_DEPTH = 16
# A CPU number the kernel prints (NR_CPUS is at most 8192 in current configs).
MAX_CPU = 1 << 16


def parse_cpulist(text: str) -> frozenset[int]:
    """'0-3,8,10-11' (bitmap_print_to_pagebuf's list form) -> {0, 1, 2, 3, 8, 10, 11}; an
    empty list is the empty set."""
    cpus: set[int] = set()
    if not text.strip():
        return frozenset()
    for part in text.strip().split(","):
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(text)
        lo, hi = int(first), int(last) if sep else int(first)
        if lo > hi or hi >= MAX_CPU:
            raise ValueError(text)
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def _hex(digits: int):
    """A parser of what pci-sysfs.c prints: "0x%04x" (vendor, device), "0x%06x" (class)."""
    pattern = re.compile(f"0x[0-9a-f]{{{digits}}}")

    def parse(text: str) -> int:
        if not pattern.fullmatch(text):
            raise ValueError(text)
        return int(text, 16)

    return parse


_ID = _hex(4)
_CLASS = _hex(6)


def _parse_speed(text: str) -> str | None:
    if text in _UNKNOWN_SPEEDS:
        return None
    if not _SPEED_RE.fullmatch(text):
        raise ValueError(text)
    return text


def _parse_width(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) > _MAX_WIDTH:
        raise ValueError(text)
    return int(text)


def _parse_node(text: str) -> int | None:
    if text == "-1":
        return None
    if not text.isascii() or not text.isdigit() or int(text) > MAX_CPU:
        raise ValueError(text)
    return int(text)


class PciFiles:
    """The PCI facts of the RDMA devices under a root, read through `files`."""

    def __init__(self, files: RootedFiles) -> None:
        self.files = files

    def function(self, device: str) -> str | None:
        """The device's PCI function directory (its `device` link resolved within the root);
        None for a device without one (rxe, siw) or whose link leads out of the root."""
        link = self.files.path("sys/class/infiniband", device, "device")
        if not self.files.fs.lexists(link):
            return None
        real = self.files.inside(link)
        if real is None or not self.files.fs.isdir(real):
            if real is not None:
                self.files.bad(link, "dangling link")
            return None
        if not _BDF_RE.fullmatch(os.path.basename(real)):
            return None  # a parent on another bus (a platform or auxiliary device)
        return real

    def links(self, device: str) -> tuple[PciLink, ...]:
        """The device's function, then every bridge above it up to the root port, nearest
        first; () without a PCI function. A hop without link attributes (conventional PCI)
        is listed with None fields."""
        fn = self.function(device)
        chain: list[PciLink] = []
        d = fn
        top = self.files.fs.realpath(self.files.root)
        while (
            d is not None
            and d != top
            and _BDF_RE.fullmatch(os.path.basename(d))
            and len(chain) < _MAX_DEPTH
        ):
            chain.append(self._link(d))
            d = os.path.dirname(d)
        return tuple(chain)

    def _link(self, d: str) -> PciLink:
        def read(name: str, parse):
            return self.files.parsed(os.path.join(d, name), parse, required=False)

        return PciLink(
            bdf=os.path.basename(d),
            current_speed=read("current_link_speed", _parse_speed),
            current_width=read("current_link_width", _parse_width),
            max_speed=read("max_link_speed", _parse_speed),
            max_width=read("max_link_width", _parse_width),
        )

    def bus_functions(self) -> list[str]:
        """Every PCI function of the host (/sys/bus/pci/devices/*, each a link to its
        directory under /sys/devices), resolved within the root, in bus order; [] without
        the directory (a tree captured without it)."""
        bus = self.files.path("sys/bus/pci/devices")
        if not self.files.fs.isdir(bus):
            return []
        found = []
        for name in sorted(self.files.listdir(bus)):
            if not _BDF_RE.fullmatch(name):
                continue
            real = self.files.inside(os.path.join(bus, name))
            if real is not None and self.files.fs.isdir(real):
                found.append(real)
        return found

    def is_gpu(self, real: str) -> bool:
        """Whether the function at `real` is a GPU by its vendor and class (two reads)."""
        pci_class = self.files.parsed(os.path.join(real, "class"), _CLASS)
        if pci_class is None:
            return False
        vendor = self.files.parsed(os.path.join(real, "vendor"), _ID)
        return PciFunction(os.path.basename(real), vendor, None, pci_class).is_gpu

    def describe(self, real: str) -> PciFunction:
        """The function whose directory is `real` (resolved within the root): its IDs, the
        bridges above it to the root port, its host bridge, NUMA node and CPUs, link,
        driver, IOMMU group and, for an SR-IOV virtual function, its physical function."""
        bridges: list[str] = []
        d = os.path.dirname(real)
        while _BDF_RE.fullmatch(os.path.basename(d)) and len(bridges) < _MAX_DEPTH:
            bridges.append(os.path.basename(d))
            d = os.path.dirname(d)
        top = os.path.basename(d)
        numa = self._numa(real)
        return PciFunction(
            bdf=os.path.basename(real),
            vendor=self.files.parsed(os.path.join(real, "vendor"), _ID),
            device=self.files.parsed(os.path.join(real, "device"), _ID),
            pci_class=self.files.parsed(os.path.join(real, "class"), _CLASS),
            bridges=tuple(bridges),
            host_bridge=top if _HOST_BRIDGE_RE.fullmatch(top) else None,
            numa=numa.node,
            cpus=numa.local_cpus,
            link=self._link(real),
            driver=self._link_name(os.path.join(real, "driver")),
            iommu_group=_group(self._link_name(os.path.join(real, "iommu_group"))),
            physfn=self._link_name(os.path.join(real, "physfn")),
        )

    def config(self, bdf: str) -> PciConfig | None:
        """The configuration space of function `bdf` (/sys/bus/pci/devices/BDF/config), read
        bounded and parsed; None when it cannot be read (warned)."""
        path = self.files.path("sys/bus/pci/devices", bdf, "config")
        real = self.files.inside(path)
        if real is None:
            return None
        try:
            data = self.files.fs.read(real, CONFIG_SIZE + 1)
        except OSError as e:
            self.files.bad(path, f"cannot read: {e.strerror or e}")
            return None
        if len(data) > CONFIG_SIZE:
            self.files.bad(path, f"larger than {CONFIG_SIZE} bytes: not read")
            return None
        return parse_config(data)

    def iommu_type(self, group: int) -> str | None:
        """An IOMMU group's domain type (/sys/kernel/iommu_groups/N/type, Linux 5.11):
        "identity" (passthrough), "DMA", "DMA-FQ" (translating), "blocked", "unmanaged";
        None before 5.11 or without it."""
        path = self.files.path("sys/kernel/iommu_groups", str(group), "type")
        text = self.files.read(path, required=False)
        return text if text and text.isascii() and text.isprintable() else None

    def iommu_groups(self) -> bool | None:
        """Whether the kernel has IOMMU groups (an IOMMU is on); None without the directory
        (a tree that did not capture it)."""
        path = self.files.path("sys/kernel/iommu_groups")
        if not self.files.isdir(path):
            return None
        return bool(self.files.listdir(path, required=False))

    def _link_name(self, path: str) -> str | None:
        """The last component of a link's target (a driver's or an IOMMU group's name);
        None without the link."""
        if not self.files.fs.islink(path):
            return None
        try:
            return os.path.basename(self.files.fs.readlink(path))
        except OSError:
            return None

    def _numa(self, fn: str) -> Numa:
        node = self.files.parsed(os.path.join(fn, "numa_node"), _parse_node)
        cpus = self.files.parsed(os.path.join(fn, "local_cpulist"), parse_cpulist)
        return Numa(node, cpus)

    def numa(self, device: str) -> Numa:
        """numa_node and local_cpulist of the device's PCI function (every PCI device has them
        on a NUMA kernel: missing ones are warned about); Numa(None, None) without one."""
        fn = self.function(device)
        if fn is None:
            return Numa(None, None)
        return self._numa(fn)


def _group(name: str | None) -> int | None:
    return int(name) if name is not None and name.isascii() and name.isdigit() else None


# -- configuration space (what lspci -vvv decodes of it) -------------------------------------------

# A PCI function's `config` file: the configuration space, little-endian. pci-sysfs.c
# pci_read_config gives a reader without CAP_SYS_ADMIN only the first 64 bytes (the header); a
# conventional function has 256, a PCI Express one 4096 (the extended space, from 0x100).
CONFIG_SIZE = 4096
HEADER_ONLY = 64
_CAP_PCIE, _EXT_ACS, _EXT_ATS = 0x10, 0x000D, 0x000F  # include/uapi/linux/pci_regs.h


def _extended(data: bytes):
    """(offset, capability ID) of each extended capability from 0x100 (PCIe Base
    Specification 7.6.3: ID in bits 15:0, the next one's offset in bits 31:20); a list that
    loops, leaves the space or reads all ones (a function gone) ends there."""
    offset, seen = (0x100 if len(data) > 0x100 else 0), set()
    while 0x100 <= offset <= len(data) - 8 and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(data[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return
        yield offset, header & 0xFFFF
        offset = header >> 20 & 0xFFC


def parse_config(data: bytes) -> PciConfig:
    """The PCI Express port type, ACS capability and control, and ATS enable, from a config
    space read: PCI_EXP_FLAGS_TYPE of the PCI Express Capability (linked from 0x34), then
    the extended capabilities from 0x100 (PCI_EXT_CAP_ID_ACS: PCI_ACS_CAP at +4, PCI_ACS_CTRL
    at +6; PCI_EXT_CAP_ID_ATS: PCI_ATS_CTRL at +6, bit 15 enable). A list that loops, or
    leaves the space, ends where it does."""
    if len(data) <= HEADER_ONLY:
        return PciConfig(readable=len(data))
    port_type = None
    status = int.from_bytes(data[6:8], "little")
    offset, seen = data[0x34] & 0xFC if status & 0x10 else 0, set()
    while 0x40 <= offset <= len(data) - 4 and offset not in seen:
        seen.add(offset)
        if data[offset] == _CAP_PCIE:
            port_type = int.from_bytes(data[offset + 2 : offset + 4], "little") >> 4 & 0xF
            break
        offset = data[offset + 1] & 0xFC
    acs_cap = acs_ctrl = ats = None
    for offset, cap_id in _extended(data):
        if cap_id == _EXT_ACS:
            acs_cap = int.from_bytes(data[offset + 4 : offset + 6], "little")
            acs_ctrl = int.from_bytes(data[offset + 6 : offset + 8], "little")
        elif cap_id == _EXT_ATS:
            ats = bool(int.from_bytes(data[offset + 6 : offset + 8], "little") & 0x8000)
    return PciConfig(len(data), port_type, acs_cap, acs_ctrl, ats)


_EXT_DSN = 0x0003  # Device Serial Number: the card's serial, which a capture leaves out


def without_serial(data: bytes) -> bytes:
    """A config space as a snapshot keeps it: the Device Serial Number capability's 8 bytes
    zeroed (a board's identity, nothing the checks read); the rest as read."""
    out = bytearray(data)
    for offset, cap_id in _extended(data):
        if cap_id == _EXT_DSN and offset + 12 <= len(out):
            out[offset + 4 : offset + 12] = bytes(8)
    return bytes(out)

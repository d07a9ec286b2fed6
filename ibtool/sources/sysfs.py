"""Reader for /sys/class/infiniband, rooted anywhere (live host, sosreport, captured tree, fixture).

Every value that cannot be read or parsed becomes None plus one warning naming the file, once per
file; one bad file or device never hides the others. Formats are those of
drivers/infiniband/core/sysfs.c (and Documentation/ABI/stable/sysfs-class-infiniband): "N: text"
enums, hex LIDs, two generations of rate strings, zero GIDs in empty slots. A value the kernel
cannot print (an LMC above 7, a LID above 16 bits, a port state no kernel defines) is warned
about and left out, never used.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
from collections.abc import Callable, Collection, Iterator

from ibtool.errors import DataError, NoDevicesError, PermissionDeniedError
from ibtool.model import counters as counterinfo
from ibtool.model.names import natural_key
from ibtool.model.records import (
    Bond,
    BondSlave,
    CounterSample,
    Device,
    Gid,
    GidType,
    LinkLayer,
    NodeType,
    PhysState,
    PKey,
    Port,
    PortState,
    Protocol,
    Rate,
)

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\s*\((\d+)X\s*([A-Z0-9]*)\)\s*$", re.ASCII)
# "%d: %s" / "%u: %s" of state, phys_state and node_type
_ENUM_RE = re.compile(r"(-?[0-9]+):")
_HEX_RE = re.compile(r"0[xX][0-9a-fA-F]+")  # "0x%x" of lid and sm_lid, "0x%08x" of cap_mask
_DECIMAL_RE = re.compile(r"-?[0-9]+")
# node_guid, sys_image_guid: "%04x:%04x:%04x:%04x"; gids/N: "%pI6", never compressed
_GUID_RE = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}")
_GID_RE = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}")
_LINK_LAYERS = {"InfiniBand": LinkLayer.INFINIBAND, "Ethernet": LinkLayer.ETHERNET}
# Omni-Path HFIs present themselves as InfiniBand CAs; only the driver tells them apart. Their
# LIDs may be wider than InfiniBand's 16 bits (ib_port_attr.lid is a u32 for OPA's extended LIDs).
_OPA_DRIVERS = frozenset({"hfi1"})
IB_LID_MAX = 0xFFFF
OPA_LID_MAX = 0xFFFFFFFF
LMC_MAX = 7  # PortInfo:LMC is 3 bits (IBTA vol. 1, 14.2.5.6)
SL_MAX = 15  # a service level is 4 bits
PKEY_MAX = 0xFFFF
# qib's sl2vl/<SL> and hfi1's sl2sc/<SL>, sc2vl/<SC>: "%u\n" (qib_sysfs.c, hfi1 sysfs.c). OPA
# has 32 SLs, SCs and VLs (5 bits); InfiniBand VLs are 4 bits.
VL_MAX = 15
OPA_SL_SC_VL_MAX = 31
# Where node_type is missing (an incomplete capture), iWARP hardware is known by the PCI driver
# its ib_device hangs off (i40iw: i40e; iw_cxgb4: cxgb4; iw_cxgb3: cxgb3) or by its hca_type
# (i40iw "I40IW", iw_cxgb4 and iw_cxgb3 the LAN driver's name, qedr "FastLinQ QL... iWARP").
_IWARP_DRIVERS = frozenset({"i40e", "cxgb4", "cxgb3"})
_IWARP_HCA_TYPES = frozenset({"I40IW", "cxgb4", "cxgb3"})
IFNAMSIZ = 16  # include/uapi/linux/if.h, with the terminating NUL

NO_DEVICES_HINT = (
    "load the adapter's driver (e.g. modprobe mlx5_ib), or create a Soft-RoCE device: "
    "rdma link add rxe0 type rxe netdev ETH"
)

Warn = Callable[[str], None]


class _Invalid(ValueError):
    """A well-formed value the kernel never prints; the message says what is wrong with it."""


# A byte that was not UTF-8 is a lone surrogate (U+DC80-U+DCFF: _read_attr decodes with
# surrogateescape, PEP 383), which repr writes as \udcNN: a warning shows the byte, \xNN.
_UNDECODED = re.compile(r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])")


def _shown(text: str) -> str:
    """A value as a warning quotes it: repr (escapes keep the warning on one line, bytes that
    were not UTF-8 as \\xNN), cut short."""
    said = repr(text) if len(text) <= 40 else f"{text[:40]!r}..."
    return _UNDECODED.sub(r"\1\\x\2", said)


def _is_number(text: str) -> bool:
    # ASCII digits only: not int()'s grammar (no sign, "_", or non-ASCII digits)
    return text.isascii() and text.isdigit()


def parse_enum_line(text: str) -> int:
    """'4: ACTIVE' -> 4 (the text after the colon differs between kernels and tools)."""
    m = _ENUM_RE.match(text)
    if m is None:
        raise ValueError(text)
    return int(m.group(1))


def parse_rate(text: str) -> Rate:
    """'100 Gb/sec (4X EDR)', '10 Gb/sec (4X)' (old kernels: no suffix means SDR)."""
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(text)
    return Rate(text=text, gbps=float(m.group(1)), lanes=int(m.group(2)), speed=m.group(3) or "SDR")


def parse_enum(cls, what: str) -> Callable[[str], object]:
    """'N: text' as a member of cls; a number the kernel does not define is _Invalid."""

    def parse(text: str):
        member = cls.parse(parse_enum_line(text))
        if member is None:
            raise _Invalid(f"{_shown(text)} is not {what} the kernel defines")
        return member

    return parse


def parse_decimal(maximum: int) -> Callable[[str], int]:
    """'%u' up to maximum."""

    def parse(text: str) -> int:
        if not _DECIMAL_RE.fullmatch(text):
            raise ValueError(text)
        value = int(text)
        if not 0 <= value <= maximum:
            raise _Invalid(f"{_shown(text)} is out of range (0..{maximum})")
        return value

    return parse


def parse_hex(maximum: int) -> Callable[[str], int]:
    """'0x%x' up to maximum."""

    def parse(text: str) -> int:
        if not _HEX_RE.fullmatch(text):
            raise ValueError(text)
        value = int(text, 16)
        if value > maximum:
            raise _Invalid(f"{_shown(text)} is out of range (0x0..{maximum:#x})")
        return value

    return parse


def parse_guid(text: str) -> str:
    if not _GUID_RE.fullmatch(text):
        raise ValueError(text)
    return text


def valid_netdev_name(name: str) -> bool:
    """What the kernel accepts as a netdev name (net/core/dev.c dev_valid_name)."""
    return (
        0 < len(name.encode()) < IFNAMSIZ
        and name not in (".", "..")
        and name.isprintable()
        and not any(c in "/:" or c.isspace() for c in name)
    )


def parse_netdev(text: str) -> str:
    if not valid_netdev_name(text):
        raise ValueError(text)
    return text


BOND_FILES = ("mode", "slaves", "active_slave")  # under /sys/class/net/BOND/bonding
BOND_SLAVE_FILES = ("state", "mii_status")  # under /sys/class/net/SLAVE/bonding_slave
BOND_SLAVE_STATES = ("active", "backup")
BOND_MII = ("up", "going down", "down", "going back")


def _parse_bond_mode(text: str) -> str:
    name, number = text.split(" ")
    if not name or not number.isdigit():
        raise ValueError(text)
    return name


def _parse_netdev_list(text: str) -> tuple[str, ...]:
    names = tuple(text.split())
    if not all(valid_netdev_name(n) for n in names) or len(set(names)) != len(names):
        raise ValueError(text)
    return names


def _parse_optional_netdev(text: str) -> str:
    return parse_netdev(text) if text else ""


def _parse_word(words: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in words:
            raise ValueError(text)
        return text

    return parse


def _printable(text: str) -> bool:
    # Bytes that were not UTF-8 are lone surrogates (_read_attr), which are not printable.
    return text.isprintable() and "\ufffd" not in text


def gid_ip(gid: str) -> str | None:
    """The IP address a RoCE GID encodes: IPv4-mapped (::ffff:a.b.c.d) or the IPv6 address."""
    if gid.startswith(_IPV4_MAPPED_PREFIX):
        raw = bytes.fromhex(gid[len(_IPV4_MAPPED_PREFIX) :].replace(":", ""))
        return str(ipaddress.IPv4Address(raw))
    return str(ipaddress.IPv6Address(bytes.fromhex(gid.replace(":", ""))))


def iwarp_hardware(driver: str | None, hca_type: str | None) -> bool:
    """iWARP by the driver or hca_type alone, for a device whose node_type cannot be read."""
    if driver in _IWARP_DRIVERS:
        return True
    return hca_type is not None and (hca_type in _IWARP_HCA_TYPES or hca_type.endswith(" iWARP"))


def _read_attr(path: str) -> str:
    # A sysfs attribute is at most one page: one read() on a raw fd, about three times
    # cheaper than a buffered text file (it matters for 10^4 GID files on SR-IOV hosts).
    # O_NONBLOCK: a FIFO in a --root tree would wait for a writer at open(); sysfs ignores it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        data = os.read(fd, 8192)
    finally:
        os.close(fd)
    return data.decode("utf-8", "surrogateescape").rstrip("\n")


# Port fields as Port names them; a command reads (and so warns about) only those it shows.
PORT_FIELDS = ("state", "physical_state", "link_layer", "rate", "lid", "sm_lid", "lmc", "sm_sl")
PORT_NETDEV = ("netdev", "bond")
# "pkeys" reads pkey_tbl_len too; "sl2vl" is what the driver shows of its SL-to-VL mapping.
PORT_DETAILS = ("cap_mask", "gid_tbl_len", "pkeys", "sl2vl")
_PORT_ATTRS: dict[str, tuple[str, Callable, bool]] = {
    # field: (file, parse, required)
    "state": ("state", parse_enum(PortState, "a port state"), True),
    "physical_state": ("phys_state", parse_enum(PhysState, "a physical port state"), True),
    "rate": ("rate", parse_rate, True),
    "lmc": ("lid_mask_count", parse_decimal(LMC_MAX), True),
    "sm_sl": ("sm_sl", parse_decimal(SL_MAX), False),
    "cap_mask": ("cap_mask", parse_hex(0xFFFFFFFF), False),  # the low 32 bits
}


class SysfsSource:
    def __init__(
        self, root: str = "/", warn: Warn | None = None, *, origin: str | None = None
    ) -> None:
        self.root = root
        self.class_dir = os.path.join(root, "sys", "class", "infiniband")
        # What the "no RDMA devices" errors name: the directory, or what it was built from
        # (a snapshot's tree is a temporary directory, gone when the error is read).
        self.origin = origin
        self.warn: Warn = warn or (lambda message: None)
        # The files warned about: one warning per file, however often it is read.
        self.warned: set[str] = set()
        self._vlans: dict[str, tuple[int, str]] | None = None
        self._drivers: dict[str, str | None] = {}

    # -- raw reads ---------------------------------------------------------------------------

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.class_dir) if path.startswith(self.class_dir) else path

    def bad(self, path: str, problem: str) -> None:
        """Warn about a file: 'DEV/ports/1/state: PROBLEM', the first time only."""
        rel = self._rel(path)
        if rel not in self.warned:
            self.warned.add(rel)
            self.warn(f"{rel}: {problem}")

    def read(self, path: str, *, required: bool = True, quiet: bool = False) -> str | None:
        """File content without the trailing newline; None (and a warning) when unreadable.

        Absent files are silent unless `required`: many attributes exist only on some drivers.
        `quiet`: a read the kernel fails on purpose (gid_attrs of empty or InfiniBand GID
        slots: EINVAL). A dangling link is never what the kernel shows: always warned about.
        """
        try:
            return _read_attr(path)
        except FileNotFoundError:
            if os.path.islink(path):
                self.bad(path, "dangling link")
            elif required:
                self.bad(path, "missing")
        except OSError as e:
            if not quiet:
                self.bad(path, f"cannot read: {e.strerror or e}")
        return None

    def parse(self, path: str, text: str, parse: Callable):
        """parse(text), or None and a warning naming the file."""
        try:
            return parse(text)
        except _Invalid as e:
            self.bad(path, str(e))
        except (ValueError, IndexError):
            self.bad(path, f"malformed value {_shown(text)}")
        return None

    def parsed(self, path: str, parse: Callable, *, required: bool = True):
        text = self.read(path, required=required)
        if text is None:
            return None
        return self.parse(path, text, parse)

    def text(self, path: str, *, empty: str | None = None) -> str | None:
        """A driver's free-text attribute (fw_ver, hca_type, board_id, ...): absent is silent, an
        empty line (rxe's fw_ver) is `empty`, text that is not one printable line is warned
        about."""
        text = self.read(path, required=False)
        if not text:
            return empty if text == "" else None
        if not _printable(text):
            self.bad(path, f"malformed value {_shown(text)}")
            return None
        return text

    def _listdir(self, path: str, *, required: bool = True) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            if os.path.islink(path):
                self.bad(path, "dangling link")
            elif required:
                self.bad(path, "missing")
        except OSError as e:
            self.bad(path, f"cannot list: {e.strerror or e}")
        return []

    # -- devices -----------------------------------------------------------------------------

    def device_names(self) -> list[str]:
        """The devices in class/infiniband; an entry that is not one (a dangling link, a plain
        file, an empty directory) is skipped with one warning."""
        where, none_hint = self.class_dir, NO_DEVICES_HINT
        if self.origin is not None:
            where, none_hint = f"{self.origin}: sys/class/infiniband", None
        try:
            entries = list(os.scandir(self.class_dir))
        except FileNotFoundError:
            raise NoDevicesError(f"no RDMA devices ({where} does not exist)", none_hint) from None
        except PermissionError as e:
            raise PermissionDeniedError(
                f"cannot list {self.class_dir}: {e.strerror}", "run as a user who can read sysfs"
            ) from None
        except OSError as e:  # e.g. a --root tree whose class/infiniband is a file
            raise DataError(
                f"cannot list {self.class_dir}: {e.strerror}",
                "--root wants a tree shaped like /: DIR/sys/class/infiniband/DEV/...",
            ) from None
        if not entries:
            raise NoDevicesError(f"no RDMA devices (empty {where})", none_hint)
        entries.sort(key=lambda e: natural_key(e.name))  # warnings in order, whatever the fs
        names = [e.name for e in entries if self._is_device(e)]
        if not names:
            raise NoDevicesError(f"no RDMA devices ({where} holds no device)", none_hint)
        return names

    def _is_device(self, entry: os.DirEntry) -> bool:
        # sysfs makes every entry a link into devices/; captures may hold directories. Only
        # what is not a link costs a system call here.
        try:
            if entry.is_dir():
                if entry.is_symlink() or os.listdir(entry.path):
                    return True
                self.bad(entry.path, "empty directory, not a device")
                return False
        except OSError:
            pass
        if entry.is_symlink() and not os.path.exists(entry.path):
            self.bad(entry.path, "dangling link, not a device")
        else:
            self.bad(entry.path, "not a directory, not a device")
        return False

    def port_numbers(self, device: str) -> list[int]:
        ports_dir = os.path.join(self.class_dir, device, "ports")
        ports = []
        for entry in self._listdir(ports_dir):
            if _is_number(entry):
                ports.append(int(entry))
            else:
                self.bad(os.path.join(ports_dir, entry), "not a port number")
        return sorted(ports)

    def device(self, name: str, *, with_ports: bool = True, details: bool = True) -> Device:
        """A device; without `details`, node_desc, hw_rev and parent are not read (dev shows
        them only with -d), and its ports are read only for the protocol and netdevs."""
        d = os.path.join(self.class_dir, name)
        node_type = self.node_type(name)
        driver = self.driver(name)
        hca_type = self.text(os.path.join(d, "hca_type"))
        numbers = self.port_numbers(name)
        ports = (
            tuple(self.port(name, p, fields=("link_layer", "netdev")) for p in numbers)
            if with_ports
            else ()
        )
        netdevs: list[str] = []
        for p in ports:
            if p.netdev and p.netdev not in netdevs:
                netdevs.append(p.netdev)
        return Device(
            name=name,
            node_type=node_type,
            protocol=self._protocol(node_type, driver, hca_type, ports),
            fw_ver=self.text(os.path.join(d, "fw_ver")),
            node_guid=self.parsed(os.path.join(d, "node_guid"), parse_guid),
            sys_image_guid=self.parsed(
                os.path.join(d, "sys_image_guid"), parse_guid, required=False
            ),
            node_desc=self.text(os.path.join(d, "node_desc"), empty="") if details else None,
            hca_type=hca_type,
            board_id=self.text(os.path.join(d, "board_id")),
            hw_rev=self.text(os.path.join(d, "hw_rev")) if details else None,
            driver=driver,
            parent=self._parent(name) if details else None,
            port_count=len(numbers),
            netdevs=tuple(netdevs),
            ports=ports,
        )

    def driver(self, name: str) -> str | None:
        """The driver of the device's bus device (the device/driver link); None for a virtual
        device (rxe, siw: no device link) or a capture without the link."""
        if name not in self._drivers:
            self._drivers[name] = self._read_driver(name)
        return self._drivers[name]

    def _read_driver(self, name: str) -> str | None:
        link = os.path.join(self.class_dir, name, "device", "driver")
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            self._check_device_link(name)
            return None
        except OSError as e:
            if e.errno == errno.EINVAL:
                self.bad(link, "not a link")
            elif not self._check_device_link(name):
                self.bad(link, f"cannot read: {e.strerror or e}")
            return None
        # ../../../bus/pci/drivers/mlx5_core; a capture may hold the link without its target.
        parent, driver = os.path.split(target.rstrip("/"))
        if os.path.basename(parent) != "drivers" or not driver:
            self.bad(link, f"not a link to a driver: {_shown(target)}")
            return None
        return driver

    def _check_device_link(self, name: str) -> bool:
        """Warn if the device's `device` entry is there but is not a link to a directory (the
        kernel's is a link to the bus device; virtual devices have none). True if it warned."""
        path = os.path.join(self.class_dir, name, "device")
        if not os.path.lexists(path):
            return False
        if not os.path.islink(path):
            self.bad(path, "not a link")
        elif not os.path.exists(path):
            self.bad(path, "dangling link")
        elif not os.path.isdir(path):
            self.bad(path, "not a link to a directory")
        else:
            return False
        return True

    def _parent(self, name: str) -> str | None:
        """rxe and siw: the netdev the device was created on."""
        path = os.path.join(self.class_dir, name, "parent")
        text = self.read(path, required=False)
        return None if text is None else self.parse(path, text, parse_netdev)

    @staticmethod
    def _protocol(
        node_type: NodeType | None, driver: str | None, hca_type: str | None, ports
    ) -> Protocol | None:
        if node_type == NodeType.RNIC:
            return Protocol.IWARP
        if node_type in (NodeType.USNIC, NodeType.USNIC_UDP):
            return Protocol.USNIC
        if node_type is None and iwarp_hardware(driver, hca_type):
            return Protocol.IWARP
        link_layer = next((p.link_layer for p in ports if p.link_layer is not None), None)
        if link_layer == LinkLayer.ETHERNET:
            return Protocol.ROCE
        if link_layer == LinkLayer.INFINIBAND:
            return Protocol.OPA if driver in _OPA_DRIVERS else Protocol.IB
        return None

    def node_type(self, device: str) -> NodeType | None:
        path = os.path.join(self.class_dir, device, "node_type")
        return self.parsed(path, parse_enum(NodeType, "a node type"))

    def iwarp(self, device: str) -> bool:
        """An iWARP device: node_type RNIC, or, without a node_type, iWARP hardware."""
        node_type = self.node_type(device)
        if node_type is not None:
            return node_type == NodeType.RNIC
        hca_type = self.text(os.path.join(self.class_dir, device, "hca_type"))
        return iwarp_hardware(self.driver(device), hca_type)

    # -- ports -------------------------------------------------------------------------------

    def link_layer(self, device: str, port: int) -> LinkLayer | None:
        path = os.path.join(self.class_dir, device, "ports", str(port), "link_layer")
        text = self.read(path)
        if text is None or text == "Unknown":
            return None
        link_layer = _LINK_LAYERS.get(text)
        if link_layer is None:
            self.bad(path, f"malformed value {_shown(text)}")
        return link_layer

    def port(self, device: str, port: int, fields: Collection[str] | None = None) -> Port:
        """A port with the given fields read (default: every one); the others are None."""
        want = set(PORT_FIELDS + PORT_NETDEV + PORT_DETAILS if fields is None else fields)
        p = os.path.join(self.class_dir, device, "ports", str(port))
        values: dict[str, object] = {}
        for name, (file, parse, required) in _PORT_ATTRS.items():
            if name in want:
                values[name] = self.parsed(os.path.join(p, file), parse, required=required)
        if "link_layer" in want:
            values["link_layer"] = self.link_layer(device, port)
        for name in ("lid", "sm_lid"):
            if name in want:
                values[name] = self._lid(device, os.path.join(p, name))
        if "netdev" in want or "bond" in want:
            netdev = self._port_netdev(device, port)
            if "netdev" in want:
                values["netdev"] = netdev
            if "bond" in want and netdev:
                values["bond"] = self.bond(netdev)
        if "gid_tbl_len" in want:
            slots = self._listdir(os.path.join(p, "gids"), required=False)
            values["gid_tbl_len"] = len(slots) or None
        if "pkeys" in want:
            values["pkey_tbl_len"], values["pkeys"] = self.pkey_table(device, port)
        if "sl2vl" in want:
            values["sl2vl"] = self._sl2vl(p)
        return Port(device=device, port=port, **values)

    def pkey_table(self, device: str, port: int) -> tuple[int | None, tuple[PKey, ...] | None]:
        """The port's P_Key table (pkeys/<i>, "0x%04x"): how many slots it has, and its
        populated slots. 0x0000 is an empty slot, no partition; an unreadable or malformed
        slot is warned about and kept with value None. (None, None): no table (absent)."""
        directory = os.path.join(self.class_dir, device, "ports", str(port), "pkeys")
        indexes = sorted(int(i) for i in self._listdir(directory, required=False) if _is_number(i))
        if not indexes:
            return None, None
        entries = []
        for index in indexes:
            value = self.parsed(os.path.join(directory, str(index)), parse_hex(PKEY_MAX))
            if value != 0:
                entries.append(PKey(index, value))
        return len(indexes), tuple(entries)

    def _sl2vl(self, port_dir: str) -> tuple[int | None, ...] | None:
        """The VL each SL goes out on: qib's sl2vl/, or hfi1's sl2sc/ then sc2vl/ (Omni-Path
        maps an SL to a service channel, the channel to a VL). None where the driver shows
        neither (mlx4, mlx5, rxe, ...: only a subnet manager query tells)."""
        direct = self._indexed(os.path.join(port_dir, "sl2vl"), VL_MAX)
        if direct is not None:
            return direct
        sl2sc = self._indexed(os.path.join(port_dir, "sl2sc"), OPA_SL_SC_VL_MAX)
        sc2vl = self._indexed(os.path.join(port_dir, "sc2vl"), OPA_SL_SC_VL_MAX)
        if sl2sc is None or sc2vl is None:
            return None
        return tuple(None if sc is None or sc >= len(sc2vl) else sc2vl[sc] for sc in sl2sc)

    def _indexed(self, directory: str, maximum: int) -> tuple[int | None, ...] | None:
        """A table of files 0..N-1 holding "%u": the values in index order (None where one is
        missing or unreadable); None when the directory is absent."""
        indexes = [int(i) for i in self._listdir(directory, required=False) if _is_number(i)]
        if not indexes:
            return None
        table: list[int | None] = [None] * (max(indexes) + 1)
        for index in indexes:
            path = os.path.join(directory, str(index))
            table[index] = self.parsed(path, parse_decimal(maximum))
        return tuple(table)

    def _lid(self, device: str, path: str) -> int | None:
        """'0x%x'; 16 bits, except on Omni-Path."""
        text = self.read(path)
        if text is None:
            return None
        lid = self.parse(path, text, parse_hex(OPA_LID_MAX))
        if lid is not None and lid > IB_LID_MAX and self.driver(device) not in _OPA_DRIVERS:
            self.bad(path, f"{_shown(text)} is out of range (0x0..{IB_LID_MAX:#x})")
            return None
        return lid

    def _port_netdev(self, device: str, port: int) -> str | None:
        d = os.path.join(self.class_dir, device)
        # GID 0 of a RoCE port is the default GID of the port's own netdev.
        path = os.path.join(d, "ports", str(port), "gid_attrs", "ndevs", "0")
        text = self.read(path, required=False, quiet=True)
        ndev = None if text is None else self.parse(path, text, parse_netdev)
        if ndev:
            return ndev
        parent = self._parent(device)  # rxe, siw
        if parent:
            return parent
        # IPoIB and iWARP netdevs: the PCI function's net/ entries, told apart by dev_port.
        net_dir = os.path.join(d, "device", "net")
        try:
            netdevs = sorted(os.listdir(net_dir))
        except OSError:
            self._check_device_link(device)
            return None
        for name in netdevs:
            path = os.path.join(net_dir, name, "dev_port")
            text = self.read(path, required=False)
            dev_port = None if text is None else self.parse(path, text, parse_decimal(0xFFFF))
            if dev_port is not None and dev_port == port - 1:
                return name
        return netdevs[0] if len(netdevs) == 1 else None

    # -- GIDs --------------------------------------------------------------------------------

    def gids(
        self, device: str, port: int, link_layer: LinkLayer | None, *, iwarp: bool = False
    ) -> Iterator[Gid]:
        """Valid GIDs of a port. iWARP GIDs are the MAC: no RoCE type, no IP, no gid_attrs."""
        p = os.path.join(self.class_dir, device, "ports", str(port))
        gids_dir = os.path.join(p, "gids")
        types_dir = os.path.join(p, "gid_attrs", "types")
        ndevs_dir = os.path.join(p, "gid_attrs", "ndevs")
        # RoCE GIDs all have a netdev; InfiniBand GIDs have none (the read fails: EINVAL).
        roce = link_layer == LinkLayer.ETHERNET and not iwarp
        indexes = sorted(int(i) for i in self._listdir(gids_dir) if _is_number(i))
        for index in indexes:
            path = os.path.join(gids_dir, str(index))
            gid = self.read(path)
            if gid is None or gid == ZERO_GID:
                continue  # unreadable (warned) or an empty slot
            if not _GID_RE.fullmatch(gid):
                self.bad(path, f"malformed GID {_shown(gid)}")
                continue
            netdev = self._gid_netdev(os.path.join(ndevs_dir, str(index)), roce)
            if iwarp:
                yield Gid(device, port, index, gid, None, netdev)
                continue
            types_path = os.path.join(types_dir, str(index))
            type_text = self.read(types_path, required=False, quiet=True)
            gid_type = self._gid_type(type_text, link_layer)
            if gid_type is None:
                self.bad(
                    types_path,
                    "unreadable" if type_text is None else f"unknown GID type {_shown(type_text)}",
                )
            vlan = self.vlans().get(netdev, (None, None))[0] if netdev else None
            ip = None if gid_type == GidType.IB else gid_ip(gid)
            yield Gid(device, port, index, gid, gid_type, netdev, vlan, ip)

    def _gid_netdev(self, path: str, expected: bool) -> str | None:
        text = self.read(path, required=False, quiet=True)
        if text is None:
            if expected:
                self.bad(path, "unreadable")
            return None
        return self.parse(path, text, parse_netdev)

    @staticmethod
    def _gid_type(text: str | None, link_layer: LinkLayer | None) -> GidType | None:
        if text == "RoCE v2":
            return GidType.ROCE_V2
        if text == "IB/RoCE v1" or (text is None and link_layer == LinkLayer.INFINIBAND):
            # The kernel prints one string for both; the port's link layer decides.
            return GidType.IB if link_layer == LinkLayer.INFINIBAND else GidType.ROCE_V1
        return None

    def vlans(self) -> dict[str, tuple[int, str]]:
        """VLAN netdev -> (VLAN id, lower netdev), from /proc/net/vlan/config (8021q's
        vlan_seq_show: two header lines, then 'NAME | VID | LOWER' per VLAN)."""
        if self._vlans is None:
            self._vlans = {}
            path = os.path.join(self.root, "proc", "net", "vlan", "config")
            text = self.read(path, required=False)
            if text is None:
                return self._vlans  # no 8021q module
            lines = text.splitlines()
            if not lines or not lines[0].startswith("VLAN Dev name"):
                self.bad(path, f"malformed value {_shown(text)}")
                return self._vlans
            malformed = None
            for line in lines[2:]:
                parts = [s.strip() for s in line.split("|")]
                if (
                    len(parts) == 3
                    and _is_number(parts[1])
                    and int(parts[1]) <= 4095
                    and valid_netdev_name(parts[0])
                    and valid_netdev_name(parts[2])
                ):
                    self._vlans[parts[0]] = (int(parts[1]), parts[2])
                elif malformed is None:
                    malformed = line
            if malformed is not None:
                self.bad(path, f"malformed line {_shown(malformed)}")
        return self._vlans

    def bond(self, netdev: str) -> Bond | None:
        """The bond `netdev` is, from its bonding/ directory; None when it is not a bond.

        bond_sysfs.c: mode "NAME NUMBER", slaves "A B ..." (an empty line without slaves),
        active_slave the name or nothing; bond_sysfs_slave.c, per slave: state "active" or
        "backup", mii_status "up", "going down", "down" or "going back"."""
        bonding = os.path.join(self.root, "sys", "class", "net", netdev, "bonding")
        if not os.path.isdir(bonding):
            return None
        mode = self.parsed(os.path.join(bonding, "mode"), _parse_bond_mode)
        names = self.parsed(os.path.join(bonding, "slaves"), _parse_netdev_list) or ()
        active = self.parsed(
            os.path.join(bonding, "active_slave"), _parse_optional_netdev, required=False
        )
        slaves = []
        for name in names:
            slave_dir = os.path.join(self.root, "sys", "class", "net", name, "bonding_slave")
            state = self.parsed(os.path.join(slave_dir, "state"), _parse_word(BOND_SLAVE_STATES))
            mii = self.parsed(os.path.join(slave_dir, "mii_status"), _parse_word(BOND_MII))
            slaves.append(BondSlave(name, state, mii))
        return Bond(netdev, mode, tuple(slaves), active or None)

    def carrier_changes(self, netdev: str) -> int | None:
        """How often the netdev's carrier went up or down since it was created
        (/sys/class/net/NETDEV/carrier_changes, Linux 3.15); None where unreadable."""
        path = os.path.join(self.root, "sys", "class", "net", netdev, "carrier_changes")
        return self.parsed(path, parse_decimal(1 << 64), required=False)

    def incarnation(self, device: str) -> int | None:
        """What tells a device from one re-created under the same name: the inode of its
        sysfs directory, which kernfs numbers anew for every directory it makes."""
        try:
            return os.stat(os.path.join(self.class_dir, device)).st_ino
        except OSError:
            return None

    # -- counters ----------------------------------------------------------------------------

    def counters(self, device: str, port: int) -> list[CounterSample]:
        """PMA PortCounters (counters/, and counters_ext/ where a kernel has it) and driver
        hw_counters/ of a port; port 0: the device-wide hw_counters. Each read of counters/ is a
        MAD to the firmware."""
        d = os.path.join(self.class_dir, device)
        if port == 0:
            return self._hw_counters(device, 0, os.path.join(d, "hw_counters"))
        p = os.path.join(d, "ports", str(port))
        return self._pma_counters(device, port, p) + self._hw_counters(
            device, port, os.path.join(p, "hw_counters")
        )

    def _pma_counters(self, device: str, port: int, port_dir: str) -> list[CounterSample]:
        """counters/, with the 64-bit counters of counters_ext/ in place of 32-bit ones.

        A counter of counters_ext/ takes the name counters/ has for it (port_xmit_data_64 is
        port_xmit_data) and its value wins unless counters/ is a 64-bit table itself."""
        unavailable: list[str] = []
        values = self._pma_files(os.path.join(port_dir, "counters"), "", unavailable)
        wide = counterinfo.pma_table_is_wide(values)
        widths = {name: counterinfo.pma_width(name, wide) for name in values}
        ext_dir = os.path.join(port_dir, "counters_ext")
        for file, value in self._pma_files(ext_dir, "counters_ext/", unavailable).items():
            name = counterinfo.COUNTERS_EXT.get(file)
            if name is None:  # not one of the eight: shown under its own name
                if file not in values:
                    values[file], widths[file] = value, None
            elif widths.get(name) != 64:
                values[name], widths[name] = value, 64
        if unavailable:
            self.warn(
                f"{device}/{port}: {len(unavailable)} PMA counters unavailable "
                f"({unavailable[0]}{', ...' if len(unavailable) > 1 else ''})"
            )
        return [
            CounterSample(device, port, name, values[name], "pma", widths[name], _scale(name))
            for name in sorted(values)
        ]

    def _pma_files(
        self, directory: str, prefix: str, unavailable: list[str]
    ) -> dict[str, int | None]:
        """name -> value of the counter files in directory; the unavailable ones (no PMA behind
        the port) are None and named in `unavailable`, for one warning per port."""
        values: dict[str, int | None] = {}
        for name in sorted(self._listdir(directory, required=False)):
            path = os.path.join(directory, name)
            values[name] = None
            try:
                text = _read_attr(path)
            except OSError as e:  # current kernels fail the read when the PMA query fails
                unavailable.append(f"{prefix}{name}: {e.strerror}")
                continue
            if text.startswith("N/A"):  # old kernels: "N/A (no PMA)"
                unavailable.append(f"{prefix}{name}: {text}")
            else:
                values[name] = self._counter_value(path, text)
        return values

    def _hw_counters(self, device: str, port: int, directory: str) -> list[CounterSample]:
        samples = []
        for name in sorted(self._listdir(directory, required=False)):
            if name == "lifespan":
                continue
            path = os.path.join(directory, name)
            text = self.read(path)
            value = None if text is None else self._counter_value(path, text)
            samples.append(CounterSample(device, port, name, value, "hw"))
        return samples

    def _counter_value(self, path: str, text: str) -> int | None:
        """The count a counter file holds (the kernel prints %u or %llu); None for anything else,
        which is warned about once per file: a negative number or text that is not a number."""
        digits = text.strip()
        if _is_number(digits):
            value = int(digits)
            if value < 1 << 64:
                return value
            self.bad(path, f"value {digits} is above 2^64-1")
        elif digits.startswith("-") and _is_number(digits[1:]):
            self.bad(path, f"negative value {digits}")
        else:
            self.bad(path, f"malformed value {_shown(text)}")
        return None


def _scale(name: str) -> int:
    return 4 if name in ("port_xmit_data", "port_rcv_data") else 1  # 4-octet words

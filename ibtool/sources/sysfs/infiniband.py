"""The RDMA devices of /sys/class/infiniband: devices, ports, GIDs, P_Key tables (and, through
the classes it builds on, their netdevs and counters), rooted anywhere (live host, sosreport,
captured tree, fixture).

A value the kernel cannot print (an LMC above 7, a LID above 16 bits, a port state no kernel
defines) is warned about and left out, never used.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Collection, Iterator

from ibtool.errors import DataError, NoDevicesError, PermissionDeniedError
from ibtool.model.names import natural_key
from ibtool.model.records import (
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
)
from ibtool.sources.sysfs.counters import CounterFiles
from ibtool.sources.sysfs.files import Warn
from ibtool.sources.sysfs.fs import DISK
from ibtool.sources.sysfs.net import NetFiles
from ibtool.sources.sysfs.values import (
    GID_RE,
    ZERO_GID,
    gid_ip,
    is_number,
    iwarp_hardware,
    parse_decimal,
    parse_enum,
    parse_guid,
    parse_hex,
    parse_netdev,
    parse_rate,
    quoted,
)

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

NO_DEVICES_HINT = (
    "load the adapter's driver (e.g. modprobe mlx5_ib), or create a Soft-RoCE device: "
    "rdma link add rxe0 type rxe netdev ETH"
)


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


class SysfsSource(NetFiles, CounterFiles):
    def __init__(
        self,
        root: str = "/",
        warn: Warn | None = None,
        *,
        origin: str | None = None,
        fs=DISK,
    ) -> None:
        super().__init__(root, warn, origin=origin, fs=fs)
        self._drivers: dict[str, str | None] = {}

    # -- devices -----------------------------------------------------------------------------

    def device_names(self) -> list[str]:
        """The devices in class/infiniband; an entry that is not one (a dangling link, a plain
        file, an empty directory) is skipped with one warning."""
        where, none_hint = self.class_dir, NO_DEVICES_HINT
        if self.origin is not None:
            where, none_hint = f"{self.origin}: sys/class/infiniband", None
        try:
            entries = self.fs.scandir(self.class_dir)
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

    def _is_device(self, entry) -> bool:
        # sysfs makes every entry a link into devices/; captures may hold directories. Only
        # what is not a link costs a system call here.
        try:
            if entry.is_dir():
                if entry.is_symlink() or self.fs.listdir(entry.path):
                    return True
                self.bad(entry.path, "empty directory, not a device")
                return False
        except OSError:
            pass
        if entry.is_symlink() and not self.fs.exists(entry.path):
            self.bad(entry.path, "dangling link, not a device")
        else:
            self.bad(entry.path, "not a directory, not a device")
        return False

    def port_numbers(self, device: str) -> list[int]:
        ports_dir = f"{self.class_dir}/{device}/ports"
        ports = []
        for entry in self.listdir(ports_dir):
            if is_number(entry):
                ports.append(int(entry))
            else:
                self.bad(f"{ports_dir}/{entry}", "not a port number")
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
            target = self.fs.readlink(link)
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
            self.bad(link, f"not a link to a driver: {quoted(target)}")
            return None
        return driver

    def _check_device_link(self, name: str) -> bool:
        """Warn if the device's `device` entry is there but is not a link to a directory (the
        kernel's is a link to the bus device; virtual devices have none). True if it warned."""
        path = os.path.join(self.class_dir, name, "device")
        if not self.fs.lexists(path):
            return False
        if not self.fs.islink(path):
            self.bad(path, "not a link")
        elif not self.fs.exists(path):
            self.bad(path, "dangling link")
        elif not self.fs.isdir(path):
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
        path = f"{self.class_dir}/{device}/ports/{port}/link_layer"
        text = self.read(path)
        if text is None or text == "Unknown":
            return None
        link_layer = _LINK_LAYERS.get(text)
        if link_layer is None:
            self.bad(path, f"malformed value {quoted(text)}")
        return link_layer

    def port(self, device: str, port: int, fields: Collection[str] | None = None) -> Port:
        """A port with the given fields read (default: every one); the others are None."""
        want = set(PORT_FIELDS + PORT_NETDEV + PORT_DETAILS if fields is None else fields)
        p = f"{self.class_dir}/{device}/ports/{port}"
        values: dict[str, object] = {}
        for name, (file, parse, required) in _PORT_ATTRS.items():
            if name in want:
                values[name] = self.parsed(f"{p}/{file}", parse, required=required)
        if "link_layer" in want:
            values["link_layer"] = self.link_layer(device, port)
        for name in ("lid", "sm_lid"):
            if name in want:
                values[name] = self._lid(device, f"{p}/{name}")
        if "netdev" in want or "bond" in want:
            netdev = self._port_netdev(device, port)
            if "netdev" in want:
                values["netdev"] = netdev
            if "bond" in want and netdev:
                values["bond"] = self.bond(netdev)
        if "gid_tbl_len" in want:
            slots = self.listdir(os.path.join(p, "gids"), required=False)
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
        indexes = sorted(int(i) for i in self.listdir(directory, required=False) if is_number(i))
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
        indexes = [int(i) for i in self.listdir(directory, required=False) if is_number(i)]
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
            self.bad(path, f"{quoted(text)} is out of range (0x0..{IB_LID_MAX:#x})")
            return None
        return lid

    def _port_netdev(self, device: str, port: int) -> str | None:
        d = f"{self.class_dir}/{device}"
        # GID 0 of a RoCE port is the default GID of the port's own netdev.
        path = f"{d}/ports/{port}/gid_attrs/ndevs/0"
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
            netdevs = sorted(self.fs.listdir(net_dir))
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
        p = f"{self.class_dir}/{device}/ports/{port}"
        gids_dir = f"{p}/gids"
        types_dir = f"{p}/gid_attrs/types"
        ndevs_dir = f"{p}/gid_attrs/ndevs"
        # RoCE GIDs all have a netdev; InfiniBand GIDs have none (the read fails: EINVAL).
        roce = link_layer == LinkLayer.ETHERNET and not iwarp
        indexes = sorted(int(i) for i in self.listdir(gids_dir) if is_number(i))
        # Each table read through one descriptor (10^4 files on a host of 500 VFs); what is
        # wrong is said below, slot by slot, as when each file was read in turn.
        texts = self.read_each(gids_dir, [str(i) for i in indexes])
        used = [
            i
            for i, t in zip(indexes, texts)
            if type(t) is str and t != ZERO_GID and GID_RE.fullmatch(t)
        ]
        names = [str(i) for i in used]
        ndevs = dict(zip(used, self.read_each(ndevs_dir, names)))
        types = {} if iwarp else dict(zip(used, self.read_each(types_dir, names)))
        for index, gid in zip(indexes, texts):
            path = f"{gids_dir}/{index}"
            if index not in ndevs:  # unreadable, an empty slot, or not a GID
                if isinstance(gid, OSError):
                    self.unread(path, gid)
                elif gid != ZERO_GID:
                    self.bad(path, f"malformed GID {quoted(gid)}")
                continue
            netdev = self._gid_netdev(f"{ndevs_dir}/{index}", roce, ndevs[index])
            if iwarp:
                yield Gid(device, port, index, gid, None, netdev)
                continue
            types_path = f"{types_dir}/{index}"
            type_text = types[index]
            if isinstance(type_text, OSError):
                type_text = self.unread(types_path, type_text, required=False, quiet=True)
            gid_type = self._gid_type(type_text, link_layer)
            if gid_type is None:
                self.bad(
                    types_path,
                    "unreadable" if type_text is None else f"unknown GID type {quoted(type_text)}",
                )
            vlan = self.vlans().get(netdev, (None, None))[0] if netdev else None
            ip = None if gid_type == GidType.IB else gid_ip(gid)
            yield Gid(device, port, index, gid, gid_type, netdev, vlan, ip)

    def _gid_netdev(self, path: str, expected: bool, text: str | OSError) -> str | None:
        if isinstance(text, OSError):
            text = self.unread(path, text, required=False, quiet=True)
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

    def incarnation(self, device: str) -> int | None:
        """What tells a device from one re-created under the same name: the inode of its
        sysfs directory, which kernfs numbers anew for every directory it makes."""
        try:
            return self.fs.inode(os.path.join(self.class_dir, device))
        except OSError:
            return None

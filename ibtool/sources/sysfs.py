"""Reader for /sys/class/infiniband, rooted anywhere (live host, sosreport, captured tree, fixture).

Every value that cannot be read or parsed becomes None plus one warning; one bad file or device
never hides the others. Formats are those of drivers/infiniband/core/sysfs.c (and
Documentation/ABI/stable/sysfs-class-infiniband): "N: text" enums, hex LIDs, two generations
of rate strings, zero GIDs in empty slots.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterator

from ibtool import counterinfo
from ibtool.errors import DataError, NoDevicesError, PermissionDeniedError
from ibtool.model import (
    CounterSample,
    Device,
    Gid,
    GidType,
    LinkLayer,
    NodeType,
    PhysState,
    Port,
    PortState,
    Protocol,
    Rate,
)

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\s*\((\d+)X\s*([A-Z0-9]*)\)\s*$")
_LINK_LAYERS = {"InfiniBand": LinkLayer.INFINIBAND, "Ethernet": LinkLayer.ETHERNET}
# Omni-Path HFIs present themselves as InfiniBand CAs; only the driver tells them apart.
_OPA_DRIVERS = frozenset({"hfi1"})

NO_DEVICES_HINT = (
    "load the adapter's driver (e.g. modprobe mlx5_ib), or create a Soft-RoCE device: "
    "rdma link add rxe0 type rxe netdev ETH"
)

Warn = Callable[[str], None]


def natural_key(name: str) -> list:
    """mlx5_2 sorts before mlx5_10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def parse_enum_line(text: str) -> int:
    """'4: ACTIVE' -> 4 (the text after the colon differs between kernels and tools)."""
    return int(text.split(":", 1)[0])


def parse_rate(text: str) -> Rate:
    """'100 Gb/sec (4X EDR)', '10 Gb/sec (4X)' (old kernels: no suffix means SDR)."""
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(text)
    return Rate(text=text, gbps=float(m.group(1)), lanes=int(m.group(2)), speed=m.group(3) or "SDR")


def gid_ip(gid: str) -> str | None:
    """The IP address a RoCE GID encodes: IPv4-mapped (::ffff:a.b.c.d) or the IPv6 address."""
    if gid.startswith(_IPV4_MAPPED_PREFIX):
        raw = bytes.fromhex(gid[len(_IPV4_MAPPED_PREFIX) :].replace(":", ""))
        return str(ipaddress.IPv4Address(raw))
    return str(ipaddress.IPv6Address(bytes.fromhex(gid.replace(":", ""))))


def _read_attr(path: str) -> str:
    # A sysfs attribute is at most one page: one read() on a raw fd, about three times
    # cheaper than a buffered text file (it matters for 10^4 GID files on SR-IOV hosts).
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 8192)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").rstrip("\n")


class SysfsSource:
    def __init__(self, root: str = "/", warn: Warn | None = None):
        self.root = root
        self.class_dir = os.path.join(root, "sys", "class", "infiniband")
        self.warn: Warn = warn or (lambda message: None)
        self._vlans: dict[str, tuple[int, str]] | None = None
        self._warned_counter_files: set[str] = set()

    # -- raw reads ---------------------------------------------------------------------------

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.class_dir) if path.startswith(self.class_dir) else path

    def read(self, path: str, *, required: bool = True) -> str | None:
        """File content without the trailing newline; None (and a warning) when unreadable.

        Absent files are silent unless `required`: many attributes exist only on some drivers.
        """
        try:
            return _read_attr(path)
        except FileNotFoundError:
            if required:
                self.warn(f"{self._rel(path)}: missing")
        except OSError as e:
            self.warn(f"{self._rel(path)}: cannot read: {e.strerror or e}")
        return None

    @staticmethod
    def read_quiet(path: str) -> str | None:
        """For files the kernel makes fail on purpose (gid_attrs of empty or IB slots: EINVAL)."""
        try:
            return _read_attr(path)
        except OSError:
            return None

    def parsed(self, path: str, parse: Callable, *, required: bool = True):
        text = self.read(path, required=required)
        if text is None:
            return None
        try:
            return parse(text)
        except (ValueError, IndexError):
            self.warn(f"{self._rel(path)}: malformed value {text!r}")
            return None

    def _listdir(self, path: str, *, required: bool = True) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            if required:
                self.warn(f"{self._rel(path)}: missing")
        except OSError as e:
            self.warn(f"{self._rel(path)}: cannot list: {e.strerror or e}")
        return []

    # -- devices -----------------------------------------------------------------------------

    def device_names(self) -> list[str]:
        try:
            names = os.listdir(self.class_dir)
        except FileNotFoundError:
            raise NoDevicesError(
                f"no RDMA devices ({self.class_dir} does not exist)", NO_DEVICES_HINT
            ) from None
        except PermissionError as e:
            raise PermissionDeniedError(
                f"cannot list {self.class_dir}: {e.strerror}", "run as a user who can read sysfs"
            ) from None
        except OSError as e:  # e.g. a --root tree whose class/infiniband is a file
            raise DataError(
                f"cannot list {self.class_dir}: {e.strerror}",
                "--root wants a tree shaped like /: DIR/sys/class/infiniband/DEV/...",
            ) from None
        if not names:
            raise NoDevicesError(f"no RDMA devices (empty {self.class_dir})", NO_DEVICES_HINT)
        return sorted(names, key=natural_key)

    def port_numbers(self, device: str) -> list[int]:
        ports = []
        for entry in self._listdir(os.path.join(self.class_dir, device, "ports")):
            if entry.isdigit():
                ports.append(int(entry))
            else:
                self.warn(f"{device}/ports/{entry}: not a port number")
        return sorted(ports)

    def device(self, name: str, *, with_ports: bool = True) -> Device:
        d = os.path.join(self.class_dir, name)
        node_type = self.parsed(os.path.join(d, "node_type"), parse_enum_line)
        driver = self._driver(d)
        ports = tuple(self.port(name, p) for p in self.port_numbers(name)) if with_ports else ()
        netdevs: list[str] = []
        for p in ports:
            if p.netdev and p.netdev not in netdevs:
                netdevs.append(p.netdev)
        return Device(
            name=name,
            node_type=NodeType.parse(node_type) if node_type is not None else None,
            protocol=self._protocol(node_type, driver, ports),
            fw_ver=self.read(os.path.join(d, "fw_ver"), required=False) or None,
            node_guid=self.read(os.path.join(d, "node_guid")),
            sys_image_guid=self.read(os.path.join(d, "sys_image_guid"), required=False),
            node_desc=self.read(os.path.join(d, "node_desc"), required=False),
            hca_type=self.read(os.path.join(d, "hca_type"), required=False),
            board_id=self.read(os.path.join(d, "board_id"), required=False),
            hw_rev=self.read(os.path.join(d, "hw_rev"), required=False),
            driver=driver,
            parent=self.read(os.path.join(d, "parent"), required=False),
            port_count=len(ports) if with_ports else len(self.port_numbers(name)),
            netdevs=tuple(netdevs),
            ports=ports,
        )

    @staticmethod
    def _driver(device_dir: str) -> str | None:
        try:
            return os.path.basename(os.readlink(os.path.join(device_dir, "device", "driver")))
        except OSError:
            return None  # virtual devices (rxe, siw) have no bus device

    @staticmethod
    def _protocol(node_type: int | None, driver: str | None, ports: tuple[Port, ...]):
        if node_type == NodeType.RNIC:
            return Protocol.IWARP
        if node_type in (NodeType.USNIC, NodeType.USNIC_UDP):
            return Protocol.USNIC
        link_layer = next((p.link_layer for p in ports if p.link_layer is not None), None)
        if link_layer == LinkLayer.ETHERNET:
            return Protocol.ROCE
        if link_layer == LinkLayer.INFINIBAND:
            return Protocol.OPA if driver in _OPA_DRIVERS else Protocol.IB
        return None

    # -- ports -------------------------------------------------------------------------------

    def link_layer(self, device: str, port: int) -> LinkLayer | None:
        text = self.read(os.path.join(self.class_dir, device, "ports", str(port), "link_layer"))
        return _LINK_LAYERS.get(text) if text is not None else None

    def port(self, device: str, port: int) -> Port:
        p = os.path.join(self.class_dir, device, "ports", str(port))
        state = self.parsed(os.path.join(p, "state"), parse_enum_line)
        phys = self.parsed(os.path.join(p, "phys_state"), parse_enum_line)
        link_layer_text = self.read(os.path.join(p, "link_layer"))
        link_layer = _LINK_LAYERS.get(link_layer_text) if link_layer_text is not None else None
        if link_layer_text is not None and link_layer is None and link_layer_text != "Unknown":
            self.warn(f"{device}/ports/{port}/link_layer: malformed value {link_layer_text!r}")
        gids_dir = os.path.join(p, "gids")
        return Port(
            device=device,
            port=port,
            state=PortState.parse(state) if state is not None else None,
            physical_state=PhysState.parse(phys) if phys is not None else None,
            link_layer=link_layer,
            rate=self.parsed(os.path.join(p, "rate"), parse_rate),
            lid=self.parsed(os.path.join(p, "lid"), lambda s: int(s, 16)),
            sm_lid=self.parsed(os.path.join(p, "sm_lid"), lambda s: int(s, 16)),
            lmc=self.parsed(os.path.join(p, "lid_mask_count"), int),
            sm_sl=self.parsed(os.path.join(p, "sm_sl"), int, required=False),
            cap_mask=self.parsed(os.path.join(p, "cap_mask"), lambda s: int(s, 16), required=False),
            netdev=self._port_netdev(device, port),
            gid_tbl_len=len(self._listdir(gids_dir, required=False)) or None,
        )

    def _port_netdev(self, device: str, port: int) -> str | None:
        d = os.path.join(self.class_dir, device)
        # GID 0 of a RoCE port is the default GID of the port's own netdev.
        ndev = self.read_quiet(os.path.join(d, "ports", str(port), "gid_attrs", "ndevs", "0"))
        if ndev:
            return ndev
        parent = self.read_quiet(os.path.join(d, "parent"))  # rxe, siw
        if parent:
            return parent
        # IPoIB and iWARP netdevs: the PCI function's net/ entries, told apart by dev_port.
        net_dir = os.path.join(d, "device", "net")
        try:
            netdevs = sorted(os.listdir(net_dir))
        except OSError:
            return None
        for name in netdevs:
            dev_port = self.read_quiet(os.path.join(net_dir, name, "dev_port"))
            if dev_port is not None and dev_port.strip().isdigit():
                if int(dev_port) == port - 1:
                    return name
        return netdevs[0] if len(netdevs) == 1 else None

    # -- GIDs --------------------------------------------------------------------------------

    def node_type(self, device: str) -> NodeType | None:
        value = self.parsed(os.path.join(self.class_dir, device, "node_type"), parse_enum_line)
        return NodeType.parse(value) if value is not None else None

    def gids(
        self, device: str, port: int, link_layer: LinkLayer | None, *, iwarp: bool = False
    ) -> Iterator[Gid]:
        """Valid GIDs of a port. iWARP GIDs are the MAC: no RoCE type, no IP, no gid_attrs."""
        p = os.path.join(self.class_dir, device, "ports", str(port))
        gids_dir = os.path.join(p, "gids")
        types_dir = os.path.join(p, "gid_attrs", "types")
        ndevs_dir = os.path.join(p, "gid_attrs", "ndevs")
        indexes = sorted(int(i) for i in self._listdir(gids_dir) if i.isdigit())
        for index in indexes:
            gid = self.read(os.path.join(gids_dir, str(index)))
            if gid is None or gid == ZERO_GID:
                continue  # unreadable (warned) or an empty slot
            if len(gid) != 39 or gid.count(":") != 7:
                self.warn(f"{device}/ports/{port}/gids/{index}: malformed GID {gid!r}")
                continue
            netdev = self.read_quiet(os.path.join(ndevs_dir, str(index))) or None
            if iwarp:
                yield Gid(device, port, index, gid, None, netdev)
                continue
            type_text = self.read_quiet(os.path.join(types_dir, str(index)))
            gid_type = self._gid_type(type_text, link_layer)
            if gid_type is None:
                self.warn(
                    f"{device}/ports/{port}/gid_attrs/types/{index}: "
                    + ("unreadable" if type_text is None else f"unknown GID type {type_text!r}")
                )
            vlan = self.vlans().get(netdev, (None, None))[0] if netdev else None
            ip = None if gid_type == GidType.IB else gid_ip(gid)
            yield Gid(device, port, index, gid, gid_type, netdev, vlan, ip)

    @staticmethod
    def _gid_type(text: str | None, link_layer: LinkLayer | None) -> GidType | None:
        if text == "RoCE v2":
            return GidType.ROCE_V2
        if text == "IB/RoCE v1" or (text is None and link_layer == LinkLayer.INFINIBAND):
            # The kernel prints one string for both; the port's link layer decides.
            return GidType.IB if link_layer == LinkLayer.INFINIBAND else GidType.ROCE_V1
        return None

    def vlans(self) -> dict[str, tuple[int, str]]:
        """VLAN netdev -> (VLAN id, lower netdev), from /proc/net/vlan/config (8021q)."""
        if self._vlans is None:
            self._vlans = {}
            text = self.read_quiet(os.path.join(self.root, "proc", "net", "vlan", "config"))
            for line in (text or "").splitlines():
                parts = [s.strip() for s in line.split("|")]
                if len(parts) == 3 and parts[1].isdigit():
                    self._vlans[parts[0]] = (int(parts[1]), parts[2])
        return self._vlans

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
        if _DIGITS.fullmatch(digits):
            value = int(digits)
            if value < 1 << 64:
                return value
            self._counter_warning(path, f"value {digits} is above 2^64-1")
        elif digits.startswith("-") and _DIGITS.fullmatch(digits[1:]):
            self._counter_warning(path, f"negative value {digits}")
        else:
            self._counter_warning(path, f"malformed value {text!r}")
        return None

    def _counter_warning(self, path: str, problem: str) -> None:
        # Once per file, whatever it holds next time: --watch reads every counter again.
        if path not in self._warned_counter_files:
            self._warned_counter_files.add(path)
            self.warn(f"{self._rel(path)}: {problem}")


_DIGITS = re.compile(r"[0-9]+")  # not int()'s grammar: no sign, "_", or non-ASCII digits


def _scale(name: str) -> int:
    return 4 if name in ("port_xmit_data", "port_rcv_data") else 1  # 4-octet words

"""One facade over the sources: selection by DEV[/PORT], per-device fault isolation, merging.

For now the sources are sysfs (always) and verbs (only with details on the live host).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ibtool.errors import IbtoolError, NotFoundError, UsageError
from ibtool.model import CounterSample, Device, Gid, LinkLayer, NodeType, Port
from ibtool.sources.sysfs import SysfsSource


def parse_selector(selector: str) -> tuple[str, int | None]:
    """'mlx5_0' -> ('mlx5_0', None); 'mlx5_0/1' -> ('mlx5_0', 1)."""
    name, sep, port = selector.partition("/")
    if not name or (sep and not port.isdigit()):
        raise UsageError(f"bad device selector {selector!r}", "use DEV or DEV/PORT, e.g. mlx5_0/1")
    return name, int(port) if sep else None


class Host:
    def __init__(
        self, root: str = "/", warn: Callable[[str], None] | None = None, details: bool = False
    ):
        self.warn = warn or (lambda message: None)
        self.root = root
        self.details = details
        self.sysfs = SysfsSource(root, self.warn)
        self._verbs: Any = None
        self._verbs_error: IbtoolError | None = None

    # -- selection ---------------------------------------------------------------------------

    def select(self, selector: str | None) -> list[tuple[str, int | None]]:
        """The (device, port) pairs a selector names; port None means every port."""
        names = self.sysfs.device_names()
        if not selector:
            return [(n, None) for n in names]
        name, port = parse_selector(selector)
        if name not in names:
            raise NotFoundError(f"unknown device {name!r}", f"devices here: {', '.join(names)}")
        if port is not None:
            ports = self.sysfs.port_numbers(name)
            if port not in ports:
                have = ", ".join(f"{name}/{p}" for p in ports) or "none"
                raise NotFoundError(f"{name} has no port {port}", f"ports of {name}: {have}")
        return [(name, port)]

    # -- records -----------------------------------------------------------------------------

    def devices(self, selector: str | None = None) -> list[Device]:
        return [self.sysfs.device(name) for name, _ in self.select(selector)]

    def ports(self, selector: str | None = None) -> list[Port]:
        ports = []
        for name, port in self.select(selector):
            numbers = [port] if port is not None else self.sysfs.port_numbers(name)
            ports.extend(self._with_verbs(self.sysfs.port(name, p)) for p in numbers)
        return ports

    def gids(self, selector: str | None = None) -> list[Gid]:
        gids = []
        for name, port in self.select(selector):
            numbers = [port] if port is not None else self.sysfs.port_numbers(name)
            iwarp = self.is_iwarp(name)
            for p in numbers:
                link_layer = self.sysfs.link_layer(name, p)
                gids.extend(self.sysfs.gids(name, p, link_layer, iwarp=iwarp))
        return gids

    def counters(self, selector: str | None = None) -> list[CounterSample]:
        """Counters of the selected ports; with a whole device, its device-wide ones too."""
        samples = []
        for name, port in self.select(selector):
            if port is None:
                samples.extend(self.sysfs.counters(name, 0))
            numbers = [port] if port is not None else self.sysfs.port_numbers(name)
            for p in numbers:
                samples.extend(self.sysfs.counters(name, p))
        return samples

    def is_iwarp(self, device: str) -> bool:
        return self.sysfs.node_type(device) == NodeType.RNIC

    def roce_gid_index(self, device: str, port: int) -> int | None:
        """The GID index the data path uses on a RoCE port (the `gids --best` rule), or None
        for an InfiniBand port, which is addressed by LID."""
        from ibtool.gidrule import best_gid

        p = self.sysfs.port(device, port)
        if p.link_layer != LinkLayer.ETHERNET:
            return None
        gids = list(self.sysfs.gids(device, port, p.link_layer))
        return best_gid(gids, {(device, port): p}, self.sysfs.vlans(), p.netdev or "").index

    # -- verbs (details only) ----------------------------------------------------------------

    def verbs(self):
        """The verbs source, or None after one warning saying what is missing."""
        if self._verbs is None and self._verbs_error is None:
            if self.root != "/":
                self._verbs_error = IbtoolError("verbs details need the live host, not --root")
            else:
                try:
                    from ibtool.sources.verbs import VerbsSource

                    self._verbs = VerbsSource()
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
        return dataclasses.replace(port, active_mtu=attrs["active_mtu"], max_mtu=attrs["max_mtu"])

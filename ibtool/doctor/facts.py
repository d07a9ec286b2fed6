"""This end's Facts: the port doctor would use and what decides whether RDMA reaches it,
read through the Host. One fact that cannot be read is a note and None, never the end of the
run: the checks say SKIP for what they do not know.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from ibtool import __version__
from ibtool.errors import IbtoolError
from ibtool.model.doctor import Facts, GidFact, PciFact
from ibtool.model.system import cpu_list

T = TypeVar("T")
# What a RoCE or InfiniBand data path needs loaded, in the order a user space stack meets them
# (drivers/infiniband/core: ib_core, ib_uverbs for verbs, rdma_ucm for librdmacm).
MODULES = ("ib_core", "ib_uverbs", "rdma_ucm")
CAP_IPC_LOCK = 14  # linux/include/uapi/linux/capability.h


def _read(notes: list[str], what: str, read: Callable[[], T]) -> T | None:
    try:
        return read()
    except (IbtoolError, OSError, ValueError) as e:
        notes.append(f"{what}: {getattr(e, 'message', None) or e}")
        return None


def ipc_lock(root: str, pid: int | None, fs: Any) -> bool | None:
    """Whether the process has CAP_IPC_LOCK in its effective set (then RLIMIT_MEMLOCK does not
    bind it: drivers/infiniband/core/umem.c, ib_umem_get), from /proc under `root` as `fs`
    (the Host's: ibtool.sources.sysfs.fs) has it."""
    path = os.path.join(root, "proc", str(pid) if pid else "self", "status")
    try:
        text = fs.read(path, 8192).decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
            except (IndexError, ValueError):
                return None
    return None


def collect(host, device: str, port: int, gid_index: int | None = None,
            pid: int | None = None, process=None) -> Facts:  # fmt: skip
    """The facts of `device`/`port` on `host`; `gid_index` the GID the data path uses (None:
    the `gids --best` rule's); `pid` the process whose limits count (None: this one);
    `process` (ibtool.model.system.Process, `doctor --pid`): that process as read already,
    whose limits and CPUs are taken instead, against its adapter's NUMA node's CPUs."""
    notes: list[str] = []
    where = f"{device}/{port}"
    values: dict[str, Any] = {
        "hostname": socket.gethostname() if host.live else None,
        "kernel": host.kernel_release() if host.live else None,
        "ibtool": __version__,
        "device": device,
        "port": port,
    }
    dev = _read(notes, device, lambda: host.devices(device)[0])
    if dev is not None:
        values["driver"] = dev.driver
        values["fw"] = dev.fw_ver
        values["protocol"] = dev.protocol.value if dev.protocol is not None else None
    fields = ("state", "physical_state", "link_layer", "rate", "lid", "netdev", "pkeys")
    p = _read(notes, where, lambda: host.ports(where, fields)[0])
    if p is not None:
        values.update(
            link_layer=p.link_layer.label if p.link_layer is not None else None,
            state=p.state.label if p.state is not None else None,
            physical_state=p.physical_state.label if p.physical_state is not None else None,
            rate=p.rate.text if p.rate is not None else None,
            lid=p.lid,
            active_mtu=p.active_mtu,
            netdev=p.netdev,
        )
        values["pkeys"] = tuple(k.value for k in p.pkeys or () if k.value)
    if values.get("active_mtu") is None and host.live:
        mtu = _read(notes, f"{where} active MTU", lambda: _active_mtu(host, device, port))
        values["active_mtu"] = mtu
    netdev = values.get("netdev")
    gids = None  # the port's GIDs, read once for both

    def best_index() -> int | None:
        nonlocal gids
        gids = host.gids(where)
        return host.roce_gid_index(device, port, gids)

    if gid_index is None:
        gid_index = _read(notes, f"{where} GID", best_index)
    values["gid_index"] = gid_index
    if gids is None:
        gids = _read(notes, f"{where} GIDs", lambda: host.gids(where)) or []
    values["gids"] = tuple(
        GidFact(
            g.index, g.gid, g.type.label if g.type is not None else None, g.netdev, g.vlan, g.ip
        )  # fmt: skip
        for g in gids
    )
    if netdev:
        values["netdev_mtu"] = _read(notes, f"{netdev} MTU", lambda: host.netdev_mtu(netdev))
        conf = _read(notes, f"{netdev} IPv4 settings", lambda: host.ipv4_conf(netdev))
        if conf is not None:
            values.update(rp_filter=conf.effective_rp_filter,
                          arp_ignore=conf.effective_arp_ignore,
                          arp_announce=conf.effective_arp_announce)  # fmt: skip
        dcb = _read(notes, f"{netdev} DCB", lambda: host.dcb(netdev)) if host.live else None
        values["dcb"] = dcb is not None if host.live else None
        if dcb is not None:
            values.update(pfc=tuple(sorted(dcb.pfc_enabled)), dscp_prio=tuple(dcb.dscp_prio),
                          trust=dcb.trust)  # fmt: skip
    roce = _read(notes, f"{where} rdma_cm defaults", lambda: host.roce_defaults(device, port))
    if roce is not None and roce.configured:
        values.update(roce_mode=roce.mode, roce_tos=roce.tos)
    if process is None:
        lock = _read(notes, "memlock limit", lambda: host.memlock(pid))
        values["ipc_lock"] = ipc_lock(host.root, pid, host.fs)
    else:
        lock = process.memlock
        values["ipc_lock"] = process.ipc_lock
        notes.extend(process.notes)
    if lock is not None and lock.known:
        values["memlock_soft"] = -1 if lock.soft is None else lock.soft
        values["memlock_hard"] = -1 if lock.hard is None else lock.hard
    if host.stack_captured():
        values["modules"] = tuple(m for m in MODULES if host.module_loaded(m)[0])
        uverbs = host.uverbs_devices().get(device)
        values["uverbs"] = uverbs
        if host.root == "/":
            values["rdma_cm_node"] = os.path.exists("/dev/infiniband/rdma_cm")
            if uverbs:
                values["uverbs_node"] = not host.device_node_missing(uverbs)
    providers = _read(notes, "libibverbs providers", host.verbs_providers)
    if providers is not None and dev is not None:
        driver = dev.driver or _soft_driver(dev)
        values["driver"] = driver
        if driver:
            values["provider"] = _PROVIDERS.get(driver, driver) in providers
    links = _read(notes, f"{device} PCI links", lambda: host.pci_links(device)) or ()
    values["pci"] = tuple(
        PciFact(link.bdf, link.current_speed, link.current_width, link.max_speed, link.max_width)
        for link in links
    )
    numa = _read(notes, f"{device} NUMA node", lambda: host.numa(device))
    if numa is not None:
        values.update(numa_node=numa.node, local_cpus=cpu_list(numa.local_cpus))
    if process is None:
        cpus = _read(notes, "CPU affinity", lambda: host.allowed_cpus(pid))
        values["allowed_cpus"] = cpu_list(cpus)
    else:
        values["allowed_cpus"] = cpu_list(process.cpus)
        node = values.get("numa_node")
        if node is not None:  # the node's CPUs, where sysfs lists them (the same set, online)
            cpus = _read(notes, f"NUMA node {node} CPUs", lambda: host.node_cpus(node))
            if cpus is not None:
                values["local_cpus"] = cpu_list(cpus)
    if host.live:
        rules = _read(notes, "netfilter rules", lambda: host.udp_filters(4791))
        if rules is not None:
            values["udp_filters"] = tuple(f"{r.tool} {r.table} {r.chain}: {r.text}" for r in rules)
    values["notes"] = tuple(notes)
    return Facts(**values)


# The kernel driver -> the libibverbs provider that serves it (rdma-core providers/*/: each
# provider's verbs_match table names the kernel driver ids; the .driver file the provider).
_PROVIDERS = {"mlx5_core": "mlx5", "mlx4_core": "mlx4", "rdma_rxe": "rxe", "rxe": "rxe",
              "siw": "siw", "irdma": "irdma", "i40iw": "irdma", "bnxt_en": "bnxt_re",
              "bnxt_re": "bnxt_re", "hfi1": "hfi1verbs", "ib_qib": "ipathverbs",
              "qedr": "qedr", "efa": "efa", "cxgb4": "cxgb4", "vmw_pvrdma": "vmw_pvrdma",
              "hns3": "hns", "erdma": "erdma", "mana": "mana", "ocrdma": "ocrdma"}  # fmt: skip


def _active_mtu(host, device: str, port: int) -> int | None:
    """The port's active MTU as verbs tell it (sysfs has none), None without pyverbs."""
    verbs = host.verbs()
    return None if verbs is None else verbs.port_attrs(device, port)["active_mtu"]


def _soft_driver(dev) -> str | None:
    """rxe and siw devices have no bus device, so no driver link: their protocol tells them
    (a device without one speaking iWARP is siw, RoCE rxe)."""
    if dev.protocol is None or dev.protocol.value not in ("roce", "iw"):
        return None
    return "siw" if dev.protocol.value == "iw" else "rxe"


def running_kernel() -> str:
    return os.uname().release

"""Frozen records and kernel enums shared by every source, plugin and face.

Enum values are the kernel's (uapi / sysfs "N: text" numbers); `label` is what users read.
A field that could not be read is None; the reason went to the warnings, not into the record.
"""

from __future__ import annotations

import enum
from dataclasses import field

from ibtool.model.deferred import dataclass


class _Labelled(enum.IntEnum):
    @property
    def label(self) -> str:
        return self._labels().get(self.value, self.name)

    @classmethod
    def _labels(cls) -> dict[int, str]:
        return {}

    @classmethod
    def parse(cls, value: int):
        """The member for a kernel number, or None for a number this enum does not know."""
        try:
            return cls(value)
        except ValueError:
            return None


class PortState(_Labelled):
    NOP = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4
    ACTIVE_DEFER = 5


class PhysState(_Labelled):
    # Names as iproute2's `rdma link` prints them, except 4: iproute2 calls it ARMED, but
    # the IBTA name (and sysfs's "PortConfigurationTraining") is link training.
    NOP = 0
    SLEEP = 1
    POLLING = 2
    DISABLED = 3
    PORT_CONFIGURATION_TRAINING = 4
    LINK_UP = 5
    LINK_ERROR_RECOVER = 6
    PHY_TEST = 7
    OPA_OFFLINE = 9
    OPA_TEST = 11


class LinkLayer(_Labelled):
    # libibverbs numbering (IBV_LINK_LAYER_*); sysfs prints the label.
    UNSPECIFIED = 0
    INFINIBAND = 1
    ETHERNET = 2

    @classmethod
    def _labels(cls):
        return {0: "Unknown", 1: "InfiniBand", 2: "Ethernet"}


class NodeType(_Labelled):
    CA = 1
    SWITCH = 2
    ROUTER = 3
    RNIC = 4
    USNIC = 5
    USNIC_UDP = 6
    UNSPECIFIED = 7

    @property
    def key(self) -> str:
        return self.name.lower()


class GidType(_Labelled):
    # libibverbs' ibv_gid_type numbering (GIDEntry.gid_type): IB is its own type, not "v1".
    IB = 0
    ROCE_V1 = 1
    ROCE_V2 = 2

    @classmethod
    def _labels(cls):
        return {0: "IB", 1: "RoCE v1", 2: "RoCE v2"}


class Protocol(str, enum.Enum):
    # The kernel's RDMA_NLDEV_ATTR_DEV_PROTOCOL strings.
    IB = "ib"
    ROCE = "roce"
    IWARP = "iw"
    OPA = "opa"
    USNIC = "usnic"

    @property
    def label(self) -> str:
        return {
            "ib": "InfiniBand",
            "roce": "RoCE",
            "iw": "iWARP",
            "opa": "Omni-Path",
            "usnic": "usNIC",
        }[self.value]


@dataclass(frozen=True)
class Rate:
    """A port's rate as the kernel prints it, and as numbers."""

    text: str
    gbps: float
    lanes: int | None
    speed: str | None  # SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR

    @property
    def width(self) -> str | None:
        return f"{self.lanes}X" if self.lanes else None


PKEY_BASE_MASK = 0x7FFF  # the partition number; bit 15 is the membership
PKEY_FULL_MEMBER = 0x8000
PKEY_DEFAULT_BASE = 0x7FFF  # the default partition: 0xFFFF full member, 0x7FFF limited


@dataclass(frozen=True)
class PKey:
    """One populated slot of a port's P_Key table. `value` None: the slot could not be read."""

    index: int
    value: int | None

    @property
    def membership(self) -> str | None:
        """'full' (bit 15 set: may talk to every member) or 'limited' (only to full members)."""
        if self.value is None:
            return None
        return "full" if self.value & PKEY_FULL_MEMBER else "limited"

    @property
    def default(self) -> bool | None:
        """In the default partition (base 0x7fff)."""
        return None if self.value is None else self.value & PKEY_BASE_MASK == PKEY_DEFAULT_BASE

    @property
    def label(self) -> str:
        """'0xffff (index 0)', or 'index 0' when the value is not known."""
        if self.value is None:
            return f"index {self.index}"
        return f"0x{self.value:04x} (index {self.index})"

    @property
    def hex(self) -> str | None:
        return None if self.value is None else f"0x{self.value:04x}"


# PortInfo:VLCap (verbs max_vl_num): the data VLs a port has (IBTA vol. 1, 14.2.5.6).
VL_CAP = {1: "VL0", 2: "VL0-1", 3: "VL0-3", 4: "VL0-7", 5: "VL0-14"}


@dataclass(frozen=True)
class BondSlave:
    name: str
    state: str | None = None  # "active" or "backup" (bonding_slave/state)
    mii_status: str | None = None  # "up", "down", "going down", "going back" (mii_status)

    @property
    def active(self) -> bool:
        return self.state == "active"


@dataclass(frozen=True)
class Bond:
    """The Linux bond under a RoCE port (rxe on a bond, or a RoCE LAG device), from
    /sys/class/net/BOND/bonding (drivers/net/bonding/bond_sysfs.c, bond_sysfs_slave.c)."""

    name: str
    mode: str | None  # "active-backup", "802.3ad", ... (the mode's name without its number)
    slaves: tuple[BondSlave, ...] = ()
    active_slave: str | None = None  # active-backup, balance-tlb/alb: the slave in use


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    state: PortState | None = None
    physical_state: PhysState | None = None
    link_layer: LinkLayer | None = None
    rate: Rate | None = None
    lid: int | None = None
    sm_lid: int | None = None
    lmc: int | None = None
    sm_sl: int | None = None
    cap_mask: int | None = None
    netdev: str | None = None
    netdev_index: int | None = None  # its ifindex, where netlink tells (NDEV_INDEX)
    bond: Bond | None = None  # the netdev is a bond: its mode and slaves
    gid_tbl_len: int | None = None
    # Details (-d) only. The P_Key table (pkeys/): its slots and the populated ones.
    pkey_tbl_len: int | None = None
    pkeys: tuple[PKey, ...] | None = None
    # The VL of each SL, where the driver shows it (qib sl2vl/; hfi1 through sl2sc/ and sc2vl/).
    sl2vl: tuple[int | None, ...] | None = None
    # From verbs only (ibv_query_port); None unless details were asked for.
    active_mtu: int | None = None
    max_mtu: int | None = None
    max_vl_num: int | None = None  # VLCap: 1 VL0, 2 VL0-1, 3 VL0-3, 4 VL0-7, 5 VL0-14
    # The device's automatic path migration (device_cap_flags AUTO_PATH_MIG), for its ports.
    auto_path_mig: bool | None = None
    # Under details: field name -> the source it came from ("sysfs", "netlink", "verbs").
    sources: dict[str, str] | None = field(default=None, compare=False)

    @property
    def lid_range(self) -> tuple[int, int] | None:
        """The LIDs this port answers to: LID .. LID + 2^LMC - 1 (InfiniBand only)."""
        if self.lid is None or self.lmc is None or self.lid == 0:
            return None
        return (self.lid, self.lid + (1 << self.lmc) - 1)


@dataclass(frozen=True)
class Device:
    name: str
    node_type: NodeType | None = None
    protocol: Protocol | None = None
    fw_ver: str | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    node_desc: str | None = None
    hca_type: str | None = None
    board_id: str | None = None
    hw_rev: str | None = None
    driver: str | None = None
    parent: str | None = None  # rxe/siw: the netdev it was created on
    port_count: int = 0
    netdevs: tuple[str, ...] = ()
    ports: tuple[Port, ...] = field(default=(), compare=False)
    sources: dict[str, str] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Gid:
    device: str
    port: int
    index: int
    gid: str  # 8 groups of 4 hex digits, as sysfs prints it
    type: GidType | None
    netdev: str | None
    vlan: int | None = None
    ip: str | None = None  # the IPv4 or IPv6 address the GID encodes (RoCE)


@dataclass(frozen=True)
class CounterSample:
    """One counter read once. `port` 0 is a device-wide counter (device hw_counters)."""

    device: str
    port: int
    name: str
    value: int | None  # None: unreadable or "N/A (no PMA)"
    # "pma" (IB PortCounters in counters/), "hw" (driver hw_counters/) or "optional" (an
    # enabled optional driver counter, which only netlink shows)
    source: str
    width: int | None = None  # PMA counters: bits (4 to 64); they saturate at all ones
    scale: int = 1  # PMA data counters count 4-octet words: value * scale is bytes (exact)
    via: str = "sysfs"  # where the value was read: "sysfs" or "netlink"


@dataclass(frozen=True)
class HwCounterStatus:
    """A port's driver counter as STAT_GET_STATUS lists it. Optional counters (mlx5
    rdma_tx_bytes, cc_rx_ce_pkts, ...) are off until enabled and exist only in netlink."""

    device: str
    port: int
    name: str
    index: int  # what STAT_SET takes to enable it
    optional: bool
    enabled: bool  # always True for a counter that is not optional


class NetnsMode(_Labelled):
    # RDMA_NLDEV_SYS_ATTR_NETNS_MODE: shared (the default) makes every RDMA device visible in
    # every network namespace; exclusive binds each device to one namespace.
    EXCLUSIVE = 0
    SHARED = 1

    @property
    def key(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class RdmaSystem:
    """The kernel's system-wide RDMA settings (RDMA_NLDEV_CMD_SYS_GET).

    None: the kernel did not report it (a kernel older than the setting).
    """

    netns_mode: NetnsMode | None = None
    privileged_qkey: bool | None = None  # non-privileged users may use controlled QKEYs
    monitor: bool | None = None  # the kernel sends device events (RDMA_NL_GROUP_NOTIFY)
    # fork() copies pinned (DMA-registered) pages into the child: no ibv_fork_init() needed.
    copy_on_fork: bool | None = None


@dataclass(frozen=True)
class NetlinkFeature:
    """Whether the running kernel has an NLDEV command or SYS_GET attribute, as asked of it.

    supported None: it could not be asked (no device to ask about, ...); `note` says why.
    """

    key: str  # "res-ctx-get", "privileged-qkey-mode": the uapi name, lowercase, dashed
    netlink: str  # the uapi name: RDMA_NLDEV_CMD_RES_CTX_GET, RDMA_NLDEV_SYS_ATTR_...
    supported: bool | None
    since: str | None = None  # the first mainline release with it
    note: str | None = None


# -- RDMA resource tracking (RDMA_NLDEV_CMD_RES_*_GET) --------------------------------------------
# Names are the words `rdma res show` prints; a number an enum does not know stays an int.


class QpType(_Labelled):
    # enum ib_qp_type (libibverbs uses the same numbers)
    SMI = 0
    GSI = 1
    RC = 2
    UC = 3
    UD = 4
    RAW_IPV6 = 5
    RAW_ETHERTYPE = 6
    RAW_PACKET = 8
    XRC_INI = 9
    XRC_TGT = 10
    DRIVER = 0xFF


class QpState(_Labelled):
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


class PathMigState(_Labelled):
    MIGRATED = 0
    REARM = 1
    ARMED = 2


class CmState(_Labelled):
    # enum rdma_cm_state
    IDLE = 0
    ADDR_QUERY = 1
    ADDR_RESOLVED = 2
    ROUTE_QUERY = 3
    ROUTE_RESOLVED = 4
    CONNECT = 5
    DISCONNECT = 6
    ADDR_BOUND = 7
    LISTEN = 8
    DEVICE_REMOVAL = 9
    DESTROYING = 10


class PortSpace(_Labelled):
    # enum rdma_ucm_port_space
    IPOIB = 0x0002
    TCP = 0x0106
    UDP = 0x0111
    IB = 0x013F

    @classmethod
    def _labels(cls):
        return {0x0002: "IPoIB", 0x0106: "TCP", 0x0111: "UDP", 0x013F: "IB"}


class PollContext(_Labelled):
    # enum ib_poll_context since the shared CQ pool (Linux 5.8); before it DIRECT was 0 and
    # the others one higher (records.cq translates).
    SOFTIRQ = 0
    WORKQUEUE = 1
    UNBOUND_WORKQUEUE = 2
    DIRECT = 3


class SrqType(_Labelled):
    BASIC = 0
    XRC = 1
    TM = 2


@dataclass(frozen=True)
class Owner:
    """Who holds a tracked object: a user process (pid, in the reader's PID namespace) or a
    kernel module (kern_name, e.g. "ib_core"). The kernel leaves pid out for a zombie."""

    pid: int | None = None
    kern_name: str | None = None


@dataclass(frozen=True)
class QpResource:
    device: str
    device_index: int
    lqpn: int
    type: QpType | int
    state: QpState | int
    sq_psn: int
    port: int | None = None  # None until the QP is bound to a port (RESET)
    rqpn: int | None = None  # connected types only
    rq_psn: int | None = None
    path_mig_state: PathMigState | int | None = None
    pdn: int | None = None
    owner: Owner = Owner()
    driver: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CmIdResource:
    device: str
    device_index: int
    state: CmState | int
    ps: PortSpace | int
    port: int | None = None
    cm_idn: int | None = None
    lqpn: int | None = None
    qp_type: QpType | int | None = None
    src_addr: str | None = None  # "ADDRESS:PORT" as rdma prints it
    dst_addr: str | None = None
    owner: Owner = Owner()
    driver: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CqResource:
    device: str
    device_index: int
    cqe: int
    users: int
    cqn: int | None = None
    poll_ctx: PollContext | int | None = None  # kernel CQs only
    adaptive_moderation: bool | None = None
    ctxn: int | None = None
    owner: Owner = Owner()
    driver: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class MrResource:
    device: str
    device_index: int
    mrlen: int
    mrn: int | None = None
    rkey: int | None = None  # keys only for a reader with CAP_NET_ADMIN
    lkey: int | None = None
    iova: int | None = None  # only kernels before 4.20 sent it
    pdn: int | None = None
    owner: Owner = Owner()
    driver: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class PdResource:
    device: str
    device_index: int
    users: int
    pdn: int | None = None
    local_dma_lkey: int | None = None  # CAP_NET_ADMIN only
    unsafe_global_rkey: int | None = None  # CAP_NET_ADMIN, and only on such a PD
    ctxn: int | None = None
    owner: Owner = Owner()
    driver: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CtxResource:
    device: str
    device_index: int
    ctxn: int
    owner: Owner = Owner()
    driver: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SrqResource:
    device: str
    device_index: int
    srqn: int
    type: SrqType | int | None = None
    lqpns: tuple[tuple[int, int], ...] = ()  # attached QPs as (first, last) ranges
    pdn: int | None = None
    cqn: int | None = None
    owner: Owner = Owner()
    driver: dict = field(default_factory=dict, compare=False)

"""The NLDEV vocabulary: commands and the one attribute table, with the uapi's ids and names.

Ids are written out, never counted: `enum rdma_nldev_attr` aliases PAD to 0, and kernel
releases have reused and renamed entries (include/uapi/rdma/rdma_netlink.h history). Names are the
uapi's, verbatim, including the three that break its pattern (RDMA_NLDEV_SYS_ATTR_*,
RDMA_NLDEV_NET_NS_FD). The kernel parses every nest against the same policy as the top level,
so this one table describes attributes at every depth. No pyroute2 here: this module is cheap.
"""

from __future__ import annotations

from ibtool.model.deferred import dataclass

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5

# Netlink core values (linux/netlink.h) this package needs.
NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_CAPPED = 0x100  # on NLMSG_ERROR: only the request's header is echoed
NLM_F_ACK_TLVS = 0x200  # on NLMSG_ERROR / NLMSG_DONE: extended-ack attributes follow
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
NLMSGERR_ATTR_MSG = 1
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11

# enum rdma_nldev_command
RDMA_NLDEV_CMD_UNSPEC = 0
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_NEWLINK = 3
RDMA_NLDEV_CMD_DELLINK = 4
RDMA_NLDEV_CMD_PORT_GET = 5
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_CMD_SYS_SET = 7
# 8 is free
RDMA_NLDEV_CMD_RES_GET = 9
RDMA_NLDEV_CMD_RES_QP_GET = 10
RDMA_NLDEV_CMD_RES_CM_ID_GET = 11
RDMA_NLDEV_CMD_RES_CQ_GET = 12
RDMA_NLDEV_CMD_RES_MR_GET = 13
RDMA_NLDEV_CMD_RES_PD_GET = 14
RDMA_NLDEV_CMD_GET_CHARDEV = 15
RDMA_NLDEV_CMD_STAT_SET = 16
RDMA_NLDEV_CMD_STAT_GET = 17
RDMA_NLDEV_CMD_STAT_DEL = 18
RDMA_NLDEV_CMD_RES_QP_GET_RAW = 19
RDMA_NLDEV_CMD_RES_CQ_GET_RAW = 20
RDMA_NLDEV_CMD_RES_MR_GET_RAW = 21
RDMA_NLDEV_CMD_RES_CTX_GET = 22
RDMA_NLDEV_CMD_RES_SRQ_GET = 23
RDMA_NLDEV_CMD_STAT_GET_STATUS = 24
RDMA_NLDEV_CMD_RES_SRQ_GET_RAW = 25
RDMA_NLDEV_CMD_NEWDEV = 26
RDMA_NLDEV_CMD_DELDEV = 27
RDMA_NLDEV_CMD_MONITOR = 28  # only the type of events on RDMA_NL_GROUP_NOTIFY, not a request
RDMA_NLDEV_CMD_FRMR_POOLS_GET = 29
RDMA_NLDEV_CMD_FRMR_POOLS_SET = 30

COMMANDS: dict[int, str] = {
    value: name for name, value in globals().items() if name.startswith("RDMA_NLDEV_CMD_")
}

# The first mainline release with the command: exact where an iproute2 header sync names the
# release, otherwise the release whose merge window took the patches from linux-rdma (GET and
# PORT_GET came with the first rdma tool, iproute2 4.13; the RES_*_GET_RAW series was posted in
# June 2020, RES_CTX_GET and RES_SRQ_GET in April 2021, STAT_GET_STATUS in October 2021,
# RES_SRQ_GET_RAW in October 2023). MONITOR is no request: SYS_ATTRIBUTE_SINCE has its mode.
COMMAND_SINCE: dict[int, str] = {
    RDMA_NLDEV_CMD_GET: "4.13",
    RDMA_NLDEV_CMD_NEWLINK: "5.1",
    RDMA_NLDEV_CMD_DELLINK: "5.1",
    RDMA_NLDEV_CMD_PORT_GET: "4.13",
    RDMA_NLDEV_CMD_SYS_GET: "5.2",
    RDMA_NLDEV_CMD_SYS_SET: "5.2",
    RDMA_NLDEV_CMD_RES_GET: "4.16",
    RDMA_NLDEV_CMD_RES_QP_GET: "4.16",
    RDMA_NLDEV_CMD_RES_CM_ID_GET: "4.17",
    RDMA_NLDEV_CMD_RES_CQ_GET: "4.17",
    RDMA_NLDEV_CMD_RES_MR_GET: "4.17",
    RDMA_NLDEV_CMD_RES_PD_GET: "4.17",
    RDMA_NLDEV_CMD_GET_CHARDEV: "5.3",
    RDMA_NLDEV_CMD_STAT_SET: "5.3",
    RDMA_NLDEV_CMD_STAT_GET: "5.3",
    RDMA_NLDEV_CMD_STAT_DEL: "5.3",
    RDMA_NLDEV_CMD_RES_QP_GET_RAW: "5.9",
    RDMA_NLDEV_CMD_RES_CQ_GET_RAW: "5.9",
    RDMA_NLDEV_CMD_RES_MR_GET_RAW: "5.9",
    RDMA_NLDEV_CMD_RES_CTX_GET: "5.13",
    RDMA_NLDEV_CMD_RES_SRQ_GET: "5.13",
    RDMA_NLDEV_CMD_STAT_GET_STATUS: "5.16",
    RDMA_NLDEV_CMD_RES_SRQ_GET_RAW: "6.7",
    RDMA_NLDEV_CMD_NEWDEV: "6.11",
    RDMA_NLDEV_CMD_DELDEV: "6.11",
    RDMA_NLDEV_CMD_FRMR_POOLS_GET: "7.0",
    RDMA_NLDEV_CMD_FRMR_POOLS_SET: "7.0",
}

# SYS_GET reports each system setting the kernel has (nldev.c nldev_sys_get_doit), so its
# attributes say what the kernel can do. Copy-on-fork was posted in April 2021, the privileged
# QKEY mode in 2023 (distribution kernels carried it back: Debian 12's 6.1 reports it, see
# tests/fixtures/captured/netlink/sys_get.bin); MONITOR_MODE (1 whenever the kernel sends
# RDMA_NLDEV_CMD_MONITOR events to RDMA_NL_GROUP_NOTIFY) came with those events, "headers from
# 6.12-rc1" in iproute2.
SYS_ATTRIBUTE_SINCE: dict[str, str] = {
    "RDMA_NLDEV_SYS_ATTR_NETNS_MODE": "5.2",
    "RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK": "5.13",
    "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE": "6.7",
    "RDMA_NLDEV_SYS_ATTR_MONITOR_MODE": "6.12",
}

# `rdma res show OBJECT` -> the dump that lists those objects (COMMAND_SINCE has its release).
RESOURCE_COMMANDS: dict[str, int] = {
    "qp": RDMA_NLDEV_CMD_RES_QP_GET,
    "cm_id": RDMA_NLDEV_CMD_RES_CM_ID_GET,
    "cq": RDMA_NLDEV_CMD_RES_CQ_GET,
    "mr": RDMA_NLDEV_CMD_RES_MR_GET,
    "pd": RDMA_NLDEV_CMD_RES_PD_GET,
    "ctx": RDMA_NLDEV_CMD_RES_CTX_GET,
    "srq": RDMA_NLDEV_CMD_RES_SRQ_GET,
}
# The attribute that names one object of a kind in a RES_*_GET doit (nldev.c fill_entries .id).
RESOURCE_IDS: dict[str, str] = {
    "qp": "RDMA_NLDEV_ATTR_RES_LQPN",
    "cm_id": "RDMA_NLDEV_ATTR_RES_CM_IDN",
    "cq": "RDMA_NLDEV_ATTR_RES_CQN",
    "mr": "RDMA_NLDEV_ATTR_RES_MRN",
    "pd": "RDMA_NLDEV_ATTR_RES_PDN",
    "ctx": "RDMA_NLDEV_ATTR_RES_CTXN",
    "srq": "RDMA_NLDEV_ATTR_RES_SRQN",
}

# What the RDMA_NL_ADMIN_PERM commands do, for the message when CAP_NET_ADMIN is missing.
ADMIN_PURPOSE: dict[int, str] = {
    RDMA_NLDEV_CMD_SET: "renaming a device or moving it to another network namespace",
    RDMA_NLDEV_CMD_NEWLINK: "creating an rxe or siw device",
    RDMA_NLDEV_CMD_DELLINK: "deleting an rxe or siw device",
    RDMA_NLDEV_CMD_SYS_SET: "changing the netns or privileged QKEY mode",
    RDMA_NLDEV_CMD_STAT_SET: "configuring counters (QP binding, optional counters)",
    RDMA_NLDEV_CMD_STAT_DEL: "unbinding QPs from counters",
    RDMA_NLDEV_CMD_RES_QP_GET_RAW: "reading raw driver resource dumps",
    RDMA_NLDEV_CMD_RES_CQ_GET_RAW: "reading raw driver resource dumps",
    RDMA_NLDEV_CMD_RES_MR_GET_RAW: "reading raw driver resource dumps",
    RDMA_NLDEV_CMD_RES_SRQ_GET_RAW: "reading raw driver resource dumps",
    RDMA_NLDEV_CMD_NEWDEV: "adding a sub-device",
    RDMA_NLDEV_CMD_DELDEV: "deleting a sub-device",
    RDMA_NLDEV_CMD_FRMR_POOLS_SET: "setting the FRMR pool aging period",
}


def nlmsg_type(command: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)."""
    return (RDMA_NL_NLDEV << 10) + command


def command_of(msg_type: int) -> int | None:
    """The NLDEV command of a message type, or None for another client's or a control type."""
    if (msg_type >> 10) & 0x3F != RDMA_NL_NLDEV:
        return None
    return msg_type & 0x3FF


# Attribute kinds: how the payload is laid out, and what it decodes to.
PAD = "pad"  # alignment filler before u64s; skipped
U8, U16, U32, U64, S32, S64 = "u8", "u16", "u32", "u64", "s32", "s64"
STRING = "string"  # NUL-terminated -> str
BINARY = "binary"  # -> bytes
NEST = "nest"  # one object -> dict of its attributes
TABLE = "table"  # repeated `entry` attributes -> list of their values
DRIVER = "driver"  # {DRIVER_STRING key, [DRIVER_PRINT_TYPE], value}* -> dict key: value

SIZES = {U8: 1, U16: 2, U32: 4, U64: 8, S32: 4, S64: 8}


@dataclass(frozen=True)
class Attr:
    id: int
    name: str
    kind: str
    entry: str | None = None  # TABLE: the attribute each element is sent as


_P = "RDMA_NLDEV_ATTR_"

ATTRIBUTES: tuple[Attr, ...] = (
    Attr(0, _P + "PAD", PAD),  # = RDMA_NLDEV_ATTR_UNSPEC
    Attr(1, _P + "DEV_INDEX", U32),
    Attr(2, _P + "DEV_NAME", STRING),
    Attr(3, _P + "PORT_INDEX", U32),  # in GET replies: the number of ports
    Attr(4, _P + "CAP_FLAGS", U64),
    Attr(5, _P + "FW_VERSION", STRING),
    Attr(6, _P + "NODE_GUID", U64),  # host byte order
    Attr(7, _P + "SYS_IMAGE_GUID", U64),
    Attr(8, _P + "SUBNET_PREFIX", U64),
    Attr(9, _P + "LID", U32),
    Attr(10, _P + "SM_LID", U32),
    Attr(11, _P + "LMC", U8),
    Attr(12, _P + "PORT_STATE", U8),
    Attr(13, _P + "PORT_PHYS_STATE", U8),
    Attr(14, _P + "DEV_NODE_TYPE", U8),
    Attr(15, _P + "RES_SUMMARY", TABLE, _P + "RES_SUMMARY_ENTRY"),
    Attr(16, _P + "RES_SUMMARY_ENTRY", NEST),
    Attr(17, _P + "RES_SUMMARY_ENTRY_NAME", STRING),
    Attr(18, _P + "RES_SUMMARY_ENTRY_CURR", U64),
    Attr(19, _P + "RES_QP", TABLE, _P + "RES_QP_ENTRY"),  # 19 is also a STAT_RES value
    Attr(20, _P + "RES_QP_ENTRY", NEST),
    Attr(21, _P + "RES_LQPN", U32),
    Attr(22, _P + "RES_RQPN", U32),
    Attr(23, _P + "RES_RQ_PSN", U32),
    Attr(24, _P + "RES_SQ_PSN", U32),
    Attr(25, _P + "RES_PATH_MIG_STATE", U8),
    Attr(26, _P + "RES_TYPE", U8),
    Attr(27, _P + "RES_STATE", U8),
    Attr(28, _P + "RES_PID", U32),
    Attr(29, _P + "RES_KERN_NAME", STRING),
    Attr(30, _P + "RES_CM_ID", TABLE, _P + "RES_CM_ID_ENTRY"),
    Attr(31, _P + "RES_CM_ID_ENTRY", NEST),
    Attr(32, _P + "RES_PS", U32),
    Attr(33, _P + "RES_SRC_ADDR", BINARY),  # struct __kernel_sockaddr_storage
    Attr(34, _P + "RES_DST_ADDR", BINARY),
    Attr(35, _P + "RES_CQ", TABLE, _P + "RES_CQ_ENTRY"),
    Attr(36, _P + "RES_CQ_ENTRY", NEST),
    Attr(37, _P + "RES_CQE", U32),
    Attr(38, _P + "RES_USECNT", U64),
    Attr(39, _P + "RES_POLL_CTX", U8),
    Attr(40, _P + "RES_MR", TABLE, _P + "RES_MR_ENTRY"),  # 40 is also a STAT_RES value
    Attr(41, _P + "RES_MR_ENTRY", NEST),
    Attr(42, _P + "RES_RKEY", U32),
    Attr(43, _P + "RES_LKEY", U32),
    Attr(44, _P + "RES_IOVA", U64),
    Attr(45, _P + "RES_MRLEN", U64),
    Attr(46, _P + "RES_PD", TABLE, _P + "RES_PD_ENTRY"),
    Attr(47, _P + "RES_PD_ENTRY", NEST),
    Attr(48, _P + "RES_LOCAL_DMA_LKEY", U32),
    Attr(49, _P + "RES_UNSAFE_GLOBAL_RKEY", U32),
    Attr(50, _P + "NDEV_INDEX", U32),
    Attr(51, _P + "NDEV_NAME", STRING),
    Attr(52, _P + "DRIVER", DRIVER),
    Attr(53, _P + "DRIVER_ENTRY", NEST),
    Attr(54, _P + "DRIVER_STRING", STRING),
    Attr(55, _P + "DRIVER_PRINT_TYPE", U8),
    Attr(56, _P + "DRIVER_S32", S32),
    Attr(57, _P + "DRIVER_U32", U32),
    Attr(58, _P + "DRIVER_S64", S64),
    Attr(59, _P + "DRIVER_U64", U64),
    Attr(60, _P + "RES_PDN", U32),
    Attr(61, _P + "RES_CQN", U32),
    Attr(62, _P + "RES_MRN", U32),
    Attr(63, _P + "RES_CM_IDN", U32),
    Attr(64, _P + "RES_CTXN", U32),
    Attr(65, _P + "LINK_TYPE", STRING),
    Attr(66, "RDMA_NLDEV_SYS_ATTR_NETNS_MODE", U8),
    Attr(67, _P + "DEV_PROTOCOL", STRING),
    Attr(68, "RDMA_NLDEV_NET_NS_FD", U32),
    Attr(69, _P + "CHARDEV_TYPE", STRING),
    Attr(70, _P + "CHARDEV_NAME", STRING),
    Attr(71, _P + "CHARDEV_ABI", U64),
    Attr(72, _P + "CHARDEV", U64),
    Attr(73, _P + "UVERBS_DRIVER_ID", U32),  # the header says u64; the kernel puts a u32
    Attr(74, _P + "STAT_MODE", U32),
    Attr(75, _P + "STAT_RES", U32),
    Attr(76, _P + "STAT_AUTO_MODE_MASK", U32),
    Attr(77, _P + "STAT_COUNTER", TABLE, _P + "STAT_COUNTER_ENTRY"),
    Attr(78, _P + "STAT_COUNTER_ENTRY", NEST),
    Attr(79, _P + "STAT_COUNTER_ID", U32),
    # In STAT_SET requests its elements are bare STAT_HWCOUNTER_INDEX u32s.
    Attr(80, _P + "STAT_HWCOUNTERS", TABLE, _P + "STAT_HWCOUNTER_ENTRY"),
    Attr(81, _P + "STAT_HWCOUNTER_ENTRY", NEST),
    Attr(82, _P + "STAT_HWCOUNTER_ENTRY_NAME", STRING),
    Attr(83, _P + "STAT_HWCOUNTER_ENTRY_VALUE", U64),
    Attr(84, _P + "DEV_DIM", U8),
    Attr(85, _P + "RES_RAW", BINARY),
    Attr(86, _P + "RES_CTX", TABLE, _P + "RES_CTX_ENTRY"),
    Attr(87, _P + "RES_CTX_ENTRY", NEST),
    Attr(88, _P + "RES_SRQ", TABLE, _P + "RES_SRQ_ENTRY"),
    Attr(89, _P + "RES_SRQ_ENTRY", NEST),
    Attr(90, _P + "RES_SRQN", U32),
    Attr(91, _P + "MIN_RANGE", U32),
    Attr(92, _P + "MAX_RANGE", U32),
    Attr(93, "RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK", U8),
    Attr(94, _P + "STAT_HWCOUNTER_INDEX", U32),
    Attr(95, _P + "STAT_HWCOUNTER_DYNAMIC", U8),
    Attr(96, "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE", U8),
    Attr(97, _P + "DRIVER_DETAILS", U8),
    Attr(98, _P + "RES_SUBTYPE", STRING),
    Attr(99, _P + "DEV_TYPE", U8),
    Attr(100, _P + "PARENT_NAME", STRING),
    Attr(101, _P + "NAME_ASSIGN_TYPE", U8),
    Attr(102, _P + "EVENT_TYPE", U8),
    Attr(103, "RDMA_NLDEV_SYS_ATTR_MONITOR_MODE", U8),
    Attr(104, _P + "STAT_OPCOUNTER_ENABLED", U8),
    Attr(105, _P + "FRMR_POOLS", TABLE, _P + "FRMR_POOL_ENTRY"),
    Attr(106, _P + "FRMR_POOL_ENTRY", NEST),
    Attr(107, _P + "FRMR_POOL_KEY", NEST),
    Attr(108, _P + "FRMR_POOL_KEY_ATS", U8),
    Attr(109, _P + "FRMR_POOL_KEY_ACCESS_FLAGS", U32),
    Attr(110, _P + "FRMR_POOL_KEY_VENDOR_KEY", U64),
    Attr(111, _P + "FRMR_POOL_KEY_NUM_DMA_BLOCKS", U64),
    Attr(112, _P + "FRMR_POOL_QUEUE_HANDLES", U32),
    Attr(113, _P + "FRMR_POOL_MAX_IN_USE", U64),
    Attr(114, _P + "FRMR_POOL_IN_USE", U64),
    Attr(115, _P + "FRMR_POOLS_AGING_PERIOD", U32),
    Attr(116, _P + "FRMR_POOL_PINNED_HANDLES", U32),
    Attr(117, _P + "FRMR_POOL_KEY_KERNEL_VENDOR_KEY", U64),
    Attr(118, _P + "RES_SUMMARY_ENTRY_MAX", U64),
)

BY_ID: dict[int, Attr] = {a.id: a for a in ATTRIBUTES}
BY_NAME: dict[str, Attr] = {a.name: a for a in ATTRIBUTES}

# enum rdma_nl_notify_event_type (include/uapi/rdma/rdma_netlink.h): RDMA_<NAME>_EVENT, the
# EVENT_TYPE of a monitor event.
EVENT_TYPES: dict[int, str] = {
    0: "REGISTER",
    1: "UNREGISTER",
    2: "NETDEV_ATTACH",
    3: "NETDEV_DETACH",
    4: "RENAME",
    5: "NETDEV_RENAME",
}

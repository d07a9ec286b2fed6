"""The data path's command-line options, declared once for every command that drives it
(loopback, ping, mesh, doctor): each option's flags, its type, the range the verbs and the
wire allow and where that limit comes from, its metavar; and the path a command's parsed
options ask for (path_spec).

A command takes the options it drives, with its own help and default, and narrows a range
where it asks for less than the data path allows (a ping's payload, a mesh's count).

Cheap to import: every command's options are built at each start (argparse), so the verbs
modules (ibtool.rdma.ladder and below) are imported only when a path is made.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ibtool.argtypes import number
from ibtool.model.deferred import dataclass
from ibtool.rdma.wire import MODES

# The limits, each where it comes from:
# - IBTA vol. 1 caps a message at 2^31 bytes (a port's max_msg_sz, struct ibv_port_attr in
#   rdma-core libibverbs/verbs.h, is at most that); the device's own limit is found when the
#   MR is registered;
# - a ping's payload is at most MAX_PING_SIZE: each session registers that much
#   (ibtool.rdma.ping.session), whatever the client's size;
# - a count is a C int, as ibv_rc_pingpong's -n (rdma-core libibverbs/examples/rc_pingpong.c);
# - times as iputils' ping(8) takes them, in milliseconds in a C int (ping/ping.c: -W "bad
#   linger time" above INT_MAX / 1000 s);
# - a GID index is a uint8_t in an address vector (libibverbs/verbs.h, struct
#   ibv_global_route sgid_index), though rxe's table has 1024 entries; a P_Key index a
#   uint16_t (struct ibv_qp_attr pkey_index), the port's table, checked when the QPs are
#   made, smaller;
# - an SL is 4 bits (IBTA vol. 1, the LRH's SL field), a traffic class 8 (the GRH's TClass);
# - the Local ACK Timeout is 5 bits, 4.096 us * 2^N a try (IBTA vol. 1, QP attributes;
#   struct ibv_qp_attr timeout);
# - an MTU is one of enum ibv_mtu's (libibverbs/verbs.h: IBV_MTU_256 .. IBV_MTU_4096).
MAX_MESSAGE = 2**31
MAX_PING_SIZE = 1 << 20
INT_MAX = 2**31 - 1
LONGEST = 2147483.0  # INT_MAX milliseconds, in seconds
MTUS = (256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class DataOption:
    """One data-path option as argparse takes it. A number (`kind` int or float) in [low,
    high], or (low, high] with `low_open`, its errors naming `unit` and `hint`; or, with
    `kind` None, one of `choices`. `help` and `default`: what every command that takes the
    option says of it, where they say the same."""

    flags: tuple[str, ...]
    kind: type | None = None
    low: float = 0
    high: float = 0
    metavar: str | None = None
    unit: str = ""
    hint: str | None = None
    low_open: bool = False
    choices: tuple | None = None
    help: str | None = None
    default: Any = None

    def add(self, parser, **given: Any):
        """Add the option to `parser` (or an argument group); `given` are add_argument's own
        keywords (help, default), over the declared ones."""
        kwargs: dict[str, Any] = {}
        if self.kind is not None:
            kwargs["type"] = number(
                self.kind, self.low, self.high,
                unit=self.unit, low_open=self.low_open, hint=self.hint,
            )  # fmt: skip
        if self.choices is not None:
            kwargs["choices"] = self.choices
        if self.default is not None:
            kwargs["default"] = self.default
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        if self.help is not None:
            kwargs["help"] = self.help
        kwargs.update(given)
        return parser.add_argument(*self.flags, **kwargs)


DATAPATH_OPTIONS: dict[str, DataOption] = {
    "size": DataOption(("--size",), int, 1, MAX_MESSAGE, "BYTES", unit="bytes"),
    "count": DataOption(("-c", "--count"), int, 1, INT_MAX, "N"),
    "timeout": DataOption(("--timeout",), float, 0, LONGEST, "S", unit="seconds", low_open=True),
    "mode": DataOption(
        ("--mode",),
        choices=tuple(MODES),
        default="send",
        help="SEND/RECV (default) or RDMA WRITE WITH IMMEDIATE",
    ),
    "gid_index": DataOption(
        ("--gid-index",), int, 0, 255, "N", help="GID index (default: the --best rule)"
    ),
    "pkey_index": DataOption(("--pkey-index",), int, 0, 0xFFFF, "N"),
    "sl": DataOption(("--sl",), int, 0, 15, "N"),
    "tclass": DataOption(
        ("--tclass",), int, 0, 255, "N", hint="for DSCP D give --tclass $((D << 2))"
    ),
    "qp_timeout": DataOption(("--qp-timeout",), int, 0, 31, "N"),
    "mtu": DataOption(("--mtu",), int, MTUS[0], MTUS[-1], "BYTES", unit="bytes", choices=MTUS),
}

_DECLARED = ("flags", "low", "high", "metavar", "unit", "hint", "low_open")


def add_datapath_option(parser, name: str, **given: Any):
    """Add the data-path option `name` (a key of DATAPATH_OPTIONS) to `parser` (or an
    argument group), as declared there. `given`: the command's own help and default, and
    where the command differs from the declaration, its flags, metavar, low, high, low_open,
    unit or hint (a narrower range: what it asks of the data path)."""
    declared = {k: given.pop(k) for k in _DECLARED if k in given}
    return replace(DATAPATH_OPTIONS[name], **declared).add(parser, **given)


def path_spec(args, **chosen: Any):
    """The PathSpec a command's parsed options ask for, from those it takes of --sl, --tclass,
    --mtu (bytes, to its ibv_mtu code), --pkey-index and --qp-timeout (the others: PathSpec's
    defaults); `chosen` are PathSpec fields settled otherwise (a P_Key index the port's table
    resolved)."""
    from ibtool.rdma.ladder import MTU_CODES, PathSpec

    mtu = getattr(args, "mtu", None)
    fields: dict[str, Any] = {
        "sl": getattr(args, "sl", None) or 0,
        "traffic_class": getattr(args, "tclass", None) or 0,
        "mtu": MTU_CODES[mtu] if mtu else None,
        "pkey_index": getattr(args, "pkey_index", None) or 0,
    }
    ack = getattr(args, "qp_timeout", None)
    if ack is not None:
        fields["ack_timeout"] = ack
    fields.update(chosen)
    return PathSpec(**fields)

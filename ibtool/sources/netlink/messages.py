"""NLDEV messages on pyroute2: the nla_map built from the attribute table, the Marshal, and the
strict walk that turns a decoded message into plain Python values.

pyroute2 decodes attributes lazily and leniently: a short attribute is clamped to what is left
and its integer read from whatever bytes follow, and a failure is logged and swallowed. So every
attribute's framing and size are checked here before pyroute2 decodes it, and a bad one is a
DataError naming it. Attribute ids unknown to the table (newer kernels) are skipped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pyroute2.netlink import nla, nlmsg
from pyroute2.netlink.marshal import Marshal

from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink.errors import malformed

_PYROUTE2_TYPES = {
    A.PAD: "none",
    A.U8: "uint8",
    A.U16: "uint16",
    A.U32: "uint32",
    A.U64: "uint64",
    A.S32: "int32",
    A.S64: "int64",
    A.STRING: "asciiz",
    A.BINARY: "cdata",
    # Sent with NLA_F_NESTED: strict (SET-type) handlers reject nests without it.
    A.NEST: "nldev_nest|nested",
    A.TABLE: "nldev_nest|nested",
    A.DRIVER: "nldev_nest|nested",
}

# Explicit-id 3-tuples: pyroute2 keys its decode map on the id and masks the flag bits.
NLA_MAP = tuple((a.id, a.name, _PYROUTE2_TYPES[a.kind]) for a in A.ATTRIBUTES)


class nldev_nest(nla):
    """Any NLDEV nest: the kernel parses nests against the top-level policy, so one map."""

    nla_map = NLA_MAP


nldev_nest.nldev_nest = nldev_nest


class nldevmsg(nlmsg):
    """An NLDEV message: no family header, attributes right after the nlmsghdr."""

    nla_map = NLA_MAP
    nldev_nest = nldev_nest


class NldevMarshal(Marshal):
    """Keyed by the real message type, (RDMA_NL_NLDEV << 10) + command, for every command.

    NLMSG_ERROR and NLMSG_DONE stay bare headers: the exchange reads their payload, since
    pyroute2's nlmsgerr loses the extended-ack text of the capped acks NETLINK_CAP_ACK asks for.
    """

    msg_map = {A.nlmsg_type(command): nldevmsg for command in A.COMMANDS}

    def parse_one_message(self, key, flags, sequence_number, data, offset, length):
        msg = self.msg_map.get(key, nlmsg)(data, offset=offset)
        msg.decode()
        return msg


_marshal = NldevMarshal()


def parse(data: bytes) -> list:
    """The messages of one datagram; a truncated one is a DataError (pyroute2 drops it)."""
    offset = 0
    while offset < len(data):
        left = len(data) - offset
        length = struct.unpack_from("=I", data, offset)[0] if left >= 16 else 0
        if not 16 <= length <= left:
            raise malformed(
                f"truncated message: {left} bytes at offset {offset}, its header says {length}"
            )
        offset += (length + 3) & ~3
    return list(_marshal.parse(bytes(data)))


# -- encoding ---------------------------------------------------------------------------------


def encode(
    command: int, attributes: Mapping[str, Any] | None = None, *, flags: int, seq: int
) -> bytes:
    """One NLDEV request as bytes; `attributes` maps uapi names to Python values."""
    msg = nldevmsg()
    msg["header"]["type"] = A.nlmsg_type(command)
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = seq
    msg["attrs"] = _to_pyroute2((attributes or {}).items())
    msg.encode()
    return bytes(msg.data)


def _to_pyroute2(pairs: Iterable[tuple[str, Any]]) -> list:
    return [[name, _value_to_pyroute2(_attr(name), value)] for name, value in pairs]


def _attr(name: str) -> A.Attr:
    try:
        return A.BY_NAME[name]
    except KeyError:
        raise ValueError(f"no NLDEV attribute {name!r}") from None


def _value_to_pyroute2(attr: A.Attr, value: Any) -> Any:
    if attr.kind == A.NEST:
        return {"attrs": _to_pyroute2(value.items())}
    if attr.kind == A.TABLE:
        # Elements are values of the table's entry attribute, or explicit (name, value) pairs
        # (STAT_SET sends STAT_HWCOUNTERS as bare STAT_HWCOUNTER_INDEX u32s).
        pairs = [v if isinstance(v, tuple) else (attr.entry, v) for v in value]
        return {"attrs": _to_pyroute2(pairs)}
    if attr.kind == A.DRIVER:
        pairs = []
        for key, v in value.items():
            pairs.append(("RDMA_NLDEV_ATTR_DRIVER_STRING", key))
            pairs.append((_driver_value_attr(v), v))
        return {"attrs": _to_pyroute2(pairs)}
    return value


def _driver_value_attr(value: Any) -> str:
    if isinstance(value, str):
        return "RDMA_NLDEV_ATTR_DRIVER_STRING"
    return "RDMA_NLDEV_ATTR_DRIVER_U64" if value >= 0 else "RDMA_NLDEV_ATTR_DRIVER_S64"


# -- decoding ---------------------------------------------------------------------------------


def attributes(msg) -> dict[str, Any]:
    """A decoded message's attributes as {uapi name: Python value}, checked on the way."""
    return _nest(msg, ())


def _nest(container, path: tuple[str, ...]) -> dict[str, Any]:
    return {name: value for name, value in _walk(container, path)}


def _walk(container, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    for slot in container["attrs"]:
        name, cell = slot.cell
        attr = A.BY_NAME.get(name)
        _check_frame(cell, attr, path)
        if attr is None or attr.kind == A.PAD:
            continue
        yield name, _value(cell, attr, (*path, name))


def _where(path: tuple[str, ...]) -> str:
    return " > ".join(path)


def _check_frame(cell, attr: A.Attr | None, path: tuple[str, ...]) -> None:
    # Before decode, pyroute2 has clamped cell.length to what the container has left.
    length, type_ = struct.unpack_from("=HH", cell.data, cell.offset)
    if 4 <= length <= cell.length:
        return
    what = attr.name if attr else f"attribute {type_ & A.NLA_TYPE_MASK}"
    raise malformed(
        f"{_where((*path, what))} is truncated (length {length}, {cell.length} bytes left)"
    )


def _value(cell, attr: A.Attr, path: tuple[str, ...]) -> Any:
    payload = struct.unpack_from("=H", cell.data, cell.offset)[0] - 4
    need = A.SIZES.get(attr.kind, 0)
    if payload < need:
        raise malformed(f"{_where(path)} has {payload} bytes, a {attr.kind} needs {need}")
    try:
        cell.decode()
    except (struct.error, ValueError) as e:
        raise malformed(f"{_where(path)}: {e}") from e
    if attr.kind == A.NEST:
        return _nest(cell, path)
    if attr.kind == A.TABLE:
        return [value if name == attr.entry else (name, value) for name, value in _walk(cell, path)]
    if attr.kind == A.DRIVER:
        return _driver(cell, path)
    value = cell.getvalue()
    if attr.kind == A.STRING:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value.split("\0", 1)[0]
    if attr.kind == A.BINARY:
        return bytes(value)
    return value


def _driver(cell, path: tuple[str, ...]) -> dict[str, Any]:
    """DRIVER is a flat run of {DRIVER_STRING key, [DRIVER_PRINT_TYPE], value} triples."""
    result: dict[str, Any] = {}
    key = None
    for name, value in _walk(cell, path):
        if name == "RDMA_NLDEV_ATTR_DRIVER_PRINT_TYPE":
            continue
        if key is None:
            if name != "RDMA_NLDEV_ATTR_DRIVER_STRING":
                raise malformed(f"{_where((*path, name))} has no key before it")
            key = value
        else:
            result[key] = value
            key = None
    if key is not None:
        raise malformed(f"{_where(path)} ends with key {key!r} and no value")
    return result

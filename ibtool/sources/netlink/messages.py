"""NLDEV messages on pyroute2: the nla_map built from the attribute table, the Marshal, and the
strict walk that turns a decoded message into plain Python values.

pyroute2 frames the messages and encodes requests; the attributes of a reply are walked here
with struct (faster, see below, and strict where pyroute2 is lenient: it clamps a short
attribute to what is left, reads its integer from whatever bytes follow and logs and swallows
failures). A truncated or short attribute is a DataError naming it. Attribute ids unknown to
the table (newer kernels) are skipped.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink.errors import malformed


def _netlink_core() -> tuple:
    """pyroute2's nla, nlmsg and Marshal without running pyroute2/__init__.py.

    The package's __init__ imports every pyroute2 API (IPRoute, NDB, IPDB, conntrack, ...):
    about 380 modules, 80 ms on the host and ~10 s in the testbed guest, whose root is 9p under
    TCG. pyroute2.netlink and its marshal need four of them (common, netlink, exceptions,
    marshal; pyroute2 0.7 and 0.8 keep Marshal in netlink/nlsocket.py, which needs a few
    more). When pyroute2 is not loaded yet, a bare package module stands in for it while
    they load; afterwards it and the submodules are taken out of sys.modules again (this module
    keeps its references), so a later ``import pyroute2`` (another plugin's) loads the real,
    complete package from scratch.
    """
    bare = None
    if "pyroute2" not in sys.modules:
        spec = importlib.util.find_spec("pyroute2")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("No module named 'pyroute2'", name="pyroute2")
        bare = types.ModuleType("pyroute2")
        bare.__spec__ = spec
        bare.__path__ = list(spec.submodule_search_locations)
        sys.modules["pyroute2"] = bare
    try:
        from pyroute2.netlink import nla, nlmsg

        try:  # pyroute2 0.9 (pyroute2/netlink/marshal.py)
            from pyroute2.netlink.marshal import Marshal
        except ModuleNotFoundError:  # 0.7 and 0.8, Debian 12 to 14's: the same class, there
            from pyroute2.netlink.nlsocket import Marshal
    finally:
        if bare is not None:
            for name in [m for m in sys.modules if m == "pyroute2" or m.startswith("pyroute2.")]:
                del sys.modules[name]
    return nla, nlmsg, Marshal


nla, nlmsg, Marshal = _netlink_core()

NLA_F_NESTED = 1 << 15  # include/uapi/linux/netlink.h

# (pyroute2 type, NLA flags): the flags as the explicit fourth member of an nla_map entry, which
# every pyroute2 from 0.7 reads ("nested" as a "type|nested" string is 0.9's only).
_PYROUTE2_TYPES = {
    A.PAD: ("none", 0),
    A.U8: ("uint8", 0),
    A.U16: ("uint16", 0),
    A.U32: ("uint32", 0),
    A.U64: ("uint64", 0),
    A.S32: ("int32", 0),
    A.S64: ("int64", 0),
    A.STRING: ("asciiz", 0),
    A.BINARY: ("cdata", 0),
    # Sent with NLA_F_NESTED: strict (SET-type) handlers reject nests without it.
    A.NEST: ("nldev_nest", NLA_F_NESTED),
    A.TABLE: ("nldev_nest", NLA_F_NESTED),
    A.DRIVER: ("nldev_nest", NLA_F_NESTED),
}

# Explicit-id 4-tuples: pyroute2 keys its decode map on the id and masks the flag bits.
NLA_MAP = tuple((a.id, a.name, *_PYROUTE2_TYPES[a.kind]) for a in A.ATTRIBUTES)


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
# Attributes are walked with struct here, not decoded by pyroute2: its per-attribute objects
# cost ~20 us each on the host and ~1 ms under the testbed's TCG emulation, which made a dump
# of 1,000 QPs (~11,000 attributes) take 15 s there (bench/bench_res.py). pyroute2 still frames
# the messages and encodes the requests.

_HEADER = struct.Struct("=HH")
_INTEGERS = {
    A.U8: struct.Struct("=B"),
    A.U16: struct.Struct("=H"),
    A.U32: struct.Struct("=I"),
    A.U64: struct.Struct("=Q"),
    A.S32: struct.Struct("=i"),
    A.S64: struct.Struct("=q"),
}


def attributes(msg) -> dict[str, Any]:
    """A decoded message's attributes as {uapi name: Python value}, checked on the way."""
    start = msg.offset + 16  # NLDEV has no family header: attributes follow the nlmsghdr
    return _nest(msg.data, start, msg.offset + msg["header"]["length"], ())


def _nest(data, start: int, end: int, path: tuple[str, ...]) -> dict[str, Any]:
    return {name: value for name, value in _walk(data, start, end, path)}


def _walk(data, start: int, end: int, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    offset = start
    while end - offset >= 4:
        length, type_ = _HEADER.unpack_from(data, offset)
        attr = A.BY_ID.get(type_ & A.NLA_TYPE_MASK)
        if not 4 <= length <= end - offset:
            what = attr.name if attr else f"attribute {type_ & A.NLA_TYPE_MASK}"
            raise malformed(
                f"{_where((*path, what))} is truncated (length {length}, {end - offset} bytes left)"
            )
        if attr is not None and attr.kind != A.PAD:
            yield attr.name, _value(data, offset + 4, offset + length, attr, (*path, attr.name))
        offset += (length + 3) & ~3


def _where(path: tuple[str, ...]) -> str:
    return " > ".join(path)


def _value(data, start: int, end: int, attr: A.Attr, path: tuple[str, ...]) -> Any:
    kind = attr.kind
    integer = _INTEGERS.get(kind)
    if integer is not None:
        if end - start < integer.size:
            raise malformed(
                f"{_where(path)} has {end - start} bytes, a {kind} needs {integer.size}"
            )
        # A longer payload is read as the kernel's policy reads it: its first bytes.
        return integer.unpack_from(data, start)[0]
    if kind == A.STRING:
        return bytes(data[start:end]).split(b"\0", 1)[0].decode("utf-8", "replace")
    if kind == A.BINARY:
        return bytes(data[start:end])
    if kind == A.NEST:
        return _nest(data, start, end, path)
    if kind == A.TABLE:
        return [
            value if name == attr.entry else (name, value)
            for name, value in _walk(data, start, end, path)
        ]
    return _driver(data, start, end, path)


def _driver(data, start: int, end: int, path: tuple[str, ...]) -> dict[str, Any]:
    """DRIVER is a flat run of {DRIVER_STRING key, [DRIVER_PRINT_TYPE], value} triples."""
    result: dict[str, Any] = {}
    key = None
    for name, value in _walk(data, start, end, path):
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

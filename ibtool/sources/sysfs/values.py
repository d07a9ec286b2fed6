"""The values of sysfs files as the kernel prints them, parsed; what is wrong with one, said.

Formats are those of drivers/infiniband/core/sysfs.c (and
Documentation/ABI/stable/sysfs-class-infiniband): "N: text" enums, hex LIDs, two generations of
rate strings, "%pI6" GIDs; and net/core/dev.c's netdev names. A parser raises ValueError for text
that is not the format (a malformed value) and Invalid for a well-formed value the kernel never
prints (out of range, an enum member no kernel defines).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from ibtool.model.names import IFNAMSIZ, valid_netdev_name  # noqa: F401 (the sources' own)
from ibtool.model.records import Rate

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\s*\((\d+)X\s*([A-Z0-9]*)\)\s*$", re.ASCII)
# "%d: %s" / "%u: %s" of state, phys_state and node_type
_ENUM_RE = re.compile(r"(-?[0-9]+):")
_HEX_RE = re.compile(r"0[xX][0-9a-fA-F]+")  # "0x%x" of lid and sm_lid, "0x%08x" of cap_mask
_DECIMAL_RE = re.compile(r"-?[0-9]+")
# node_guid, sys_image_guid: "%04x:%04x:%04x:%04x"; gids/N: "%pI6", never compressed
_GUID_RE = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}")
GID_RE = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}")
# Where node_type is missing (an incomplete capture), iWARP hardware is known by the PCI driver
# its ib_device hangs off (i40iw: i40e; iw_cxgb4: cxgb4; iw_cxgb3: cxgb3) or by its hca_type
# (i40iw "I40IW", iw_cxgb4 and iw_cxgb3 the LAN driver's name, qedr "FastLinQ QL... iWARP").
_IWARP_DRIVERS = frozenset({"i40e", "cxgb4", "cxgb3"})
_IWARP_HCA_TYPES = frozenset({"I40IW", "cxgb4", "cxgb3"})


class Invalid(ValueError):
    """A well-formed value the kernel never prints; the message says what is wrong with it."""


# A byte that was not UTF-8 is a lone surrogate (U+DC80-U+DCFF: read_attr decodes with
# surrogateescape, PEP 383), which repr writes as \udcNN: a warning shows the byte, \xNN.
_UNDECODED = re.compile(r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])")


def quoted(text: str) -> str:
    """A value as a warning quotes it: repr (escapes keep the warning on one line, bytes that
    were not UTF-8 as \\xNN), cut short."""
    said = repr(text) if len(text) <= 40 else f"{text[:40]!r}..."
    return _UNDECODED.sub(r"\1\\x\2", said)


def is_number(text: str) -> bool:
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
            raise Invalid(f"{quoted(text)} is not {what} the kernel defines")
        return member

    return parse


def parse_decimal(maximum: int) -> Callable[[str], int]:
    """'%u' up to maximum."""

    def parse(text: str) -> int:
        if not _DECIMAL_RE.fullmatch(text):
            raise ValueError(text)
        value = int(text)
        if not 0 <= value <= maximum:
            raise Invalid(f"{quoted(text)} is out of range (0..{maximum})")
        return value

    return parse


def parse_hex(maximum: int) -> Callable[[str], int]:
    """'0x%x' up to maximum."""

    def parse(text: str) -> int:
        if not _HEX_RE.fullmatch(text):
            raise ValueError(text)
        value = int(text, 16)
        if value > maximum:
            raise Invalid(f"{quoted(text)} is out of range (0x0..{maximum:#x})")
        return value

    return parse


def parse_guid(text: str) -> str:
    if not _GUID_RE.fullmatch(text):
        raise ValueError(text)
    return text


def parse_netdev(text: str) -> str:
    if not valid_netdev_name(text):
        raise ValueError(text)
    return text


def printable(text: str) -> bool:
    # Bytes that were not UTF-8 are lone surrogates (read_attr), which are not printable.
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

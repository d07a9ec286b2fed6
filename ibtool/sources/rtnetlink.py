"""What NETLINK_ROUTE tells of a netdev's DCB and of the route to an address; the running kernel
only (a --root tree has no kernel to ask).

DCB: one RTM_GETDCB request (struct dcbmsg, cmd DCB_CMD_IEEE_GET, DCB_ATTR_IFNAME), answered by
net/dcb/dcbnl.c dcbnl_ieee_fill with one RTM_GETDCB message (include/uapi/linux/dcbnl.h):

    DCB_ATTR_IFNAME
    DCB_ATTR_IEEE (nested)
        DCB_ATTR_IEEE_PFC            struct ieee_pfc {u8 pfc_cap; u8 pfc_en; u8 mbc; u16 delay;
                                     u64 requests[8]; u64 indications[8];}
        DCB_ATTR_IEEE_APP_TABLE      (nested) DCB_ATTR_IEEE_APP / DCB_ATTR_DCB_APP (6.1+, the
                                     non-IEEE selectors: PCP), each struct dcb_app {u8 selector;
                                     u8 priority; u16 protocol;}
        DCB_ATTR_DCB_APP_TRUST_TABLE (nested, 6.1+, only from drivers with dcbnl_getapptrust)
                                     u8 selectors, typed DCB_ATTR_IEEE_APP / DCB_ATTR_DCB_APP
    DCB_ATTR_DCBX                    u8

A netdev without dcbnl_ops (veth, the netdevs of rxe) is answered EOPNOTSUPP; one without PFC
support has no DCB_ATTR_IEEE_PFC. What `dcb pfc show`, `dcb app show ... dscp-prio` and `dcb
apptrust show` (iproute2 dcb/dcb_pfc.c, dcb_app.c, dcb_apptrust.c) print comes from these.

The route: RTM_GETROUTE through pyroute2 (what `ip route get` asks).
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from ibtool.errors import UsageError
from ibtool.model.system import ROUTE_TYPES, Dcb, Route

Warn = Callable[[str], None]

NETLINK_ROUTE = 0
NLM_F_REQUEST = 0x1
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
RTM_GETDCB = 78
DCB_CMD_IEEE_GET = 21
# enum dcbnl_attrs
DCB_ATTR_IFNAME, DCB_ATTR_IEEE = 1, 13
# enum ieee_attrs
DCB_ATTR_IEEE_PFC, DCB_ATTR_IEEE_APP_TABLE, DCB_ATTR_DCB_APP_TRUST_TABLE = 2, 3, 11
# enum ieee_attrs_app
DCB_ATTR_IEEE_APP, DCB_ATTR_DCB_APP = 1, 2
IEEE_8021QAZ_APP_SEL_DSCP = 5
# The selector names of iproute2's dcb apptrust (dcb/dcb_apptrust.c selector_names).
SELECTOR_NAMES = {
    1: "ethtype",
    2: "stream-port",
    3: "dgram-port",
    4: "port",
    5: "dscp",
    255: "pcp",  # DCB_APP_SEL_PCP (include/uapi/linux/dcbnl.h)
}

TIMEOUT = 5.0  # seconds; the kernel answers at once, this only bounds a bug
RECV_BUFFER = 64 * 1024  # a full IEEE reply (ETS, PFC, 64 DSCP apps, peer data) is ~2 KiB


class Malformed(ValueError):
    """A reply that does not follow the uapi layout."""


def open_route_socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)


def _attrs(data: bytes, offset: int = 0, end: int | None = None) -> list[tuple[int, bytes]]:
    """The netlink attributes in data[offset:end]: (type without flags, payload)."""
    end = len(data) if end is None else end
    found = []
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4 or offset + length > end:
            raise Malformed(f"an attribute of {length} bytes at {offset}")
        found.append((kind & NLA_TYPE_MASK, data[offset + 4 : offset + length]))
        offset += (length + 3) & ~3
    return found


def dcb_request(netdev: str, seq: int) -> bytes:
    name = netdev.encode() + b"\0"
    attr = struct.pack("=HH", 4 + len(name), DCB_ATTR_IFNAME) + name + b"\0" * (-len(name) % 4)
    body = struct.pack("=BBH", socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0) + attr
    return struct.pack("=IHHII", 16 + len(body), RTM_GETDCB, NLM_F_REQUEST, seq, 0) + body


def parse_dcb(netdev: str, payload: bytes) -> Dcb | None:
    """A DCB_CMD_IEEE_GET reply's payload (after the nlmsghdr): None without DCB_ATTR_IEEE."""
    if len(payload) < 4:
        raise Malformed("a reply shorter than struct dcbmsg")
    top = dict(_attrs(payload, 4))
    ieee = top.get(DCB_ATTR_IEEE)
    if ieee is None:
        return None
    pfc_cap, pfc_enabled = None, frozenset()
    apps: list[tuple[int, int, int]] = []
    trust: tuple[str, ...] | None = None
    for kind, value in _attrs(ieee):
        if kind == DCB_ATTR_IEEE_PFC:
            if len(value) < 2:
                raise Malformed(f"struct ieee_pfc of {len(value)} bytes")
            pfc_cap, en = value[0], value[1]
            pfc_enabled = frozenset(p for p in range(8) if en >> p & 1)
        elif kind == DCB_ATTR_IEEE_APP_TABLE:
            for app_kind, app in _attrs(value):
                if app_kind not in (DCB_ATTR_IEEE_APP, DCB_ATTR_DCB_APP):
                    continue
                if len(app) < 4:
                    raise Malformed(f"struct dcb_app of {len(app)} bytes")
                apps.append(struct.unpack_from("=BBH", app))
        elif kind == DCB_ATTR_DCB_APP_TRUST_TABLE:
            names = []
            for sel_kind, sel in _attrs(value):
                if sel_kind in (DCB_ATTR_IEEE_APP, DCB_ATTR_DCB_APP) and len(sel) >= 1:
                    names.append(SELECTOR_NAMES.get(sel[0], str(sel[0])))
            trust = tuple(names)
    dscp = sorted({(proto, prio) for sel, prio, proto in apps if sel == IEEE_8021QAZ_APP_SEL_DSCP})
    return Dcb(
        netdev=netdev,
        pfc_enabled=pfc_enabled,
        dscp_prio=tuple(dscp),
        trust=trust,
        pfc_cap=pfc_cap,
        apps=tuple(sorted(apps)),
    )


def _errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def read_dcb(netdev: str, warn: Warn, open_socket: Callable[[], Any] = open_route_socket):
    """Dcb of `netdev`, or None: no DCB there (EOPNOTSUPP), or a failure, warned about."""
    seq = next(_SEQ)
    try:
        sock = open_socket()
    except OSError as e:
        warn(f"DCB of {netdev}: cannot open a NETLINK_ROUTE socket: {e.strerror or e}")
        return None
    try:
        sock.settimeout(TIMEOUT)
        sock.send(dcb_request(netdev, seq))
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            data, _, flags, _ = sock.recvmsg(RECV_BUFFER)
            if flags & socket.MSG_TRUNC:
                raise Malformed(f"a reply larger than {RECV_BUFFER} bytes")
            answer = _answer(netdev, data, seq, warn)
            if answer is not _NOT_YET:
                return answer
        warn(f"DCB of {netdev}: the kernel did not answer within {TIMEOUT:g} s")
    except socket.timeout:
        warn(f"DCB of {netdev}: the kernel did not answer within {TIMEOUT:g} s")
    except Malformed as e:
        warn(f"DCB of {netdev}: malformed reply ({e})")
    except OSError as e:
        warn(f"DCB of {netdev}: {e.strerror or e}")
    finally:
        sock.close()
    return None


_SEQ = itertools.count((int(time.time()) ^ os.getpid()) & 0xFFFFFF)
_NOT_YET = object()


def _answer(netdev: str, data: bytes, seq: int, warn: Warn):
    """The Dcb (or None) one datagram answers, or _NOT_YET when it holds no answer."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind, _, msg_seq, _ = struct.unpack_from("=IHHII", data, offset)
        if length < 16 or offset + length > len(data):
            raise Malformed(f"a message of {length} bytes")
        payload = data[offset + 16 : offset + length]
        offset += (length + 3) & ~3
        if msg_seq != seq:
            continue
        if kind == NLMSG_ERROR:
            if len(payload) < 4:
                raise Malformed("NLMSG_ERROR without an error code")
            code = -struct.unpack_from("=i", payload)[0]
            if code in (0, errno.EOPNOTSUPP):
                return None  # no dcbnl_ops: no DCB here
            if code == errno.ENODEV:
                warn(f"DCB of {netdev}: no such netdev")
            else:
                warn(f"DCB of {netdev}: the kernel answered {_errno_name(code)}")
            return None
        if kind == NLMSG_DONE:
            return None
        if kind == RTM_GETDCB:
            return parse_dcb(netdev, payload)
    return _NOT_YET


# -- the route ----------------------------------------------------------------------------------

# What ip_route_output_key answers for a destination it has no usable route to.
_ERROR_TYPES = {
    errno.ENETUNREACH: "unreachable",
    errno.EHOSTUNREACH: "unreachable",
    errno.EACCES: "prohibit",
    errno.EINVAL: "blackhole",
}


def open_iproute():
    from pyroute2 import IPRoute

    return IPRoute()


def read_route(
    destination: str, warn: Warn, open_ipr: Callable[[], Any] = open_iproute
) -> Route | None:
    """The kernel's route to `destination` (RTM_GETROUTE); None when it cannot be asked (no
    pyroute2, a socket error), after a warning. UsageError for what is not an address."""
    try:
        address = ipaddress.ip_address(destination)
    except ValueError as e:
        raise UsageError(f"not an IP address: {destination!r}") from e
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        ipr = open_ipr()
    except ImportError:
        warn(f"route to {destination}: needs pyroute2")
        return None
    except OSError as e:
        warn(f"route to {destination}: cannot open a NETLINK_ROUTE socket: {e.strerror or e}")
        return None
    try:
        try:
            msgs = list(ipr.route("get", dst=str(address), family=family))
        except OSError as e:
            code = getattr(e, "code", None) or e.errno
            if code in _ERROR_TYPES:
                return Route(str(address), None, None, None, _ERROR_TYPES[code], _errno_name(code))
            warn(f"route to {destination}: {e}")
            return None
        except Exception as e:  # pyroute2's NetlinkError is an OSError; anything else: a bug
            code = getattr(e, "code", None)
            if isinstance(code, int) and code in _ERROR_TYPES:
                return Route(str(address), None, None, None, _ERROR_TYPES[code], _errno_name(code))
            warn(f"route to {destination}: {e}")
            return None
        if not msgs:
            warn(f"route to {destination}: the kernel gave no answer")
            return None
        msg = msgs[0]
        kind = msg.get("type")
        oif = msg.get_attr("RTA_OIF")
        return Route(
            destination=str(address),
            dev=_ifname(ipr, oif),
            src=msg.get_attr("RTA_PREFSRC"),
            gateway=msg.get_attr("RTA_GATEWAY"),
            type=ROUTE_TYPES[kind]
            if isinstance(kind, int) and 0 <= kind < len(ROUTE_TYPES)
            else str(kind),
        )
    finally:
        ipr.close()


def _ifname(ipr, index) -> str | None:
    if not index:
        return None
    try:
        links = list(ipr.link("get", index=index))
    except Exception:  # the netdev went away between the two requests
        return None
    return links[0].get_attr("IFLA_IFNAME") if links else None

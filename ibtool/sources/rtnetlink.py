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

The VLANs: an RTM_GETLINK dump, read where /proc/net/vlan/config (root's, mode 0600) cannot be;
see vlan_links.

The route: RTM_GETROUTE (what `ip route get` asks), and the IPv4 addresses: an RTM_GETADDR dump
(what `ip -4 addr` asks), both on a plain socket with struct rtmsg / struct ifaddrmsg
(include/uapi/linux/rtnetlink.h, if_addr.h): pyroute2's package import alone costs ~0.25 s on a
host and was 10 s of a 14 s `ibtool doctor` in the emulated testbed guest.
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


class KernelError(OSError):
    """The kernel answered a request with an error code (NLMSG_ERROR)."""


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


def _dcb_body(netdev: str) -> bytes:
    name = netdev.encode() + b"\0"
    attr = struct.pack("=HH", 4 + len(name), DCB_ATTR_IFNAME) + name + b"\0" * (-len(name) % 4)
    return struct.pack("=BBH", socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0) + attr


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
    try:
        sock = open_socket()
    except OSError as e:
        warn(f"DCB of {netdev}: cannot open a NETLINK_ROUTE socket: {e.strerror or e}")
        return None
    try:
        sock.settimeout(TIMEOUT)
        for kind, payload in _ask(sock, RTM_GETDCB, NLM_F_REQUEST, _dcb_body(netdev)):
            if kind == RTM_GETDCB:
                return parse_dcb(netdev, payload)
    except socket.timeout:
        warn(f"DCB of {netdev}: the kernel did not answer within {TIMEOUT:g} s")
    except Malformed as e:
        warn(f"DCB of {netdev}: malformed reply ({e})")
    except KernelError as e:
        if e.errno == errno.ENODEV:
            warn(f"DCB of {netdev}: no such netdev")
        elif e.errno != errno.EOPNOTSUPP:  # EOPNOTSUPP: no dcbnl_ops, no DCB here
            warn(f"DCB of {netdev}: the kernel answered {_errno_name(e.errno)}")
    except OSError as e:
        warn(f"DCB of {netdev}: {e.strerror or e}")
    finally:
        sock.close()
    return None


_SEQ = itertools.count((int(time.time()) ^ os.getpid()) & 0xFFFFFF)


# -- the route ----------------------------------------------------------------------------------

# What ip_route_output_key answers for a destination it has no usable route to.
_ERROR_TYPES = {
    errno.ENETUNREACH: "unreachable",
    errno.EHOSTUNREACH: "unreachable",
    errno.EACCES: "prohibit",
    errno.EINVAL: "blackhole",
}


RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE, RTM_GETROUTE = 20, 22, 24, 26
NLM_F_DUMP = 0x300
RTA_DST, RTA_SRC, RTA_OIF, RTA_GATEWAY, RTA_PREFSRC = 1, 2, 4, 5, 7
IFA_ADDRESS, IFA_LOCAL, IFA_LABEL = 1, 2, 3
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope,
# type, flags
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index


class _Message:
    """A reply as read_route reads pyroute2's: get("type"), get_attr(NAME)."""

    def __init__(self, kind: int, attrs: dict[str, Any]):
        self.kind, self.attrs = kind, attrs

    def get(self, key: str):
        return self.kind if key == "type" else None

    def get_attr(self, name: str):
        return self.attrs.get(name)


def _ip(value: bytes) -> str | None:
    return str(ipaddress.ip_address(value)) if len(value) in (4, 16) else None


class RouteSocket:
    """The two questions read_route asks of pyroute2's IPRoute (route "get", and the name of
    an interface index), on a plain NETLINK_ROUTE socket."""

    def __init__(self, open_socket: Callable[[], Any] = open_route_socket):
        self.sock = open_socket()
        self.sock.settimeout(TIMEOUT)

    def close(self) -> None:
        self.sock.close()

    def route(self, command: str, dst: str, family: int, src: str | None = None) -> list[_Message]:
        addr = ipaddress.ip_address(dst).packed
        source = ipaddress.ip_address(src).packed if src else b""
        body = RTMSG.pack(family, len(addr) * 8, len(source) * 8, 0, 0, 0, 0, 0, 0)
        body += struct.pack("=HH", 4 + len(addr), RTA_DST) + addr
        if source:  # `ip route get DST from SRC`: the policy rules that select by source
            body += struct.pack("=HH", 4 + len(source), RTA_SRC) + source
        replies = _ask(self.sock, RTM_GETROUTE, NLM_F_REQUEST, body)
        out = []
        for kind, payload in replies:
            if kind != RTM_NEWROUTE or len(payload) < RTMSG.size:
                continue
            rtm_type = RTMSG.unpack_from(payload)[7]
            attrs: dict[str, Any] = {}
            for a_kind, value in _attrs(payload, RTMSG.size):
                if a_kind == RTA_OIF and len(value) >= 4:
                    attrs["RTA_OIF"] = struct.unpack_from("=I", value)[0]
                elif a_kind == RTA_PREFSRC:
                    attrs["RTA_PREFSRC"] = _ip(value)
                elif a_kind == RTA_GATEWAY:
                    attrs["RTA_GATEWAY"] = _ip(value)
            out.append(_Message(rtm_type, attrs))
        return out

    def link(self, command: str, index: int) -> list[_Message]:
        return [_Message(0, {"IFLA_IFNAME": socket.if_indextoname(index)})]


def _ask(
    sock, kind: int, flags: int, body: bytes, limit: int | None = None
) -> list[tuple[int, bytes]]:
    """One request and its replies (a dump's until NLMSG_DONE): [(type, payload)]; an
    NLMSG_ERROR with a code raises KernelError(code); more than `limit` replies, Malformed."""
    seq = next(_SEQ)
    sock.send(struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body)
    deadline = time.monotonic() + TIMEOUT
    got: list[tuple[int, bytes]] = []
    while time.monotonic() < deadline:
        data, _, msg_flags, _ = sock.recvmsg(RECV_BUFFER)
        if msg_flags & socket.MSG_TRUNC:
            raise Malformed(f"a reply larger than {RECV_BUFFER} bytes")
        offset = 0
        while offset + 16 <= len(data):
            length, m_kind, _, m_seq, _ = struct.unpack_from("=IHHII", data, offset)
            if length < 16 or offset + length > len(data):
                raise Malformed(f"a message of {length} bytes")
            payload = data[offset + 16 : offset + length]
            offset += (length + 3) & ~3
            if m_seq != seq:
                continue
            if m_kind == NLMSG_ERROR:
                if len(payload) < 4:
                    raise Malformed("NLMSG_ERROR without an error code")
                code = -struct.unpack_from("=i", payload)[0]
                if code:
                    raise KernelError(code, os.strerror(code))
                return got
            if m_kind == NLMSG_DONE:
                return got
            got.append((m_kind, payload))
            if limit is not None and len(got) > limit:
                raise Malformed(f"more than {limit} messages")
            if not flags & NLM_F_DUMP:
                return got
    raise socket.timeout(f"no answer within {TIMEOUT:g} s")


def ipv4_addresses(open_socket: Callable[[], Any] = open_route_socket):
    """(netdev, address, prefix length) of every IPv4 address (RTM_GETADDR dump); OSError when
    the kernel cannot be asked."""
    sock = open_socket()
    try:
        sock.settimeout(TIMEOUT)
        body = _IFADDRMSG.pack(socket.AF_INET, 0, 0, 0, 0)
        out = []
        for kind, payload in _ask(sock, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, body):
            if kind != RTM_NEWADDR or len(payload) < _IFADDRMSG.size:
                continue
            _, prefix, _, _, index = _IFADDRMSG.unpack_from(payload)
            attrs = dict(_attrs(payload, _IFADDRMSG.size))
            raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
            address = _ip(raw) if raw else None
            label = attrs.get(IFA_LABEL, b"").split(b"\0")[0].decode(errors="replace")
            name = label.split(":")[0] or _index_name(index)
            if address and name:
                out.append((name, address, prefix))
        return out
    except Malformed as e:
        raise OSError(f"malformed RTM_GETADDR reply ({e})") from None
    finally:
        sock.close()


# -- the VLANs -----------------------------------------------------------------------------------
#
# An RTM_GETLINK dump (what `ip -d link` asks; any user may): one RTM_NEWLINK per netdev, struct
# ifinfomsg (include/uapi/linux/rtnetlink.h) then attributes, numbered as in
# include/uapi/linux/if_link.h (enum IFLA_*, IFLA_INFO_*, IFLA_VLAN_*). A VLAN's, as
# net/8021q/vlan_netlink.c (vlan_fill_info, vlan_link_ops) and net/core/rtnetlink.c
# (rtnl_fill_ifinfo, rtnl_link_fill) put them:
#
#     IFLA_IFNAME   (3)   string, NUL-terminated
#     IFLA_LINK     (5)   u32, the lower netdev's ifindex (rtnl_fill_link_ifindex)
#     IFLA_LINKINFO (18)  nested
#         IFLA_INFO_KIND (1)  "vlan" (vlan_link_ops.kind)
#         IFLA_INFO_DATA (2)  nested: IFLA_VLAN_ID (1) u16, IFLA_VLAN_FLAGS, IFLA_VLAN_PROTOCOL
#     IFLA_LINK_NETNSID (37)  s32, when the lower netdev is in another namespace (its ifindex is
#                             that namespace's)
#
# Without IFLA_EXT_MASK the kernel leaves out the VF list, so a message is ~1-2 KiB.

RTM_NEWLINK, RTM_GETLINK = 16, 18
IFLA_IFNAME, IFLA_LINK, IFLA_LINKINFO, IFLA_LINK_NETNSID = 3, 5, 18, 37
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_VLAN_ID = 1
_IFINFOMSG = struct.Struct("=BxHiII")  # family, pad, type, index, flags, change
MAX_LINKS = 16384  # netdevs one dump may list before it is refused (memory, not a kernel limit)


def _string(value: bytes) -> str:
    """An attribute's string up to its NUL; bytes that are not UTF-8 kept as surrogates (as
    read_attr keeps them), for the caller's name check to refuse."""
    return value.split(b"\0")[0].decode("utf-8", "surrogateescape")


def parse_vlan_links(replies: list[tuple[int, bytes]]) -> list[tuple[str, int, str | None]]:
    """(VLAN netdev, VLAN id, lower netdev) of every VLAN in an RTM_GETLINK dump's replies, the
    lower None when its ifindex is not in the dump (or in another namespace). Names and ids
    are as the kernel sent them, unchecked; Malformed for what breaks the uapi layout."""
    names: dict[int, str] = {}
    found: list[tuple[str, int, int | None]] = []
    for kind, payload in replies:
        if kind != RTM_NEWLINK:
            continue
        if len(payload) < _IFINFOMSG.size:
            raise Malformed("a link message shorter than struct ifinfomsg")
        index = _IFINFOMSG.unpack_from(payload)[2]
        attrs = dict(_attrs(payload, _IFINFOMSG.size))
        if IFLA_IFNAME not in attrs:
            raise Malformed(f"link {index} without IFLA_IFNAME")
        name = _string(attrs[IFLA_IFNAME])
        names[index] = name
        info = dict(_attrs(attrs.get(IFLA_LINKINFO, b"")))
        if _string(info.get(IFLA_INFO_KIND, b"")) != "vlan":
            continue
        vid = dict(_attrs(info.get(IFLA_INFO_DATA, b""))).get(IFLA_VLAN_ID)
        if vid is None or len(vid) < 2:
            raise Malformed(f"VLAN {name!r} without a u16 IFLA_VLAN_ID")
        link = attrs.get(IFLA_LINK)
        if link is not None and len(link) < 4:
            raise Malformed(f"VLAN {name!r} with an IFLA_LINK of {len(link)} bytes")
        lower = None if link is None else struct.unpack_from("=I", link)[0]
        if IFLA_LINK_NETNSID in attrs:
            lower = None  # another namespace's ifindex: not a name here
        found.append((name, struct.unpack_from("=H", vid)[0], lower))
    return [(name, vid, names.get(lower) if lower else None) for name, vid, lower in found]


def vlan_links(open_socket: Callable[[], Any] = open_route_socket):
    """(VLAN netdev, VLAN id, lower netdev or None) of every VLAN, from an RTM_GETLINK dump (no
    privilege needed); OSError when the kernel cannot be asked or answers malformed."""
    sock = open_socket()
    try:
        sock.settimeout(TIMEOUT)
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        flags = NLM_F_REQUEST | NLM_F_DUMP
        return parse_vlan_links(_ask(sock, RTM_GETLINK, flags, body, limit=MAX_LINKS))
    except Malformed as e:
        raise OSError(f"malformed RTM_GETLINK reply ({e})") from None
    finally:
        sock.close()


def _index_name(index: int) -> str | None:
    try:
        return socket.if_indextoname(index)
    except OSError:
        return None


def open_iproute():
    """What asks the kernel for a route: RouteSocket (the stand-in of pyroute2's IPRoute the
    tests give has the same two methods)."""
    return RouteSocket()


def read_route(
    destination: str,
    warn: Warn,
    open_ipr: Callable[[], Any] = open_iproute,
    source: str | None = None,
) -> Route | None:
    """The kernel's route to `destination` (RTM_GETROUTE), from `source` when given (a host
    that routes RoCE by source, with `ip rule from ADDRESS`, answers otherwise than for the
    destination alone); None when it cannot be asked (a socket error), after a warning.
    UsageError for what is not an address, or a source of another family."""
    try:
        address = ipaddress.ip_address(destination)
        origin = ipaddress.ip_address(source) if source else None
    except ValueError as e:
        raise UsageError(f"not an IP address: {e}") from e
    if origin is not None and origin.version != address.version:
        raise UsageError(f"route to {address} from {origin}: not one address family")
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    asked = {"dst": str(address), "family": family}
    if origin is not None:
        asked["src"] = str(origin)
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
            msgs = list(ipr.route("get", **asked))
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
            # asked from a source, the kernel's answer holds no preferred source: it is that
            src=msg.get_attr("RTA_PREFSRC") or asked.get("src"),
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

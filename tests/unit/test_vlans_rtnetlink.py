"""The VLANs over rtnetlink (an RTM_GETLINK dump), where /proc/net/vlan/config is root's alone:
the reply's parsing on the uapi byte layouts, hostile replies, and when it stands in for the file.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import struct
import subprocess
import sys

import pytest

from ibtool.host import Host
from ibtool.sources import rtnetlink
from ibtool.sources.sysfs import net
from ibtool.sources.sysfs.net import NetFiles
from tests.unit.route_socket import RouteSocket

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# -- the byte layouts (include/uapi/linux/netlink.h, rtnetlink.h, if_link.h) --------------------


def attr(kind: int, payload: bytes) -> bytes:
    """struct nlattr {u16 nla_len; u16 nla_type;} and the payload, padded to 4 bytes."""
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def nest(kind: int, *attrs: bytes) -> bytes:
    return attr(kind | 0x8000, b"".join(attrs))  # NLA_F_NESTED, as the kernel sets it


def ifinfomsg(index: int) -> bytes:
    # ifi_family, __ifi_pad, ifi_type (ARPHRD_ETHER), ifi_index, ifi_flags, ifi_change
    return struct.pack("=BBHiII", socket.AF_UNSPEC, 0, 1, index, 0x1043, 0)


def link(index: int, name: bytes, *attrs: bytes) -> bytes:
    """One RTM_NEWLINK payload (after the nlmsghdr): ifinfomsg, IFLA_IFNAME, the rest."""
    return ifinfomsg(index) + attr(3, name + b"\0") + b"".join(attrs)


def vlan(index: int, name: bytes, vid: int, lower: int, *extra: bytes) -> bytes:
    info = nest(
        18,  # IFLA_LINKINFO
        attr(1, b"vlan\0"),  # IFLA_INFO_KIND
        nest(2, attr(1, struct.pack("=H", vid)), attr(2, struct.pack("=II", 0, 0))),
    )
    mtu = attr(4, struct.pack("=I", 1500))  # IFLA_MTU: what the parser must step over
    return link(index, name, mtu, attr(5, struct.pack("=I", lower)), info, *extra)


def nlmsg(kind: int, seq: int, payload: bytes, flags: int = 0x2) -> bytes:  # NLM_F_MULTI
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 0) + payload


ETH = link(2, b"enp3s0f0", nest(18, attr(1, b"mlx5\0")))  # not a VLAN's kind
VETH = link(3, b"veth0", attr(5, struct.pack("=I", 2)), nest(18, attr(1, b"veth\0")))
LO = link(1, b"lo")
VLAN_1 = nest(18, attr(1, b"vlan\0"), nest(2, attr(1, b"\1\0")))  # IFLA_LINKINFO of VLAN 1


class DumpSocket(RouteSocket):
    """Answers the request with `batches` (each one recvmsg: a list of RTM_NEWLINK payloads),
    then NLMSG_DONE; or with `raw`, one read as it is."""

    def __init__(self, *batches: list[bytes], raw: bytes | None = None):
        super().__init__(self._reads)
        self.batches, self.raw = batches, raw

    def _reads(self, seq: int) -> list[bytes]:
        if self.raw is not None:
            return [self.raw]
        done = nlmsg(3, seq, struct.pack("=i", 0))  # NLMSG_DONE
        return [*(b"".join(nlmsg(16, seq, p) for p in b) for b in self.batches), done]


# -- the reply's parsing ------------------------------------------------------------------------


def test_a_dump_over_two_reads_gives_the_vlans_with_their_lower_netdev():
    sock = DumpSocket(
        [LO, ETH], [vlan(4, b"enp3s0f0.100", 100, 2), VETH, vlan(5, b"enp3s0f0.4095", 4095, 2)]
    )
    assert rtnetlink.vlan_links(lambda: sock) == [
        ("enp3s0f0.100", 100, "enp3s0f0"),
        ("enp3s0f0.4095", 4095, "enp3s0f0"),
    ]
    assert sock.closed
    # the request: RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, an empty struct ifinfomsg
    length, kind, flags = struct.unpack_from("=IHH", sock.requests[0])
    assert (length, kind, flags) == (32, 18, 0x301)
    assert sock.requests[0][16:] == bytes(16)


def test_a_vlan_listed_before_its_lower_netdev_still_finds_it():
    # a dump walks ifindex order, but a netdev moved in from another namespace keeps its index
    sock = DumpSocket([vlan(2, b"bond0.7", 7, 9), link(9, b"bond0")])
    assert rtnetlink.vlan_links(lambda: sock) == [("bond0.7", 7, "bond0")]


def test_a_lower_netdev_in_another_namespace_is_not_named_from_this_one():
    netnsid = attr(37, struct.pack("=i", 0))  # IFLA_LINK_NETNSID: index 2 is the other's
    sock = DumpSocket([LO, ETH, vlan(4, b"v100", 100, 2, netnsid)])
    assert rtnetlink.vlan_links(lambda: sock) == [("v100", 100, None)]


@pytest.mark.parametrize(
    "payload, problem",
    [
        (ifinfomsg(4)[:12], "shorter than struct ifinfomsg"),
        # IFLA_MTU claiming 12 bytes, 6 left in the message
        (ifinfomsg(4) + attr(3, b"x\0") + struct.pack("=HH", 12, 4) + b"\0\0", "12 bytes"),
        # IFLA_LINKINFO claiming 200 bytes in a message that holds far fewer
        (ifinfomsg(4) + attr(3, b"v\0") + struct.pack("=HH", 200, 18) + b"\0" * 8, "200 bytes"),
        # a nest whose inner attribute claims more than the nest
        (
            link(4, b"v", attr(18, struct.pack("=HH", 40, 1) + b"vlan")),
            "an attribute of 40 bytes",
        ),
        (ifinfomsg(4) + attr(4, struct.pack("=I", 1500)), "without IFLA_IFNAME"),
        (
            link(4, b"v", nest(18, attr(1, b"vlan\0"), nest(2, attr(2, bytes(8))))),
            "without a u16 IFLA_VLAN_ID",
        ),
        (
            link(4, b"v", attr(5, b"\1\0"), VLAN_1),
            "IFLA_LINK of 2 bytes",
        ),
    ],
    ids=["short ifinfomsg", "truncated attr", "nest past message", "inner past nest", "no name",
         "no vlan id", "short IFLA_LINK"],
)  # fmt: skip
def test_a_malformed_dump_is_an_oserror_saying_so(payload, problem):
    sock = DumpSocket([ETH, payload])
    with pytest.raises(OSError, match="malformed RTM_GETLINK reply") as e:
        rtnetlink.vlan_links(lambda: sock)
    assert problem in str(e.value)
    assert sock.closed


def test_a_message_longer_than_the_read_is_malformed():
    msg = nlmsg(16, 0, ETH)
    sock = DumpSocket(raw=struct.pack("=I", len(msg) + 64) + msg[4:])
    with pytest.raises(OSError, match="malformed RTM_GETLINK reply"):
        rtnetlink.vlan_links(lambda: sock)


def test_a_dump_past_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(rtnetlink, "MAX_LINKS", 3)
    sock = DumpSocket([link(i, b"d%d" % i) for i in range(1, 6)])
    with pytest.raises(OSError, match="more than 3 messages"):
        rtnetlink.vlan_links(lambda: sock)


class RefusingSocket(DumpSocket):
    """Answers the dump with NLMSG_ERROR EPERM."""

    def send(self, data: bytes) -> int:
        seq = struct.unpack_from("=I", data, 8)[0]
        self.queue = [nlmsg(2, seq, struct.pack("=i", -errno.EPERM) + data[:16])]
        return len(data)


def test_a_kernel_error_is_an_oserror_with_its_code():
    with pytest.raises(OSError) as e:
        rtnetlink.vlan_links(RefusingSocket)
    assert e.value.errno == errno.EPERM


# -- NetFiles: the checks on what the dump said, and when the dump is asked ---------------------

VLAN_CONFIG = (
    "VLAN Dev name\t | VLAN ID\nName-Type: VLAN_NAME_TYPE_RAW_PLUS_VID_NO_PAD\n"
    "enp3s0f0.100   | 100  | enp3s0f0\n"
)


def tree(tmp_path, config: str | None = VLAN_CONFIG):
    if config is not None:
        (tmp_path / "proc/net/vlan").mkdir(parents=True)
        (tmp_path / "proc/net/vlan/config").write_text(config)
    return str(tmp_path)


def denied(monkeypatch):
    """The VLANs file as the exporter's DynamicUser sees it: root's, mode 0600 (the tests run
    as root, who reads it whatever its mode)."""
    real = net.read_attr

    def read_attr(path, fs):
        if path.endswith("proc/net/vlan/config"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real(path, fs)

    monkeypatch.setattr(net, "read_attr", read_attr)


def files(root: str, live: bool, sock=None) -> tuple[NetFiles, list[str], list[int]]:
    warnings: list[str] = []
    opened: list[int] = []
    f = NetFiles(root, warnings.append)
    f.live_kernel = live

    def open_socket():
        opened.append(1)
        if sock is None:
            raise AssertionError("rtnetlink asked")
        return sock

    f.route_socket = open_socket
    return f, warnings, opened


def test_only_the_running_kernels_tree_is_live():
    assert NetFiles("/").live_kernel
    assert not NetFiles("/srv/sosreport").live_kernel
    assert not NetFiles("").live_kernel


def test_an_unreadable_file_on_the_live_host_is_read_over_rtnetlink_without_a_warning(
    tmp_path, monkeypatch
):
    denied(monkeypatch)
    sock = DumpSocket([LO, ETH, vlan(4, b"enp3s0f0.200", 200, 2)])
    f, warnings, opened = files(tree(tmp_path), live=True, sock=sock)
    assert f.vlans() == {"enp3s0f0.200": (200, "enp3s0f0")}
    assert warnings == [] and opened == [1] and sock.closed
    f.vlans()
    assert opened == [1]  # read once


def test_a_readable_file_is_used_and_rtnetlink_never_asked(tmp_path):
    f, warnings, opened = files(tree(tmp_path), live=True)
    assert f.vlans() == {"enp3s0f0.100": (100, "enp3s0f0")}
    assert warnings == [] and opened == []


def test_no_vlan_file_is_no_vlans_and_rtnetlink_never_asked(tmp_path):
    # no /proc/net/vlan/config: 8021q is not loaded, so there is no VLAN to ask for
    f, warnings, opened = files(tree(tmp_path, None), live=True)
    assert f.vlans() == {} and warnings == [] and opened == []


def test_an_unreadable_file_in_a_root_tree_is_warned_about_and_rtnetlink_never_asked(
    tmp_path, monkeypatch
):
    denied(monkeypatch)
    root = tree(tmp_path)
    f, warnings, opened = files(root, live=False)
    assert f.vlans() == {}
    assert opened == []
    assert warnings == [f"{root}/proc/net/vlan/config: cannot read: Permission denied"]


def test_a_root_tree_through_the_host_never_opens_a_socket(tmp_path, monkeypatch):
    denied(monkeypatch)

    def no(*args, **kwargs):
        raise AssertionError("the live kernel asked under --root")

    monkeypatch.setattr(rtnetlink, "vlan_links", no)
    monkeypatch.setattr(rtnetlink, "open_route_socket", no)
    warnings: list[str] = []
    root = tree(tmp_path)
    host = Host(root, warnings.append)
    assert not host.live
    assert host.vlans() == {}
    assert warnings == [f"{root}/proc/net/vlan/config: cannot read: Permission denied"]


def test_when_rtnetlink_fails_too_one_warning_says_both(tmp_path, monkeypatch):
    denied(monkeypatch)
    sock = DumpSocket([ETH, ifinfomsg(4)[:10]])
    root = tree(tmp_path)
    f, warnings, _ = files(root, live=True, sock=sock)
    assert f.vlans() == {}
    assert warnings == [
        f"{root}/proc/net/vlan/config: cannot read: Permission denied; nor ask rtnetlink "
        "(RTM_GETLINK): malformed RTM_GETLINK reply (a link message shorter than struct "
        "ifinfomsg)"
    ]


def test_a_socket_that_cannot_be_opened_is_one_warning(tmp_path, monkeypatch):
    denied(monkeypatch)
    root = tree(tmp_path)
    f, warnings, _ = files(root, live=True)

    def refuse():
        raise PermissionError(errno.EACCES, "Permission denied")

    f.route_socket = refuse
    assert f.vlans() == {}
    assert warnings == [
        f"{root}/proc/net/vlan/config: cannot read: Permission denied; nor ask rtnetlink "
        "(RTM_GETLINK): Permission denied"
    ]


@pytest.mark.parametrize(
    "bad, said",
    [
        (vlan(6, b"enp3s0f0.5000", 5000, 2), "VLAN 'enp3s0f0.5000' id 5000 over 'enp3s0f0'"),
        (vlan(6, b"evil\x1b[2J", 7, 2), "VLAN 'evil\\x1b[2J' id 7 over 'enp3s0f0'"),
        (vlan(6, b"v" * 16, 7, 2), "VLAN 'vvvvvvvvvvvvvvvv' id 7 over 'enp3s0f0'"),
        (vlan(6, b"bad\xff", 7, 2), "VLAN 'bad\\xff' id 7 over 'enp3s0f0'"),
        (vlan(6, b"v7", 7, 42), "VLAN 'v7' id 7 over an ifindex not in the dump"),
        (vlan(6, b"v7", 7, 0), "VLAN 'v7' id 7 over an ifindex not in the dump"),
    ],
    ids=["id over 4095", "control characters", "over IFNAMSIZ", "not utf-8", "unknown index",
         "no lower"],
)  # fmt: skip
def test_a_vlan_the_kernel_would_never_list_is_left_out_with_one_warning(
    tmp_path, monkeypatch, bad, said
):
    denied(monkeypatch)
    good = vlan(4, b"enp3s0f0.100", 100, 2)
    sock = DumpSocket([ETH, bad, good, vlan(7, b"x" * 20, 1, 2)])
    f, warnings, _ = files(tree(tmp_path), live=True, sock=sock)
    assert f.vlans() == {"enp3s0f0.100": (100, "enp3s0f0")}
    assert warnings == [f"rtnetlink RTM_GETLINK: malformed {said}"]  # the first one only


def test_a_name_that_is_not_utf8_in_the_file_is_a_malformed_line_not_a_traceback(tmp_path):
    root = tree(tmp_path, None)
    (tmp_path / "proc/net/vlan").mkdir(parents=True)
    (tmp_path / "proc/net/vlan/config").write_bytes(
        VLAN_CONFIG.encode() + b"bad\xff.7   | 7  | enp3s0f0\n"
    )
    f, warnings, opened = files(root, live=True)
    assert f.vlans() == {"enp3s0f0.100": (100, "enp3s0f0")}
    assert warnings == [
        f"{root}/proc/net/vlan/config: malformed line 'bad\\xff.7   | 7  | enp3s0f0'"
    ]
    assert opened == []


# -- the running kernel -------------------------------------------------------------------------


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def live_vlan():
    """ibtdummy0.77 (VLAN 77) over ibtdummy0, both deleted afterwards whatever happened; skipped
    where they cannot be made (not root, no ip, no dummy or 8021q module)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("creating links needs root and ip")
    try:
        made = _ip("link", "add", "ibtdummy0", "type", "dummy")
        if made.returncode != 0:
            pytest.skip(f"no dummy link here: {made.stderr.strip()}")
        made = _ip("link", "add", "link", "ibtdummy0", "name", "ibtdummy0.77", "type", "vlan",
                   "id", "77")  # fmt: skip
        if made.returncode != 0:
            pytest.skip(f"no VLAN link here: {made.stderr.strip()}")
        yield
    finally:
        _ip("link", "del", "ibtdummy0.77")
        _ip("link", "del", "ibtdummy0")


def test_the_running_kernels_vlan_over_rtnetlink(live_vlan):
    assert ("ibtdummy0.77", 77, "ibtdummy0") in rtnetlink.vlan_links()
    assert NetFiles("/").vlans()["ibtdummy0.77"] == (77, "ibtdummy0")


def test_the_running_kernels_vlan_as_an_unprivileged_user(live_vlan):
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv")
    code = (
        "import json\n"
        "from ibtool.sources.sysfs.net import NetFiles\n"
        "w = []\n"
        "v = NetFiles('/', w.append).vlans()\n"
        "print(json.dumps([v.get('ibtdummy0.77'), w]))\n"
    )
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=CHECKOUT,
        env={**os.environ, "PYTHONPATH": CHECKOUT},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == '[[77, "ibtdummy0"], []]'

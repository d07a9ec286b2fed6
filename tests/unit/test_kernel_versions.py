"""Every netlink command on the kernels ibtool runs on, 5.10 (Debian 11) to 7.x: on a kernel
without what a command needs, one line naming the netlink command or attribute (and the first
release with it) and exit status 6, everything else as on a newer kernel; `ibtool -d system`
lists what the kernel has, asked of it.

The stand-in kernels answer as drivers/infiniband/core/netlink.c and nldev.c do: a command
the kernel does not have is refused with EINVAL before anything else is looked at (some
report EOPNOTSUPP: both are tried), a CAP_NET_ADMIN command sent on a socket opened without
that capability gets EPERM, SYS_GET reports the settings the kernel has, RES_GET counts the
resource types it knows.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
from dataclasses import dataclass, field

import pytest

from ibtool.errors import ExitCode, IbtoolError
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import features, messages
from tests.fixtures import sysfs_trees
from tests.fixtures.netlink import (
    FakeKernel,
    ack,
    client_on,
    done,
    nla,
    reply,
    string,
    u8,
    u32,
    u64,
)
from tests.unit.fake_host import counters_cli

C = A  # the commands, by their uapi names

# RDMA_NL_ADMIN_PERM commands (nldev.c nldev_cb_table).
ADMIN = {
    C.RDMA_NLDEV_CMD_SET,
    C.RDMA_NLDEV_CMD_NEWLINK,
    C.RDMA_NLDEV_CMD_DELLINK,
    C.RDMA_NLDEV_CMD_SYS_SET,
    C.RDMA_NLDEV_CMD_STAT_SET,
    C.RDMA_NLDEV_CMD_STAT_DEL,
    C.RDMA_NLDEV_CMD_RES_QP_GET_RAW,
    C.RDMA_NLDEV_CMD_RES_CQ_GET_RAW,
    C.RDMA_NLDEV_CMD_RES_MR_GET_RAW,
    C.RDMA_NLDEV_CMD_RES_SRQ_GET_RAW,
    C.RDMA_NLDEV_CMD_NEWDEV,
    C.RDMA_NLDEV_CMD_DELDEV,
    C.RDMA_NLDEV_CMD_FRMR_POOLS_SET,
}
SYS = {
    "RDMA_NLDEV_SYS_ATTR_NETNS_MODE": (66, 1),
    "RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK": (93, 1),
    "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE": (96, 0),
    "RDMA_NLDEV_SYS_ATTR_MONITOR_MODE": (103, 1),
}
COUNTERS = ("rdma_sends", "rdma_recvs", "send_err")
RES_SUMMARY, RES_SUMMARY_ENTRY, SUMMARY_NAME, SUMMARY_CURR = 15, 16, 17, 18
HWCOUNTERS, HW_ENTRY, HW_NAME, HW_VALUE, HW_INDEX = 80, 81, 82, 83, 94


def _ops(last: int) -> frozenset[int]:
    # Every op below the kernel's RDMA_NLDEV_NUM_OPS has callbacks but 8 (free) and MONITOR.
    return frozenset(range(1, last + 1)) - {8, C.RDMA_NLDEV_CMD_MONITOR}


@dataclass(frozen=True)
class Release:
    name: str
    commands: frozenset[int]
    sys_attrs: tuple[str, ...]
    counted: tuple[str, ...]  # RES_GET's resource types (nldev.c fill_res_info)
    # STAT_GET of a port's QP counter mode answered (Debian 11's 5.10.223 answers an rxe port's
    # with EINVAL, though it has STAT_GET: measured in the testbed)
    qp_counter_mode: bool = True


LINUX_5_10 = Release(
    "5.10",
    _ops(C.RDMA_NLDEV_CMD_RES_MR_GET_RAW),
    ("RDMA_NLDEV_SYS_ATTR_NETNS_MODE",),
    ("pd", "cq", "qp", "cm_id", "mr", "ctx"),
    qp_counter_mode=False,
)
LINUX_6_12 = Release(
    "6.12",
    _ops(C.RDMA_NLDEV_CMD_DELDEV),
    tuple(SYS),
    ("pd", "cq", "qp", "cm_id", "mr", "ctx", "srq"),
)
LINUX_7_0 = Release(
    "7.0", _ops(C.RDMA_NLDEV_CMD_FRMR_POOLS_SET), LINUX_6_12.sys_attrs, LINUX_6_12.counted
)


@dataclass
class Device:
    name: str
    index: int
    ports: int = 1
    counters: bool = True  # driver (hw) counters on its ports


@dataclass
class Linux:
    """One release's NLDEV, with its devices; `sockets` made, `requests` (command, attrs,
    privileged) as they came."""

    release: Release
    devices: list[Device] = field(default_factory=lambda: [Device("rxe0", 0)])
    missing: int = errno.EINVAL
    requests: list[tuple[int, dict, bool]] = field(default_factory=list)

    def socket(self, privileged: bool = True) -> FakeKernel:
        return FakeKernel(lambda request, seq: self.answer(request, seq, privileged))

    def answer(self, request: bytes, seq: int, privileged: bool) -> list[bytes]:
        (msg,) = messages.parse(request)
        command = A.command_of(msg["header"]["type"])
        attrs = messages.attributes(msg)
        dump = msg["header"]["flags"] & A.NLM_F_DUMP == A.NLM_F_DUMP
        self.requests.append((command, attrs, privileged))
        if command not in self.release.commands:
            return [ack(request, self.missing)]
        if command in ADMIN:
            if not privileged:
                return [ack(request, errno.EPERM)]
            return self.admin(request, command, attrs)
        if command == C.RDMA_NLDEV_CMD_SYS_GET:
            values = [u8(*SYS[name]) for name in self.release.sys_attrs]
            return [reply(command, *values, seq=seq), ack(request)]
        if command == C.RDMA_NLDEV_CMD_GET and dump:
            parts = [
                reply(
                    command, *self.head(d), u32(3, d.ports), u8(14, 1), flags=A.NLM_F_MULTI, seq=seq
                )
                for d in self.devices
            ]
            return [*parts, done(seq)]
        if command == C.RDMA_NLDEV_CMD_RES_GET and dump:
            return [*(self.summary(d, seq) for d in self.devices), done(seq)]
        device = self.device(attrs)
        if device is None:
            return [ack(request, errno.EINVAL)]
        port = attrs.get("RDMA_NLDEV_ATTR_PORT_INDEX")
        if port is not None and not 1 <= port <= device.ports:
            return [ack(request, errno.EINVAL)]
        if command == C.RDMA_NLDEV_CMD_GET:
            body = (*self.head(device), u32(3, device.ports))
            return [reply(command, *body, seq=seq), ack(request)]
        if command == C.RDMA_NLDEV_CMD_PORT_GET and dump:
            parts = [
                reply(
                    command,
                    *self.head(device),
                    u32(3, p),
                    u8(12, 4),
                    u8(13, 5),
                    flags=A.NLM_F_MULTI,
                    seq=seq,
                )
                for p in range(1, device.ports + 1)
            ]
            return [*parts, done(seq)]
        if command in A.RESOURCE_COMMANDS.values():
            return self.resources(request, seq, command, attrs, device, dump)
        if command == C.RDMA_NLDEV_CMD_STAT_GET and "RDMA_NLDEV_ATTR_STAT_RES" in attrs:
            if not self.release.qp_counter_mode:
                return [ack(request, errno.EINVAL)]
            body = (*self.head(device), u32(3, port), u32(74, 0))  # STAT_MODE: none bound
            return [reply(command, *body, seq=seq), ack(request)]
        if command in (C.RDMA_NLDEV_CMD_STAT_GET, C.RDMA_NLDEV_CMD_STAT_GET_STATUS):
            if port is None or not device.counters:
                return [ack(request, errno.EINVAL)]
            status = command == C.RDMA_NLDEV_CMD_STAT_GET_STATUS
            entries = b"".join(
                nla(
                    HW_ENTRY,
                    string(HW_NAME, n) + (u32(HW_INDEX, i) if status else u64(HW_VALUE, 7)),
                    nested=True,
                )
                for i, n in enumerate(COUNTERS)
            )
            body = (*self.head(device), u32(3, port), nla(HWCOUNTERS, entries, nested=True))
            return [reply(command, *body, seq=seq), ack(request)]
        return [ack(request, errno.EINVAL)]

    def admin(self, request: bytes, command: int, attrs: dict) -> list[bytes]:
        if command == C.RDMA_NLDEV_CMD_SYS_SET:
            # strict parsing: an attribute beyond the kernel's RDMA_NLDEV_ATTR_MAX is refused
            if any(
                name.startswith("RDMA_NLDEV_SYS_ATTR_") and name not in self.release.sys_attrs
                for name in attrs
            ):
                return [ack(request, errno.EINVAL, extack="Unknown attribute type")]
            return [ack(request, 0 if attrs else errno.EINVAL)]
        return [ack(request, errno.EINVAL)]  # no attributes, or none that make sense

    def device(self, attrs: dict) -> Device | None:
        index = attrs.get("RDMA_NLDEV_ATTR_DEV_INDEX")
        return next((d for d in self.devices if d.index == index), None)

    @staticmethod
    def head(device: Device) -> tuple[bytes, bytes]:
        return u32(1, device.index), string(2, device.name)

    def summary(self, device: Device, seq: int) -> bytes:
        entries = b"".join(
            nla(RES_SUMMARY_ENTRY, string(SUMMARY_NAME, name) + u64(SUMMARY_CURR, 2))
            for name in self.release.counted
        )
        body = (*self.head(device), nla(RES_SUMMARY, entries))
        return reply(C.RDMA_NLDEV_CMD_RES_GET, *body, flags=A.NLM_F_MULTI, seq=seq)

    def resources(self, request, seq, command, attrs, device, dump) -> list[bytes]:
        kind = next(k for k, c in A.RESOURCE_COMMANDS.items() if c == command)
        if dump:  # none of this kind: the kernel cancels the part and ends the dump
            return [done(seq)]
        per_port = kind in ("qp", "cm_id")
        if A.RESOURCE_IDS[kind] not in attrs or per_port != ("RDMA_NLDEV_ATTR_PORT_INDEX" in attrs):
            return [ack(request, errno.EINVAL)]
        return [ack(request, errno.ENOENT)]  # rdma_restrack_get_byid: no such object


@pytest.fixture
def cli(on_host):
    """ibtool on the running host, its RDMA netlink the stand-in kernel's once one is given."""
    return on_host


@pytest.fixture
def linux(on_host, monkeypatch):
    """Install a stand-in kernel: its sockets serve the host's RDMA netlink; this process holds
    CAP_NET_ADMIN (as root) unless `privileged` is False, and then the socket opened for it
    by a child that dropped to nobody is refused the CAP_NET_ADMIN commands."""

    def install(release: Release, *, privileged: bool = True, **kw) -> Linux:
        kernel = Linux(release, **kw)
        on_host.seams["netlink"] = client_on(lambda: kernel.socket(privileged))
        monkeypatch.setattr(features, "has_cap_net_admin", lambda: privileged)
        monkeypatch.setattr(features, "unprivileged_socket", lambda: kernel.socket(False))
        return kernel

    return install


RELEASES = [LINUX_5_10, LINUX_6_12, LINUX_7_0]
BOTH = pytest.mark.parametrize(
    "missing", [errno.EINVAL, errno.EOPNOTSUPP], ids=["EINVAL", "EOPNOTSUPP"]
)


# -- ibtool -d system: what the kernel has ---------------------------------------------------------

# What 5.10 lacks of what ibtool asks about; everything else it has.
LACKS_5_10 = {
    "res-ctx-get",
    "res-srq-get",
    "stat-get-status",
    "res-srq-get-raw",
    "newdev",
    "deldev",
    "copy-on-fork",
    "privileged-qkey-mode",
    "monitor-mode",
}


def supported(result) -> dict[str, bool | None]:
    assert result.code == 0, result.err
    return {k: f["supported"] for k, f in result.json["features"].items()}


@BOTH
@pytest.mark.parametrize("privileged", [True, False], ids=["root", "user"])
def test_a_5_10_kernel_has_what_5_10_has_and_not_the_rest(cli, linux, missing, privileged):
    linux(LINUX_5_10, missing=missing, privileged=privileged)
    found = supported(cli("-j", "-d", "system"))
    assert {k for k, v in found.items() if v is False} == LACKS_5_10
    assert {k for k, v in found.items() if v is None} == set()


@pytest.mark.parametrize("release", [LINUX_6_12, LINUX_7_0], ids=lambda r: r.name)
def test_a_6_12_or_7_kernel_has_everything_ibtool_asks_about(cli, linux, release):
    linux(release)
    found = supported(cli("-j", "-d", "system"))
    assert [k for k, v in found.items() if v is not True] == []
    assert len(found) == len(features.COMMANDS) + len(features.SYS_ATTRIBUTES)


def test_the_features_in_text_one_row_each_after_the_settings(cli, linux):
    linux(LINUX_5_10)
    result = cli("-d", "system")
    assert result.code == 0 and result.err == ""
    settings, blank, header, *rows = result.out.splitlines()
    assert (settings, blank) == ("netns shared", "")
    assert header.split() == ["FEATURE", "SUPPORTED", "SINCE", "NOTE"]
    table = {r.split()[0]: r.split()[1:] for r in rows}
    assert table["RDMA_NLDEV_CMD_RES_CTX_GET"] == ["no", "5.13"]
    assert table["RDMA_NLDEV_CMD_STAT_GET_STATUS"] == ["no", "5.16"]
    assert table["RDMA_NLDEV_CMD_NEWLINK"] == ["yes", "5.1"]
    assert table["RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE"] == ["no", "6.7"]
    assert table["RDMA_NLDEV_SYS_ATTR_MONITOR_MODE"][:2] == ["no", "6.12"]
    assert len(rows) == len(features.COMMANDS) + len(features.SYS_ATTRIBUTES)


def test_the_features_in_json_keyed_as_the_uapi_names_lowercase_and_dashed(cli, linux):
    linux(LINUX_6_12)
    found = cli("-j", "-d", "system").json["features"]
    assert found["res-ctx-get"] == {
        "netlink": "RDMA_NLDEV_CMD_RES_CTX_GET",
        "supported": True,
        "since": "5.13",
        "note": None,
    }
    assert found["privileged-qkey-mode"]["netlink"] == "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE"
    assert {"get", "port-get", "stat-get-status", "res-qp-get-raw", "monitor-mode"} <= set(found)


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_without_details_system_asks_sys_get_only_and_prints_what_it_did(cli, linux, release):
    kernel = linux(release)
    text, js = cli("system"), cli("-j", "system")
    assert [c for c, _, _ in kernel.requests] == [C.RDMA_NLDEV_CMD_SYS_GET] * 2
    if release is LINUX_5_10:
        assert text.out == "netns shared\n"
        unreported = dict.fromkeys(("privileged-qkey", "monitor", "copy-on-fork"))
        assert js.json == {"netns": "shared", **unreported}
    else:
        assert text.out == "netns shared privileged-qkey off monitor on copy-on-fork on\n"
        assert js.json == {
            "netns": "shared",
            "privileged-qkey": False,
            "monitor": True,
            "copy-on-fork": True,
        }
    assert "features" not in js.json


def test_the_settings_line_and_keys_are_the_same_with_details(cli, linux):
    linux(LINUX_6_12)
    plain, detailed = cli("-j", "system").json, cli("-j", "-d", "system").json
    assert {k: v for k, v in detailed.items() if k != "features"} == plain
    assert cli("-d", "system").out.splitlines()[0] == cli("system").out.rstrip("\n")


def test_probes_ask_nothing_that_could_change_the_kernel(cli, linux):
    kernel = linux(LINUX_6_12)
    cli("-d", "system")
    admin = [(c, a, p) for c, a, p in kernel.requests if c in ADMIN]
    assert {c for c, _, _ in admin} == set(features.ADMIN_COMMANDS)
    # sent without attributes, and on the socket the kernel refuses them on
    assert all(a == {} and not p for _, a, p in admin)


def test_as_a_user_the_admin_commands_are_asked_on_the_one_socket(cli, linux, monkeypatch):
    kernel = linux(LINUX_5_10, privileged=False)
    monkeypatch.setattr(features, "unprivileged_socket", lambda: pytest.fail("not needed"))
    found = supported(cli("-j", "-d", "system"))
    assert found["newlink"] is True and found["newdev"] is False
    assert all(not p for _, _, p in kernel.requests)


def test_without_an_unprivileged_socket_the_admin_commands_are_unknown(cli, linux, monkeypatch):
    linux(LINUX_6_12)

    def refuse():
        raise IbtoolError("the unprivileged child could not drop to nobody or open a socket")

    monkeypatch.setattr(features, "unprivileged_socket", refuse)
    result = cli("-j", "-d", "system")
    found = result.json["features"]
    unknown = {k for k, f in found.items() if f["supported"] is None}
    assert unknown == {features.key(A.COMMANDS[c]) for c in features.ADMIN_COMMANDS}
    assert found["newlink"]["note"].startswith("not probed: no socket without CAP_NET_ADMIN")
    assert found["res-ctx-get"]["supported"] is True
    text = cli("-d", "system").out
    assert "RDMA_NLDEV_CMD_SYS_SET                    unknown    5.2    not probed: " in text


def test_without_a_device_the_per_device_commands_say_they_were_not_probed(cli, linux):
    linux(LINUX_5_10, devices=[])
    found = cli("-j", "-d", "system").json["features"]
    per_device = {features.key(A.COMMANDS[c]) for c in features.DEVICE_READS}
    assert {k for k, f in found.items() if f["supported"] is None} == per_device
    assert {found[k]["note"] for k in per_device} == {"not probed: no RDMA device to ask about"}
    assert found["res-get"]["supported"] is True and found["newdev"]["supported"] is False


def test_stat_get_status_is_asked_on_a_device_with_driver_counters(cli, linux):
    # siw has no driver counters: STAT_GET_STATUS answers EINVAL for it on every kernel
    devices = [Device("siw0", 0, counters=False), Device("rxe0", 1)]
    linux(LINUX_5_10, devices=devices)
    assert supported(cli("-j", "-d", "system"))["stat-get-status"] is False
    kernel = linux(LINUX_6_12, devices=devices)
    assert supported(cli("-j", "-d", "system"))["stat-get-status"] is True
    asked = [a for c, a, _ in kernel.requests if c == C.RDMA_NLDEV_CMD_STAT_GET_STATUS]
    assert [a["RDMA_NLDEV_ATTR_DEV_INDEX"] for a in asked] == [0, 1]


def test_stat_get_status_without_any_device_with_counters_is_unknown(cli, linux):
    linux(LINUX_6_12, devices=[Device("siw0", 0, counters=False)])
    found = cli("-j", "-d", "system").json["features"]["stat-get-status"]
    assert found["supported"] is None
    assert found["note"] == "not probed: no device with driver counters on its first port"


# -- each command on a kernel without what it needs ------------------------------------------------


def one_line_error(result, message: str) -> None:
    assert (result.code, result.out) == (ExitCode.UNSUPPORTED, "")
    assert result.err.startswith(f"ibtool: error: {message}")
    assert result.err.count("\n") == 1 and "Traceback" not in result.err


@BOTH
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("ctx", "RDMA_NLDEV_CMD_RES_CTX_GET (contexts are listed from Linux 5.13)"),
        ("srq", "RDMA_NLDEV_CMD_RES_SRQ_GET (SRQs are listed from Linux 5.13)"),
    ],
)
@pytest.mark.parametrize("json_", [False, True], ids=["text", "json"])
def test_res_objects_5_10_does_not_list(cli, linux, missing, kind, message, json_):
    linux(LINUX_5_10, missing=missing)
    result = cli(*(["-j"] if json_ else []), "res", kind)
    one_line_error(result, f"this kernel has no {message} (hint: ibtool -d system ")


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
@pytest.mark.parametrize("kind", ["qp", "cm_id", "cq", "mr", "pd"])
def test_res_objects_every_kernel_lists(cli, linux, release, kind):
    linux(release)
    result = cli("-j", "res", kind)
    assert (result.code, result.json, result.err) == (0, [], "")


@pytest.mark.parametrize("kind", ["ctx", "srq"])
def test_res_objects_of_5_13_on_6_12(cli, linux, kind):
    linux(LINUX_6_12)
    assert cli("res", kind).code == 0


def test_res_summary_on_5_10_srq_is_unknown_not_0_and_said_once(cli, linux):
    linux(LINUX_5_10, devices=[Device("rxe0", 0), Device("rxe1", 1)])
    warning = (
        "ibtool: warning: this kernel's RDMA_NLDEV_CMD_RES_GET does not count srq "
        "(SRQs are counted from Linux 5.13): shown as unknown"
    )
    text = cli("res")
    assert (text.code, text.warnings) == (0, [warning])
    assert [line.split() for line in text.out.splitlines()] == [
        ["DEV", "PD", "CQ", "QP", "CM_ID", "MR", "CTX", "SRQ"],
        ["rxe0", "2", "2", "2", "2", "2", "2", "unknown"],
        ["rxe1", "2", "2", "2", "2", "2", "2", "unknown"],
    ]
    js = cli("-j", "res", "rxe1")
    assert js.json == [
        {
            "ifindex": 1,
            "ifname": "rxe1",
            "pd": 2,
            "cq": 2,
            "qp": 2,
            "cm_id": 2,
            "mr": 2,
            "ctx": 2,
            "srq": None,
        }
    ]
    assert js.warnings == [warning]


def test_res_summary_on_6_12_counts_every_type_without_a_word(cli, linux):
    linux(LINUX_6_12)
    result = cli("-j", "res")
    assert (result.code, result.err) == (0, "")
    assert result.json[0]["srq"] == 2


@pytest.fixture
def live_mlx5(tmp_path, linux):
    """The mlx5 InfiniBand HCA tree read as the running kernel's (mlx5_0, two ports, index 7),
    with the stand-in kernel of a release behind netlink."""
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)

    def make(release: Release, **kw):
        from ibtool.host import Host
        from ibtool.sources.sysfs.infiniband import SysfsSource

        kernel = linux(release, devices=[Device("mlx5_0", 7, ports=2, **kw)])
        return Host(sysfs=SysfsSource(str(root)), netlink=client_on(kernel.socket)), kernel

    return make


STATUS_5_16 = (
    "this kernel has no RDMA_NLDEV_CMD_STAT_GET_STATUS "
    "(optional counters are listed from Linux 5.16)"
)


@pytest.mark.parametrize(
    "words",
    [("optional",), ("enable", "mlx5_0/1", "rdma_tx_bytes"), ("disable", "mlx5_0/2", "all")],
    ids=" ".join,
)
def test_optional_counters_on_5_10(live_mlx5, words):
    host, kernel = live_mlx5(LINUX_5_10)
    with pytest.raises(IbtoolError) as e:
        counters_cli(host, *words)
    assert (e.value.message, e.value.exit_code) == (STATUS_5_16, ExitCode.UNSUPPORTED)
    assert C.RDMA_NLDEV_CMD_STAT_SET not in [c for c, _, _ in kernel.requests]


def test_optional_counters_of_a_port_without_driver_counters_are_none(live_mlx5):
    host, _ = live_mlx5(LINUX_6_12, counters=False)
    out, warnings = counters_cli(host, "optional", "mlx5_0/1")
    assert warnings == ["no optional counters on mlx5_0/1"]


def test_optional_counters_on_6_12(live_mlx5):
    host, _ = live_mlx5(LINUX_6_12)
    out, warnings = counters_cli(host, "optional", "mlx5_0/1", json=True)
    assert (json.loads(out), warnings) == ([], ["no optional counters on mlx5_0/1"])


def test_system_set_privileged_qkey_on_5_10_as_root(cli, linux):
    kernel = linux(LINUX_5_10)
    result = cli("system", "set", "privileged-qkey", "on")
    one_line_error(
        result,
        "this kernel has no RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE "
        "(the privileged QKEY mode is settable from Linux 6.7)\n",
    )
    assert [c for c, _, _ in kernel.requests] == [
        C.RDMA_NLDEV_CMD_SYS_SET,
        C.RDMA_NLDEV_CMD_SYS_GET,
    ]


def test_system_set_privileged_qkey_on_6_12_is_one_request(cli, linux):
    kernel = linux(LINUX_6_12)
    assert cli("system", "set", "privileged-qkey", "on").code == 0
    assert [c for c, _, _ in kernel.requests] == [C.RDMA_NLDEV_CMD_SYS_SET]


def test_system_set_netns_on_5_10(cli, linux):
    linux(LINUX_5_10)
    assert cli("system", "set", "netns", "exclusive").code == 0


def test_system_set_on_5_10_without_cap_net_admin_says_so_first(cli, linux):
    linux(LINUX_5_10, privileged=False)
    result = cli("system", "set", "privileged-qkey", "on")
    assert result.code == ExitCode.PERMISSION
    assert "needs CAP_NET_ADMIN" in result.err


def test_monitor_on_5_10_polls_and_says_once_why(cli, linux):
    linux(LINUX_5_10)
    result = cli("monitor", "--interval", "0.01", "--timeout", "0.05")
    assert (result.code, result.out) == (0, "")
    assert result.err == (
        "ibtool: warning: monitor events are not supported by this kernel (needs 6.12); "
        "polling every 0.01 s\n"
    )


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.name)
def test_dev_and_port_details_merge_get_and_port_get_on_every_kernel(live_mlx5, release):
    host, kernel = live_mlx5(release)
    warnings: list[str] = []
    host.details, host.warn = True, warnings.append
    (device,) = host.devices()
    ports = host.ports()
    assert device.sources["port_count"] == "netlink"
    assert [(p.port, p.state.name, p.sources["state"]) for p in ports] == [
        (1, "ACTIVE", "netlink"),
        (2, "ACTIVE", "netlink"),
    ]
    assert [w for w in warnings if "netlink" in w] == []


# -- the socket the CAP_NET_ADMIN commands are asked on --------------------------------------------


def _rtnl_dellink_errno(sock: socket.socket) -> int:
    """RTM_DELLINK of an ifindex no netdev has: rtnetlink checks CAP_NET_ADMIN first (as
    netlink_net_capable, which looks at the socket's opener), then answers ENODEV."""
    ifinfomsg = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0x7FFFFFF0, 0, 0)
    sock.send(struct.pack("=IHHII", 16 + len(ifinfomsg), 17, 0x5, 1, 0) + ifinfomsg)
    return -struct.unpack_from("=i", sock.recv(4096), 16)[0]


def test_a_socket_opened_by_the_dropped_child_is_unprivileged_in_a_root_process(monkeypatch):
    if not features.has_cap_net_admin():
        pytest.skip("needs CAP_NET_ADMIN")
    # NETLINK_ROUTE plays NETLINK_RDMA: it judges CAP_NET_ADMIN the same way, and this
    # host has it.
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as ours:
        if _rtnl_dellink_errno(ours) != errno.ENODEV:
            pytest.skip("this process's own socket is refused too: no CAP_NET_ADMIN that counts")
    monkeypatch.setattr(features.A, "NETLINK_RDMA", 0)
    with features.unprivileged_socket() as theirs:
        assert (theirs.family, theirs.proto) == (socket.AF_NETLINK, 0)
        assert _rtnl_dellink_errno(theirs) == errno.EPERM


def test_the_dropped_child_failing_is_an_error_not_a_hang(monkeypatch):
    if not features.has_cap_net_admin():
        pytest.skip("needs CAP_NET_ADMIN")
    monkeypatch.setattr(features.A, "NETLINK_RDMA", 31)  # no such netlink family: socket() fails
    with pytest.raises(IbtoolError, match="could not drop to nobody or open a socket"):
        features.unprivileged_socket()

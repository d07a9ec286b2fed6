"""`ibtool system` and `ibtool system set`: the kernel's RDMA settings as the user sees them,
from a stand-in kernel, and on this host, whose kernel has no RDMA netlink at all."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys

import pytest

from ibtool.errors import ExitCode
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import client
from tests.fixtures.netlink import FakeKernel, ack, client_on, replay, replying, u8


@pytest.fixture
def cli(on_host):
    """ibtool on the running host, its RDMA netlink the stand-in kernel's once one is given."""
    return on_host


@pytest.fixture
def kernel(on_host):
    """Make the host's NETLINK_RDMA socket a FakeKernel answering with `answer`."""

    def install(answer):
        on_host.seams["netlink"] = client_on(lambda: FakeKernel(answer))

    return install


def test_debian_12s_kernel_in_text(cli, kernel):
    kernel(replay("sys_get.bin"))
    result = cli("system")
    assert (result.code, result.out, result.err) == (
        0,
        "netns shared privileged-qkey off copy-on-fork on\n",
        "",
    )


def test_debian_12s_kernel_in_json_with_rdmas_keys(cli, kernel):
    kernel(replay("sys_get.bin"))
    result = cli("-j", "system", "show")
    assert result.code == 0
    assert result.json == {
        "netns": "shared",
        "privileged-qkey": False,
        "monitor": None,
        "copy-on-fork": True,
    }


def test_a_kernel_reporting_every_setting(cli, kernel):
    # NETNS_MODE exclusive, PRIVILEGED_QKEY_MODE on, MONITOR_MODE, COPY_ON_FORK
    kernel(replying(A.RDMA_NLDEV_CMD_SYS_GET, (u8(66, 0), u8(96, 1), u8(103, 1), u8(93, 1))))
    assert cli("system").out == "netns exclusive privileged-qkey on monitor on copy-on-fork on\n"


def test_a_kernel_before_sys_get(cli, kernel):
    kernel(lambda request, seq: [ack(request, errno.EINVAL)])
    result = cli("system")
    assert result.code == ExitCode.UNSUPPORTED
    assert result.err.startswith(
        "ibtool: error: this kernel does not support RDMA_NLDEV_CMD_SYS_GET: Invalid argument"
    )


def test_no_rdma_netlink_is_one_line_and_unsupported(cli, monkeypatch):
    def no_rdma(*args):
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    monkeypatch.setattr(client.socket, "socket", no_rdma)
    result = cli("-j", "system")
    assert (result.code, result.out) == (ExitCode.UNSUPPORTED, "")
    assert result.err.startswith("ibtool: error: no RDMA netlink in this kernel (hint: ")
    assert result.err.count("\n") == 1


def test_on_this_host_without_rdma_netlink():
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, A.NETLINK_RDMA).close()
    except OSError as e:
        if e.errno != errno.EPROTONOSUPPORT:
            raise
    else:
        pytest.skip("this kernel has RDMA netlink")
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", "system"], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (ExitCode.UNSUPPORTED, "")
    assert proc.stderr.startswith("ibtool: error: no RDMA netlink in this kernel (hint: ")
    assert len(proc.stderr.splitlines()) == 1


def test_root_trees_have_no_netlink(empty_root):
    result = empty_root("system")
    assert result.code == ExitCode.USAGE
    assert "--root" in result.err


@pytest.mark.parametrize(
    "argv",
    [["show", "rxe0"], ["rxe0"], ["set", "netns"], ["set", "netns", "shared", "now"]],
    ids=" ".join,
)
def test_system_takes_show_or_set_name_value(cli, argv):
    result = cli("system", *argv)
    assert result.code == ExitCode.USAGE
    assert "(hint: ibtool system [show] | ibtool system set {" in result.err


@pytest.fixture
def recording_kernel(on_host):
    """A kernel that acks every request, and the requests it got."""
    kernels: list[FakeKernel] = []

    def open_socket():
        kernels.append(FakeKernel(lambda request, seq: [ack(request)]))
        return kernels[-1]

    on_host.seams["netlink"] = client_on(open_socket)
    return kernels


@pytest.mark.parametrize(
    ("argv", "attribute", "value"),
    [
        (["netns", "exclusive"], "RDMA_NLDEV_SYS_ATTR_NETNS_MODE", 0),
        (["netns", "shared"], "RDMA_NLDEV_SYS_ATTR_NETNS_MODE", 1),
        (["privileged-qkey", "on"], "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE", 1),
        (["privileged-qkey", "off"], "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE", 0),
    ],
)
def test_set_sends_one_sys_set_and_prints_nothing(cli, recording_kernel, argv, attribute, value):
    result = cli("system", "set", *argv)
    assert (result.code, result.out, result.err) == (0, "", "")
    ((request,),) = [k.requests for k in recording_kernel]
    assert (request["type"], request["flags"]) == (A.nlmsg_type(A.RDMA_NLDEV_CMD_SYS_SET), 0x5)
    assert request["attrs"] == {attribute: value}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["monitor", "on"], "no system setting 'monitor'"),
        (["netns", "private"], "netns is one of shared, exclusive, not 'private'"),
        (["privileged-qkey", "1"], "privileged-qkey is one of on, off, not '1'"),
    ],
)
def test_set_refuses_what_the_kernel_cannot_set(cli, recording_kernel, argv, message):
    result = cli("system", "set", *argv)
    assert result.code == ExitCode.USAGE
    assert result.err.startswith(f"ibtool: error: {message} (hint: ")
    assert recording_kernel == []  # nothing was sent


def test_set_without_cap_net_admin(cli, kernel):
    kernel(lambda request, seq: [ack(request, errno.EPERM)])
    result = cli("system", "set", "netns", "exclusive")
    assert result.code == ExitCode.PERMISSION
    assert result.err == (
        "ibtool: error: RDMA_NLDEV_CMD_SYS_SET needs CAP_NET_ADMIN (hint: the kernel asks for "
        "CAP_NET_ADMIN for changing the netns or privileged QKEY mode: run as root)\n"
    )


def test_set_netns_while_other_namespaces_exist(cli, kernel):
    kernel(lambda request, seq: [ack(request, errno.EBUSY)])
    result = cli("system", "set", "netns", "exclusive")
    assert result.code == ExitCode.FAILED
    assert "no network namespace but the initial one exists" in result.err


def test_set_a_setting_this_kernel_does_not_have(cli, kernel):
    kernel(lambda request, seq: [ack(request, errno.EINVAL, extack="Unknown attribute type")])
    result = cli("system", "set", "privileged-qkey", "on")
    assert result.code == ExitCode.UNSUPPORTED
    assert result.err.startswith(
        "ibtool: error: cannot set privileged-qkey: the kernel rejected RDMA_NLDEV_CMD_SYS_SET: "
        "Invalid argument (kernel: Unknown attribute type)"
    )


def test_set_needs_the_live_kernel(empty_root):
    assert empty_root("system", "set", "netns", "shared").code == ExitCode.USAGE


def test_json_is_valid_even_when_the_kernel_reports_nothing(cli, kernel):
    kernel(replying(A.RDMA_NLDEV_CMD_SYS_GET, ()))
    result = cli("-j", "system")
    assert json.loads(result.out) == dict.fromkeys(
        ("netns", "privileged-qkey", "monitor", "copy-on-fork")
    )

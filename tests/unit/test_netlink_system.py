"""`ibtool system`: the kernel's RDMA settings as the user sees them, from a stand-in kernel,
and on this host, whose kernel has no RDMA netlink at all."""

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
from tests.unit.test_netlink_client import FakeKernel, replying
from tests.unit.test_netlink_codec import ack, u8
from tests.unit.test_netlink_golden import replay


@pytest.fixture
def kernel(monkeypatch):
    """Make the next NETLINK_RDMA socket a FakeKernel answering with `answer`."""

    def install(answer):
        monkeypatch.setattr(client, "open_socket", lambda: FakeKernel(answer))

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


def test_system_takes_only_show(cli):
    result = cli("system", "set", "netns", "exclusive")
    assert result.code == ExitCode.USAGE
    assert result.err == (
        "ibtool: error: unexpected arguments: set netns exclusive (hint: ibtool system [show])\n"
    )


def test_json_is_valid_even_when_the_kernel_reports_nothing(cli, kernel):
    kernel(replying(A.RDMA_NLDEV_CMD_SYS_GET, ()))
    result = cli("-j", "system")
    assert json.loads(result.out) == dict.fromkeys(
        ("netns", "privileged-qkey", "monitor", "copy-on-fork")
    )

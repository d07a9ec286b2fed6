"""`ibtool link add` and `ibtool link delete` against a stand-in kernel that knows the testbed's
rxe0 (on veth0) and rxe1 (on veth1), as the captured GET and PORT_GET replies show them: what
is sent, and what each of the kernel's refusals becomes."""

from __future__ import annotations

import errno
import struct

import pytest

from ibtool.errors import ExitCode
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import client
from ibtool.sources.netlink import features as netlink_features
from tests.fixtures.netlink import FakeKernel, ack, replay


def command_of(request: bytes) -> int:
    return A.command_of(struct.unpack_from("=H", request, 4)[0])


@pytest.fixture
def kernel(monkeypatch):
    """The testbed's kernel: GET and PORT_GET dumps from the captures, and `link` as the
    answer (an errno, 0 for success) to NEWLINK and DELLINK. `kernel.requests` lists
    (command, attributes) of every request, over every socket opened."""

    class Kernel:
        link = 0
        requests: list[tuple[int, dict]] = []

    def answer(request, seq):
        command = command_of(request)
        if command == A.RDMA_NLDEV_CMD_GET:
            return replay("get_dump.bin")(request, seq)
        if command == A.RDMA_NLDEV_CMD_PORT_GET:
            index = struct.unpack_from("=I", request, 20)[0]
            return replay(f"port_get_dump_rxe{index}.bin")(request, seq)
        return [ack(request, Kernel.link)]

    def open_socket():
        fake = FakeKernel(answer)
        original = fake.send

        def send(data):
            n = original(data)
            r = fake.requests[-1]
            Kernel.requests.append((A.command_of(r["type"]), r["attrs"]))
            return n

        fake.send = send
        return fake

    monkeypatch.setattr(client, "open_socket", open_socket)
    Kernel.requests = []
    return Kernel


def changes(kernel) -> list[tuple[int, dict]]:
    return [
        r for r in kernel.requests if r[0] in (A.RDMA_NLDEV_CMD_NEWLINK, A.RDMA_NLDEV_CMD_DELLINK)
    ]


def test_add_sends_newlink_and_prints_nothing(cli, kernel):
    result = cli("link", "add", "rxe9", "type", "rxe", "netdev", "veth2")
    assert (result.code, result.out, result.err) == (0, "", "")
    assert changes(kernel) == [
        (
            A.RDMA_NLDEV_CMD_NEWLINK,
            {
                "RDMA_NLDEV_ATTR_DEV_NAME": "rxe9",
                "RDMA_NLDEV_ATTR_LINK_TYPE": "rxe",
                "RDMA_NLDEV_ATTR_NDEV_NAME": "veth2",
            },
        )
    ]


def test_add_takes_its_keywords_in_any_order(cli, kernel):
    assert cli("link", "add", "siw0", "netdev", "eth0", "type", "siw").code == 0
    assert changes(kernel)[0][1]["RDMA_NLDEV_ATTR_LINK_TYPE"] == "siw"


def test_delete_sends_dellink_with_the_devices_index(cli, kernel):
    result = cli("link", "delete", "rxe1")
    assert (result.code, result.out, result.err) == (0, "", "")
    assert changes(kernel) == [(A.RDMA_NLDEV_CMD_DELLINK, {"RDMA_NLDEV_ATTR_DEV_INDEX": 1})]


def test_a_name_taken_is_refused_before_asking_the_kernel(cli, kernel):
    result = cli("link", "add", "rxe0", "type", "rxe", "netdev", "veth2")
    assert result.code == ExitCode.FAILED
    assert result.err.startswith("ibtool: error: an RDMA device named rxe0 exists already")
    assert changes(kernel) == []


def test_a_name_taken_meanwhile_is_the_kernels_enfile(cli, kernel):
    # ib_register_device answers ENFILE ("Too many open files in system", as rdma prints it)
    # for a name in use: measured on 6.1.
    kernel.link = errno.ENFILE
    result = cli("link", "add", "rxe9", "type", "rxe", "netdev", "veth2")
    assert result.code == ExitCode.FAILED
    assert result.err == (
        "ibtool: error: an RDMA device named rxe9 exists already (hint: choose another name)\n"
    )


def test_a_netdev_with_an_rxe_device_already_names_that_device(cli, kernel):
    kernel.link = errno.EEXIST  # rxe_newlink: one rxe device per netdev
    result = cli("link", "add", "rxe9", "type", "rxe", "netdev", "veth1")
    assert result.code == ExitCode.FAILED
    assert result.err == (
        "ibtool: error: veth1 has an rxe device already (rxe1) (hint: the rxe driver takes one "
        "device per netdev: delete it first (ibtool link delete rxe1) or use another netdev)\n"
    )


def test_an_unknown_netdev_is_not_found_and_the_hint_lists_the_netdevs(cli, kernel):
    kernel.link = errno.ENODEV
    result = cli("link", "add", "rxe9", "type", "rxe", "netdev", "nosuch0")
    assert result.code == ExitCode.NOT_FOUND
    assert result.err.startswith("ibtool: error: no netdev 'nosuch0' (hint: netdevs here: ")
    assert "lo" in result.err


def test_a_type_whose_module_is_missing_is_unsupported(on_host, kernel):
    on_host.seams["release"] = "6.1.0-28-amd64"  # the Host's seam for uname's release
    cli = on_host
    kernel.link = errno.EINVAL
    result = cli("link", "add", "siw0", "type", "siw", "netdev", "veth0")
    assert result.code == ExitCode.UNSUPPORTED
    assert result.err.startswith(
        "ibtool: error: link type 'siw' is not available in this kernel (hint: the kernel found "
        "no driver for it: modprobe siw says why"
    )


def test_a_kernel_before_5_1_says_so(on_host, kernel):
    on_host.seams["release"] = "4.19.0-27-amd64"  # the Host's seam for uname's release
    cli = on_host
    kernel.link = errno.EINVAL
    result = cli("link", "add", "rxe9", "type", "rxe", "netdev", "veth2")
    assert result.code == ExitCode.UNSUPPORTED
    assert result.err.startswith(
        "ibtool: error: this kernel (4.19.0-27-amd64) cannot create RDMA links "
        "(RDMA_NLDEV_CMD_NEWLINK): that needs Linux 5.1 or later"
    )
    assert cli("link", "delete", "rxe1").err.startswith(
        "ibtool: error: this kernel (4.19.0-27-amd64) cannot delete RDMA links"
    )


def test_without_cap_net_admin(cli, kernel, monkeypatch):
    monkeypatch.setattr(netlink_features, "has_cap_net_admin", lambda: False)
    kernel.link = errno.EPERM
    for argv in (["add", "rxe9", "type", "rxe", "netdev", "veth2"], ["delete", "rxe1"]):
        result = cli("link", *argv)
        assert result.code == ExitCode.PERMISSION
        assert "needs CAP_NET_ADMIN" in result.err and "run as root" in result.err


def test_rxe_refusing_a_vlan_device_is_not_called_a_missing_capability(cli, kernel, monkeypatch):
    monkeypatch.setattr(netlink_features, "has_cap_net_admin", lambda: True)
    kernel.link = errno.EPERM
    result = cli("link", "add", "rxe9", "type", "rxe", "netdev", "veth0.100")
    assert result.code == ExitCode.FAILED
    assert result.err.startswith("ibtool: error: the rxe driver refused veth0.100: ")
    assert "not on a VLAN device" in result.err


def test_deleting_a_hardware_device_says_only_rxe_and_siw_can_be(on_host, kernel):
    on_host.seams["release"] = "6.1.0-28-amd64"  # the Host's seam for uname's release
    cli = on_host
    kernel.link = errno.EINVAL  # nldev_dellink: no IBK_ALLOW_USER_UNREG (mlx5, ...)
    result = cli("link", "delete", "rxe0")
    assert result.code == ExitCode.FAILED
    assert result.err.startswith(
        "ibtool: error: cannot delete rxe0: only rxe and siw devices can be deleted (hint: "
    )


def test_deleting_an_unknown_device_lists_those_there_are(cli, kernel):
    result = cli("link", "delete", "rxe7")
    assert result.code == ExitCode.NOT_FOUND
    assert result.err == ("ibtool: error: unknown device 'rxe7' (hint: devices here: rxe0, rxe1)\n")
    assert changes(kernel) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["add"],
        ["add", "rxe9"],
        ["add", "rxe9", "type", "rxe"],
        ["add", "rxe9", "netdev", "veth0"],
        ["add", "rxe9", "type", "rxe", "netdev"],
        ["add", "rxe9", "type", "rxe", "netdev", "veth0", "mtu", "1500"],
        ["add", "rxe9", "type", "rxe", "type", "siw", "netdev", "veth0"],
        ["add", "rxe%d", "type", "rxe", "netdev", "veth0"],
        ["add", "a/b", "type", "rxe", "netdev", "veth0"],
        ["add", "x" * 64, "type", "rxe", "netdev", "veth0"],
        ["delete"],
        ["delete", "rxe0", "rxe1"],
    ],
    ids=" ".join,
)
def test_bad_command_lines_send_nothing(cli, kernel, argv):
    result = cli("link", *argv)
    assert result.code == ExitCode.USAGE
    assert result.err.count("\n") == 1
    assert changes(kernel) == []


def test_show_still_shows_ports(captured_rxe):
    assert captured_rxe("link", "show").out.startswith("rxe0/1: state ACTIVE")
    assert captured_rxe("link").out == captured_rxe("port").out


def test_a_root_tree_cannot_be_changed(captured_rxe):
    result = captured_rxe("link", "delete", "rxe0")
    assert result.code == ExitCode.USAGE
    assert "--root" in result.err


def test_no_rdma_netlink_is_one_line_and_unsupported(cli, monkeypatch):
    def no_rdma(*args):
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    monkeypatch.setattr(client.socket, "socket", no_rdma)
    result = cli("link", "add", "rxe9", "type", "rxe", "netdev", "veth0")
    assert result.code == ExitCode.UNSUPPORTED
    assert result.err.startswith("ibtool: error: no RDMA netlink in this kernel (hint: ")

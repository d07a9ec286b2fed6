"""The NLDEV clients against a stand-in kernel: what they send, how they gather replies, what
the kernel's errors become, and that the asyncio client works inside a running event loop.

FakeKernel answers each request on one end of a datagram socketpair, as the kernel answers on a
NETLINK_RDMA socket: datagram by datagram, with the request's sequence number.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct

import pytest

from ibtool.errors import DataError, ExitCode, IbtoolError
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import client, messages
from ibtool.sources.netlink.client import AsyncNldevClient, NldevClient
from tests.fixtures.netlink import (
    DEV_INDEX,
    DEV_NAME,
    FakeKernel,
    ack,
    done,
    dumping,
    failing,
    reply,
    replying,
    string,
    u8,
    u32,
)

SYS_REPLY = (u8(66, 1), u8(96, 0), u8(93, 1))  # NETNS_MODE, PRIVILEGED_QKEY_MODE, COPY_ON_FORK


def nldev(answer, **kw) -> tuple[NldevClient, FakeKernel]:
    kernel = FakeKernel(answer)
    return NldevClient(sock=kernel, **kw), kernel


# -- requests and replies ----------------------------------------------------------------------


def test_a_single_object_request_asks_for_an_ack_and_returns_the_reply():
    nl, kernel = nldev(replying(A.RDMA_NLDEV_CMD_SYS_GET, SYS_REPLY))
    assert nl.system() == {
        "RDMA_NLDEV_SYS_ATTR_NETNS_MODE": 1,
        "RDMA_NLDEV_SYS_ATTR_PRIVILEGED_QKEY_MODE": 0,
        "RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK": 1,
    }
    (request,) = kernel.requests
    assert (request["type"], request["flags"], request["attrs"]) == (5126, 0x5, {})


def test_a_port_reply_typed_get_answers_a_port_get():
    # The kernel sends the PORT_GET doit reply with the GET message type.
    attrs = (u32(DEV_INDEX, 2), u32(3, 1), u8(12, 4))
    nl, kernel = nldev(replying(A.RDMA_NLDEV_CMD_PORT_GET, attrs, typed=A.RDMA_NLDEV_CMD_GET))
    assert nl.port(2, 1) == {
        "RDMA_NLDEV_ATTR_DEV_INDEX": 2,
        "RDMA_NLDEV_ATTR_PORT_INDEX": 1,
        "RDMA_NLDEV_ATTR_PORT_STATE": 4,
    }
    assert kernel.requests[0]["attrs"] == {
        "RDMA_NLDEV_ATTR_DEV_INDEX": 2,
        "RDMA_NLDEV_ATTR_PORT_INDEX": 1,
    }


def test_a_dump_gathers_every_part_until_done():
    first = [(u32(DEV_INDEX, 0), string(DEV_NAME, "mlx5_0")), (u32(DEV_INDEX, 1),)]
    second = [(u32(DEV_INDEX, 2), string(DEV_NAME, "mlx5_2"))]
    nl, kernel = nldev(dumping(A.RDMA_NLDEV_CMD_GET, first, second))
    assert [d["RDMA_NLDEV_ATTR_DEV_INDEX"] for d in nl.devices()] == [0, 1, 2]
    assert kernel.requests[0]["flags"] == A.NLM_F_REQUEST | A.NLM_F_DUMP


def test_a_dump_and_its_done_in_one_datagram():
    def answer(request, seq):
        part = reply(A.RDMA_NLDEV_CMD_RES_GET, u32(DEV_INDEX, 0), flags=A.NLM_F_MULTI, seq=seq)
        return [part + done(seq)]

    nl, _ = nldev(answer)
    assert nl.resource_summaries() == [{"RDMA_NLDEV_ATTR_DEV_INDEX": 0}]


def test_replies_to_an_abandoned_request_are_skipped():
    def answer(request, seq):
        stale_reply = reply(A.RDMA_NLDEV_CMD_SYS_GET, u8(66, 0), seq=seq - 1)
        stale_ack = struct.pack("=IHHIIi", 36, A.NLMSG_ERROR, A.NLM_F_CAPPED, seq - 1, 0, 0)
        fresh = replying(A.RDMA_NLDEV_CMD_SYS_GET, SYS_REPLY)(request, seq)
        return [stale_reply, stale_ack + request[:16], *fresh]

    nl, _ = nldev(answer)
    assert nl.system()["RDMA_NLDEV_SYS_ATTR_NETNS_MODE"] == 1


def test_one_reply_expected_none_received_is_a_data_error():
    nl, _ = nldev(lambda request, seq: [ack(request)])
    with pytest.raises(DataError, match="0 replies to RDMA_NLDEV_CMD_SYS_GET"):
        nl.system()


def test_requests_on_one_client_use_fresh_sequence_numbers():
    nl, kernel = nldev(replying(A.RDMA_NLDEV_CMD_SYS_GET, SYS_REPLY))
    nl.system()
    nl.system()
    first, second = (r["sequence_number"] for r in kernel.requests)
    assert second == first + 1


# -- the kernel's errors -----------------------------------------------------------------------


def test_eperm_names_cap_net_admin_and_what_it_is_for():
    nl, _ = nldev(failing(errno.EPERM))
    with pytest.raises(IbtoolError) as e:
        nl.request(A.RDMA_NLDEV_CMD_SYS_SET, {"RDMA_NLDEV_SYS_ATTR_NETNS_MODE": 0})
    assert e.value.exit_code == ExitCode.PERMISSION
    assert e.value.message == "RDMA_NLDEV_CMD_SYS_SET needs CAP_NET_ADMIN"
    assert "netns or privileged QKEY mode" in e.value.hint


@pytest.mark.parametrize("capped", [True, False], ids=["capped", "whole-request"])
def test_the_kernels_extended_ack_message_is_quoted(capped):
    nl, _ = nldev(failing(errno.EINVAL, extack="Unknown attribute type", capped=capped))
    with pytest.raises(IbtoolError) as e:
        nl.request(A.RDMA_NLDEV_CMD_SYS_SET, {"RDMA_NLDEV_SYS_ATTR_MONITOR_MODE": 1})
    assert e.value.message == (
        "the kernel rejected RDMA_NLDEV_CMD_SYS_SET: Invalid argument "
        "(kernel: Unknown attribute type)"
    )
    assert e.value.exit_code == ExitCode.UNSUPPORTED


def test_einval_to_a_request_without_attributes_means_the_command_is_missing():
    nl, _ = nldev(failing(errno.EINVAL))
    with pytest.raises(IbtoolError) as e:
        nl.system()
    assert e.value.exit_code == ExitCode.UNSUPPORTED
    assert e.value.message == (
        "this kernel does not support RDMA_NLDEV_CMD_SYS_GET: Invalid argument"
    )
    assert "Linux 5.2" in e.value.hint


def test_eopnotsupp_names_the_missing_feature():
    nl, _ = nldev(failing(errno.EOPNOTSUPP))
    with pytest.raises(IbtoolError) as e:
        nl.hw_counters(0, 1)
    assert e.value.exit_code == ExitCode.UNSUPPORTED
    assert e.value.message.startswith("this kernel does not support RDMA_NLDEV_CMD_STAT_GET")


def test_a_dump_that_fails_reports_the_error_its_done_carries():
    nl, _ = nldev(lambda request, seq: [done(seq, errno.EINVAL)])
    with pytest.raises(IbtoolError, match="rejected RDMA_NLDEV_CMD_PORT_GET") as e:
        nl.ports(9)
    assert e.value.errno == errno.EINVAL


def test_another_errno_is_a_plain_failure_with_its_errno():
    nl, _ = nldev(failing(errno.ENOMEM))
    with pytest.raises(IbtoolError) as e:
        nl.devices()
    assert (type(e.value), e.value.exit_code, e.value.errno) == (
        IbtoolError,
        ExitCode.FAILED,
        errno.ENOMEM,
    )
    assert e.value.message == "RDMA_NLDEV_CMD_GET failed: Cannot allocate memory"


def test_a_kernel_that_does_not_answer_is_an_error_not_a_hang():
    nl, _ = nldev(lambda request, seq: [], timeout=0.05)
    with pytest.raises(IbtoolError, match="did not answer RDMA_NLDEV_CMD_SYS_GET within 0.05 s"):
        nl.system()


# -- the socket --------------------------------------------------------------------------------


def refuse_socket(monkeypatch, code: int):
    def socket_(*args):
        assert args == (socket.AF_NETLINK, socket.SOCK_RAW, A.NETLINK_RDMA)
        raise OSError(code, "refused")

    monkeypatch.setattr(client.socket, "socket", socket_)


def test_no_rdma_netlink_in_the_kernel_is_unsupported_with_a_hint(monkeypatch):
    refuse_socket(monkeypatch, errno.EPROTONOSUPPORT)
    with pytest.raises(IbtoolError) as e:
        NldevClient()
    assert (e.value.message, e.value.exit_code) == (
        "no RDMA netlink in this kernel",
        ExitCode.UNSUPPORTED,
    )
    assert "ib_core" in e.value.hint


def test_a_forbidden_socket_is_a_permission_error(monkeypatch):
    refuse_socket(monkeypatch, errno.EACCES)
    with pytest.raises(IbtoolError) as e:
        AsyncNldevClient()
    assert e.value.exit_code == ExitCode.PERMISSION


def test_this_hosts_kernel_without_rdma_netlink():
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, A.NETLINK_RDMA).close()
    except OSError as e:
        if e.errno != errno.EPROTONOSUPPORT:
            raise
    else:
        pytest.skip("this kernel has RDMA netlink")
    with pytest.raises(IbtoolError, match="^no RDMA netlink in this kernel$"):
        NldevClient()


# -- asyncio -----------------------------------------------------------------------------------


def test_the_async_client_waits_for_the_kernel_inside_a_running_loop():
    kernel = FakeKernel(replying(A.RDMA_NLDEV_CMD_SYS_GET, SYS_REPLY), later=True)

    async def main():
        async with AsyncNldevClient(sock=kernel) as nl:
            return await nl.system()

    assert asyncio.run(main())["RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK"] == 1


def test_concurrent_async_requests_on_one_client_take_turns():
    def answer(request, seq):
        (msg,) = messages.parse(request)
        command = A.command_of(msg["header"]["type"])
        if command == A.RDMA_NLDEV_CMD_GET:
            return dumping(command, [(u32(DEV_INDEX, 0),)], [(u32(DEV_INDEX, 1),)])(request, seq)
        return replying(command, SYS_REPLY)(request, seq)

    kernel = FakeKernel(answer, later=True)

    async def main():
        async with AsyncNldevClient(sock=kernel) as nl:
            return await asyncio.gather(nl.devices(), nl.system(), nl.devices())

    devices, system, again = asyncio.run(main())
    assert devices == again == [{"RDMA_NLDEV_ATTR_DEV_INDEX": i} for i in (0, 1)]
    assert system["RDMA_NLDEV_SYS_ATTR_NETNS_MODE"] == 1


def test_async_errors_are_the_same_ibtool_errors():
    kernel = FakeKernel(failing(errno.EPERM), later=True)

    async def main():
        async with AsyncNldevClient(sock=kernel) as nl:
            await nl.request(A.RDMA_NLDEV_CMD_RES_QP_GET_RAW, {"RDMA_NLDEV_ATTR_DEV_INDEX": 0})

    with pytest.raises(IbtoolError, match="RES_QP_GET_RAW needs CAP_NET_ADMIN") as e:
        asyncio.run(main())
    assert "raw driver resource dumps" in e.value.hint


def test_the_async_client_times_out():
    kernel = FakeKernel(lambda request, seq: [], later=True)

    async def main():
        async with AsyncNldevClient(sock=kernel, timeout=0.05) as nl:
            await nl.system()

    with pytest.raises(IbtoolError, match="did not answer RDMA_NLDEV_CMD_SYS_GET"):
        asyncio.run(main())


def test_the_blocking_client_also_works_from_inside_a_running_loop():
    # pyroute2's synchronous sockets run their own loop and fail here.
    nl, _ = nldev(replying(A.RDMA_NLDEV_CMD_SYS_GET, SYS_REPLY))

    async def main():
        return nl.system()

    assert asyncio.run(main())["RDMA_NLDEV_SYS_ATTR_NETNS_MODE"] == 1

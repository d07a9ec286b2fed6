"""`ibtool res`: resource dumps captured from a real kernel (tests/fixtures/captured/resources:
Debian 12's 6.1 kernel while res_holder.py and an rping server held objects on rxe0) decode to
what `rdma -j res show` printed at the same moment; filters, selectors and errors from a
stand-in kernel."""

from __future__ import annotations

import errno
import json

import pytest

from ibtool.errors import ExitCode
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import messages, records
from tests.fixtures.captured_kernel import COMM, NAMES, NETLINK, RESOURCES, renumbered
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

HOLDER = next(pid for pid, name in COMM.items() if name == "python3")


def rdma_says(kind: str) -> list[dict]:
    return json.loads((RESOURCES / f"rdma_res_show_{kind}.json").read_text())


def captured_kernel(overrides=None):
    """Answers GET and RES_GET dumps, GET doits and every RES_*_GET dump from the captures;
    `overrides` maps (command, device index) to an answer(request, seq) of its own."""
    overrides = overrides or {}
    commands = {v: k for k, v in A.RESOURCE_COMMANDS.items()}

    def answer(request, seq):
        (msg,) = messages.parse(request)
        command = A.command_of(msg["header"]["type"])
        attrs = messages.attributes(msg)
        index = attrs.get("RDMA_NLDEV_ATTR_DEV_INDEX")
        if (command, index) in overrides:
            return overrides[(command, index)](request, seq)
        if command == A.RDMA_NLDEV_CMD_GET and index is None:
            return [renumbered((NETLINK / "get_dump.bin").read_bytes(), seq)]
        if command == A.RDMA_NLDEV_CMD_GET:
            data = (NETLINK / f"get_{NAMES[index]}.bin").read_bytes()
            return [renumbered(data, seq), ack(request)]
        if command == A.RDMA_NLDEV_CMD_RES_GET:
            return [renumbered((NETLINK / "res_get_dump.bin").read_bytes(), seq)]
        name = A.COMMANDS[command].removeprefix("RDMA_NLDEV_CMD_").lower()
        assert command in commands, name
        data = (RESOURCES / f"{name}_dump_{NAMES[index]}.bin").read_bytes()
        return [renumbered(data, seq)]

    return answer


@pytest.fixture
def cli(on_host):
    """ibtool on the running host, its RDMA netlink (and processes, release) the stand-in's
    once a test gives them."""
    return on_host


@pytest.fixture
def kernel(on_host):
    """The captured kernel behind the host's NETLINK_RDMA socket; the processes of the capture
    under their names; the requests it got."""
    kernels: list[FakeKernel] = []

    def install(overrides=None):
        def open_socket():
            kernels.append(FakeKernel(captured_kernel(overrides)))
            return kernels[-1]

        on_host.seams["netlink"] = client_on(open_socket)
        return kernels

    on_host.seams.update(comm=COMM.get, release="6.1.0-28-amd64")
    return install


# -- golden: the captured bytes against rdma's JSON of the same moment --------------------------


@pytest.mark.parametrize("kind", ["qp", "cm_id", "mr", "pd", "ctx", "srq"])
def test_json_is_what_rdma_printed_at_the_same_moment(cli, kernel, kind):
    kernel()
    result = cli("-j", "res", kind)
    assert (result.code, result.err) == (0, "")
    assert result.json == rdma_says(kind)


def test_cqs_are_what_rdma_printed_but_for_its_stale_poll_context_names(cli, kernel):
    # iproute2 (6.1 and later) still names ib_poll_context as before Linux 5.8: the kernel's
    # IB_POLL_UNBOUND_WORKQUEUE (2) is "WORKQUEUE" there.
    kernel()
    ours = cli("-j", "res", "cq").json
    theirs = rdma_says("cq")
    assert [c.get("poll-ctx") for c in theirs] == ["WORKQUEUE", None, "WORKQUEUE"]
    assert [c.get("poll-ctx") for c in ours] == ["UNBOUND_WORKQUEUE", None, "UNBOUND_WORKQUEUE"]
    for c in ours:
        c.pop("poll-ctx", None)
    for c in theirs:
        c.pop("poll-ctx", None)
    assert ours == theirs


def test_the_captured_dumps_decode_to_records():
    msgs = messages.parse((RESOURCES / "res_qp_get_dump_rxe0.bin").read_bytes())
    replies = [messages.attributes(m) for m in msgs if A.command_of(m["header"]["type"])]
    qps = records.resources("qp", replies)
    gsi = next(q for q in qps if q.lqpn == 1)
    assert (gsi.port, gsi.type.label, gsi.owner.pid, gsi.owner.kern_name) == (
        1,
        "GSI",
        None,
        "ib_core",
    )
    assert {q.owner.pid for q in qps if q.lqpn != 1} == {HOLDER}
    srq_msgs = messages.parse((RESOURCES / "res_srq_get_dump_rxe0.bin").read_bytes())
    (srq,) = records.resources("srq", [messages.attributes(m) for m in srq_msgs[:1]])
    assert srq.lqpns == ((19, 19),)


def test_text_is_a_table_with_kernel_holders_in_brackets(cli, kernel):
    kernel()
    lines = cli("res", "qp", "rxe1").out.splitlines()
    assert lines[0].split() == ["DEV", "PORT", "LQPN", "TYPE", "STATE", "SQ-PSN", "COMM"]
    assert lines[1].split() == ["rxe1", "1", "1", "GSI", "RTS", "0", "[ib_core]"]
    assert len(lines) == 2


def test_cm_id_addresses_and_port_space(cli, kernel):
    kernel()
    (cm,) = cli("-j", "res", "cm_id").json
    assert (cm["state"], cm["ps"], cm["src-addr"], cm["comm"]) == (
        "LISTEN",
        "TCP",
        "192.168.77.1:7471",
        "rping",
    )


def test_summary_counts_per_device(cli, kernel):
    kernel()
    result = cli("res")
    assert result.code == 0
    header, *rows = result.out.splitlines()
    assert header.split()[:2] == ["DEV", "PD"]
    assert [r.split()[0] for r in rows] == ["rxe0", "rxe1"]
    (only,) = cli("-j", "res", "show", "rxe1").json
    assert (only["ifindex"], only["ifname"], only["qp"]) == (1, "rxe1", 1)


# -- filters --------------------------------------------------------------------------------


def lqpns(result) -> list[int]:
    assert result.code == 0, result.err
    return [q["lqpn"] for q in result.json]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["rxe0", "lqpn", "17"], [17]),
        (["rxe0", "lqpn", "17,19-20"], [19, 20, 17]),
        (["rxe0", "type", "rc", "state", "RESET"], [19, 20, 21]),
        (["rxe0", "state", "rts,init"], [17, 18, 1]),
        (["pid", str(HOLDER)], [19, 20, 21, 17, 18]),
        (["comm", "ib_core"], [1, 1]),
        (["comm", "python3", "type", "UD"], [17]),
        (["link", "rxe0/1", "type", "GSI"], [1]),
        (["dev", "rxe1"], [1]),
        (["rxe0", "rqpn", "0"], [19, 20, 21, 18]),  # UD and GSI QPs have no remote QPN
    ],
    ids=lambda v: " ".join(map(str, v)),
)
def test_qp_filters_as_rdma_takes_them(cli, kernel, words, expected):
    kernel()
    assert lqpns(cli("-j", "res", "qp", *words)) == expected


def test_a_pid_filter_leaves_kernel_objects_out(cli, kernel):
    kernel()
    pds = cli("-j", "res", "pd", "pid", f"1-{max(COMM)}").json
    assert {p["comm"] for p in pds} == {"rping", "python3"}


def test_srq_lqpn_filter_looks_at_the_attached_qps(cli, kernel):
    kernel()
    assert len(cli("-j", "res", "srq", "lqpn", "19").json) == 1
    assert cli("-j", "res", "srq", "lqpn", "20").json == []


def test_a_port_is_asked_of_the_kernel(cli, kernel):
    kernels = kernel()
    assert cli("-j", "res", "qp", "rxe0/1").code == 0
    (dump,) = [r for r in kernels[0].requests if r["type"] == 5130]
    assert dump["attrs"] == {"RDMA_NLDEV_ATTR_DEV_INDEX": 0, "RDMA_NLDEV_ATTR_PORT_INDEX": 1}
    assert dump["flags"] == A.NLM_F_REQUEST | A.NLM_F_DUMP


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["cq", "rxe0/1"], ExitCode.USAGE, "rxe0/1: cq objects belong to a device, not a port"),
        (["qp", "colour", "red"], ExitCode.USAGE, "qp has no filter 'colour'"),
        (["qp", "lqpn"], ExitCode.USAGE, "lqpn needs a value"),
        (["qp", "lqpn", "five"], ExitCode.USAGE, "lqpn takes numbers, not 'five'"),
        (["rxe0", "rxe1"], ExitCode.USAGE, "unexpected arguments: rxe1"),
        (["qp", "rxe9"], ExitCode.NOT_FOUND, "no RDMA device 'rxe9'"),
        (["qp", "rxe0/2"], ExitCode.NOT_FOUND, "rxe0 has no port 2"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_bad_words_are_one_line_errors(cli, kernel, argv, code, message):
    kernel()
    result = cli("res", *argv)
    assert result.code == code
    assert result.err.startswith(f"ibtool: error: {message}")
    assert result.err.count("\n") == 1 and result.out == ""


def test_no_objects_is_an_empty_list_or_no_output(cli, kernel):
    kernel()
    assert cli("-j", "res", "mr", "rxe1").json == []
    result = cli("res", "ctx", "rxe1")
    assert (result.code, result.out, result.err) == (0, "", "")
    assert cli("-j", "res", "qp", "lqpn", "999").json == []


def test_root_trees_have_no_netlink(empty_root):
    assert empty_root("res", "qp").code == ExitCode.USAGE


# -- errors -----------------------------------------------------------------------------------


def _fail(code):
    return lambda request, seq: [done(seq, code)]


def test_a_kernel_without_the_dump_says_which_command_it_lacks(cli, kernel):
    kernel({(A.RDMA_NLDEV_CMD_RES_CTX_GET, 0): _fail(errno.EOPNOTSUPP)})
    result = cli("res", "ctx")
    assert (result.code, result.out) == (ExitCode.UNSUPPORTED, "")
    assert result.err.startswith(
        "ibtool: error: this kernel has no RDMA_NLDEV_CMD_RES_CTX_GET "
        "(contexts are listed from Linux 5.13) (hint: "
    )
    assert result.err.count("\n") == 1


def test_einval_from_a_device_that_is_still_there_is_unsupported(cli, kernel):
    kernel({(A.RDMA_NLDEV_CMD_RES_SRQ_GET, 0): _fail(errno.EINVAL)})
    result = cli("res", "srq")
    assert result.code == ExitCode.UNSUPPORTED


def test_a_device_that_vanishes_mid_dump_is_a_warning_and_the_rest_shown(cli, kernel):
    gone = lambda request, seq: [ack(request, errno.ENODEV)]  # noqa: E731
    kernel(
        {
            (A.RDMA_NLDEV_CMD_RES_QP_GET, 0): _fail(errno.EINVAL),
            (A.RDMA_NLDEV_CMD_GET, 0): gone,
        }
    )
    result = cli("-j", "res", "qp")
    assert result.code == 0
    assert [q["ifname"] for q in result.json] == ["rxe1"]
    assert result.warnings == ["ibtool: warning: rxe0 disappeared while its qp objects were read"]


def test_eperm_names_the_capability(cli, kernel):
    kernel({(A.RDMA_NLDEV_CMD_RES_MR_GET, 0): _fail(errno.EPERM)})
    result = cli("res", "mr")
    assert result.code == ExitCode.PERMISSION
    assert "needs CAP_NET_ADMIN" in result.err


# -- large and driver-specific dumps -----------------------------------------------------------


def _qp_entry(lqpn: int, driver: bool = False) -> bytes:
    body = [u32(21, lqpn), u32(24, 0), u8(26, 2), u8(27, 0), u32(28, 4242)]
    if driver:
        body.append(nla(52, string(54, "sq_wqe_cnt") + u32(57, 64)))
    return nla(20, b"".join(body))


def test_a_dump_of_a_thousand_qps_in_many_parts(cli, on_host):
    header = (u32(1, 0), string(2, "rxe0"))
    parts = [range(i, i + 50) for i in range(1000, 2000, 50)]

    def answer(request, seq):
        (msg,) = messages.parse(request)
        if A.command_of(msg["header"]["type"]) == A.RDMA_NLDEV_CMD_GET:
            return [renumbered((NETLINK / "get_dump.bin").read_bytes(), seq)]
        if messages.attributes(msg)["RDMA_NLDEV_ATTR_DEV_INDEX"] == 1:
            return [done(seq)]
        datagrams = [
            reply(
                A.RDMA_NLDEV_CMD_RES_QP_GET,
                *header,
                nla(19, b"".join(_qp_entry(n) for n in part)),
                flags=A.NLM_F_MULTI,
                seq=seq,
            )
            for part in parts
        ]
        return [*datagrams, done(seq)]

    on_host.seams.update(netlink=client_on(lambda: FakeKernel(answer)), comm=lambda pid: "bench")
    result = cli("-j", "res", "qp")
    assert lqpns(result) == list(range(1000, 2000))
    assert result.json[0] == {
        "ifindex": 0,
        "ifname": "rxe0",
        "lqpn": 1000,
        "type": "RC",
        "state": "RESET",
        "sq-psn": 0,
        "pid": 4242,
        "comm": "bench",
    }


def test_details_add_the_driver_attributes_as_rdma_dd_does(cli, on_host):
    def answer(request, seq):
        (msg,) = messages.parse(request)
        if A.command_of(msg["header"]["type"]) == A.RDMA_NLDEV_CMD_GET:
            return [renumbered((NETLINK / "get_dump.bin").read_bytes(), seq)]
        attrs = messages.attributes(msg)
        if attrs["RDMA_NLDEV_ATTR_DEV_INDEX"] == 1:
            return [done(seq)]
        assert attrs.get("RDMA_NLDEV_ATTR_DRIVER_DETAILS") == 1
        table = nla(19, _qp_entry(7, driver=True))
        return [
            reply(10, u32(1, 0), string(2, "rxe0"), table, flags=A.NLM_F_MULTI, seq=seq),
            done(seq),
        ]

    on_host.seams.update(
        netlink=client_on(lambda: FakeKernel(answer)),
        comm=lambda pid: None,  # the process has exited
    )
    (qp,) = cli("-d", "-j", "res", "qp").json
    assert qp["drv_sq_wqe_cnt"] == 64 and "comm" not in qp
    text = cli("-d", "res", "qp").out.splitlines()
    assert text[0].split()[-1] == "DRIVER" and text[1].endswith("sq_wqe_cnt 64")


def test_u64_counts_in_the_summary_of_a_kernel_with_more_types(cli, on_host):
    entry = nla(16, string(17, "qp") + u64(18, 2**40))
    extra = nla(16, string(17, "frmr") + u64(18, 3))

    def answer(request, seq):
        (msg,) = messages.parse(request)
        if A.command_of(msg["header"]["type"]) == A.RDMA_NLDEV_CMD_GET:
            return [renumbered((NETLINK / "get_dump.bin").read_bytes(), seq)]
        body = (u32(1, 0), string(2, "rxe0"), nla(15, entry + extra))
        return [reply(9, *body, flags=A.NLM_F_MULTI, seq=seq), done(seq)]

    on_host.seams["netlink"] = client_on(lambda: FakeKernel(answer))
    result = cli("-j", "res")
    # the types ibtool lists that this kernel does not count are unknown, not 0
    uncounted = dict.fromkeys(["pd", "cq", "cm_id", "mr", "ctx", "srq"])
    assert result.json == [{"ifindex": 0, "ifname": "rxe0", "qp": 2**40, "frmr": 3, **uncounted}]
    assert result.warnings == [
        "ibtool: warning: this kernel's RDMA_NLDEV_CMD_RES_GET does not count "
        "pd, cq, cm_id, mr, ctx, srq: shown as unknown"
    ]

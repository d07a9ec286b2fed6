"""Counters that only netlink shows: enabled optional counters merged into `ibtool counters`,
and `counters optional | enable | disable` (STAT_GET_STATUS, STAT_SET), against a stand-in
kernel that keeps the enabled set between requests as the real one does."""

from __future__ import annotations

import errno

import pytest

from ibtool.errors import IbtoolError, NotFoundError, PermissionDeniedError, UsageError
from ibtool.host import Host
from ibtool.sources.netlink import attrs as A
from ibtool.sources.netlink import client, messages
from ibtool.sources.sysfs.infiniband import SysfsSource
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

DEV_INDEX, DEV_NAME, PORT_INDEX = 1, 2, 3
HWCOUNTERS, ENTRY, NAME, VALUE, INDEX, DYNAMIC = 80, 81, 82, 83, 94, 95

# mlx5's optional counters (netlink only) with the indexes STAT_GET_STATUS gives them.
OPTIONAL = {"cc_rx_ce_pkts": 40, "rdma_tx_bytes": 41, "rdma_rx_bytes": 42}


class StatKernel:
    """mlx5_0 (index 7), two ports: STAT_GET, STAT_GET_STATUS and STAT_SET, as nldev.c does."""

    def __init__(self, enabled=(), stat_set_error: int = 0):
        self.enabled = {1: set(enabled), 2: set()}
        self.stat_set_error = stat_set_error
        self.refusal: Exception | None = None  # what opening a socket raises instead
        self.sockets: list[FakeKernel] = []
        self.commands: list[int] = []

    def open(self) -> FakeKernel:
        if self.refusal is not None:
            raise self.refusal
        sock = FakeKernel(self.answer)
        self.sockets.append(sock)
        return sock

    def answer(self, request: bytes, seq: int) -> list[bytes]:
        (msg,) = messages.parse(request)
        command = A.command_of(msg["header"]["type"])
        self.commands.append(command)
        attrs = messages.attributes(msg)
        if command == A.RDMA_NLDEV_CMD_GET:
            dev = (u32(DEV_INDEX, 7), string(DEV_NAME, "mlx5_0"))
            return [reply(command, *dev, flags=A.NLM_F_MULTI, seq=seq), done(seq)]
        port = attrs["RDMA_NLDEV_ATTR_PORT_INDEX"]
        assert attrs["RDMA_NLDEV_ATTR_DEV_INDEX"] == 7
        head = (u32(DEV_INDEX, 7), string(DEV_NAME, "mlx5_0"), u32(PORT_INDEX, port))
        if command == A.RDMA_NLDEV_CMD_STAT_GET:
            values = {name: 0 for name in sysfs_trees.MLX5_Q_COUNTERS}
            values.update({n: 1000 + OPTIONAL[n] for n in self.enabled[port]})
            entries = [
                nla(ENTRY, string(NAME, n) + u64(VALUE, v), nested=True) for n, v in values.items()
            ]
            body = nla(HWCOUNTERS, b"".join(entries), nested=True)
            return [reply(command, *head, body, seq=seq), ack(request)]
        if command == A.RDMA_NLDEV_CMD_STAT_GET_STATUS:
            entries = [
                nla(ENTRY, string(NAME, n) + u32(INDEX, i), nested=True)
                for i, n in enumerate(sysfs_trees.MLX5_Q_COUNTERS)
            ] + [
                nla(
                    ENTRY,
                    string(NAME, n) + u32(INDEX, i) + u8(DYNAMIC, n in self.enabled[port]),
                    nested=True,
                )
                for n, i in OPTIONAL.items()
            ]
            body = nla(HWCOUNTERS, b"".join(entries), nested=True)
            return [reply(command, *head, body, seq=seq), ack(request)]
        if command == A.RDMA_NLDEV_CMD_STAT_SET:
            if self.stat_set_error:
                return [ack(request, self.stat_set_error)]
            wanted = attrs["RDMA_NLDEV_ATTR_STAT_HWCOUNTERS"]
            by_index = {i: n for n, i in OPTIONAL.items()}
            self.enabled[port] = {by_index[i] for name, i in wanted}
            return [ack(request)]
        return [ack(request, errno.EOPNOTSUPP)]


@pytest.fixture
def live(tmp_path):
    """An mlx5 InfiniBand HCA tree read as if it were the running kernel's, and its kernel."""
    root = sysfs_trees.build("mlx5_ib_hca", tmp_path)

    def make(**kernel_args):
        kernel = StatKernel(**kernel_args)
        warnings: list[str] = []
        host = Host(
            warn=warnings.append,
            sysfs=SysfsSource(str(root), warnings.append),
            netlink=client_on(kernel.open),
        )
        return host, kernel, warnings

    return make


def test_enabled_optional_counters_join_the_sysfs_ones(live):
    host, kernel, warnings = live(enabled={"rdma_tx_bytes"})
    samples = host.counters("mlx5_0/1")
    extra = [s for s in samples if s.via == "netlink"]
    assert [(s.name, s.value, s.source) for s in extra] == [("rdma_tx_bytes", 1041, "optional")]
    # everything else is what sysfs says; one socket for the run, closed with the host
    assert {s.source for s in samples if s.via == "sysfs"} == {"pma", "hw"}
    assert len(kernel.sockets) == 1
    host.close()
    assert kernel.sockets[0].kernel_end.fileno() == -1
    assert warnings == []


def test_no_optional_counter_enabled_adds_nothing(live):
    host, kernel, _ = live()
    samples = host.counters("mlx5_0")
    assert [s for s in samples if s.via == "netlink"] == []
    # STAT_GET_STATUS is asked only when netlink has counters sysfs lacks
    assert A.RDMA_NLDEV_CMD_STAT_GET_STATUS not in kernel.commands


def test_without_rdma_netlink_sysfs_stands_alone_with_a_note_under_details(live):
    host, kernel, warnings = live()
    kernel.refusal = client.socket_error(OSError(errno.EPROTONOSUPPORT, "Protocol not supported"))
    assert len(host.counters("mlx5_0/1")) > 0 and warnings == []
    host.details = True
    host.counters("mlx5_0/1")
    assert warnings == ["counters from sysfs only: RDMA netlink: no RDMA netlink in this kernel"]


def test_a_port_whose_stat_get_fails_is_warned_about_and_the_other_shown(live):
    host, kernel, warnings = live(enabled={"cc_rx_ce_pkts"})
    answer = kernel.answer

    def failing_port_1(request, seq):
        (msg,) = messages.parse(request)
        attrs = messages.attributes(msg)
        if attrs.get("RDMA_NLDEV_ATTR_PORT_INDEX") == 1:
            return [ack(request, errno.EIO)]
        return answer(request, seq)

    kernel.answer = failing_port_1
    kernel.enabled[2] = {"rdma_rx_bytes"}
    samples = host.counters("mlx5_0")
    assert warnings == [
        "mlx5_0/1: netlink counters: RDMA_NLDEV_CMD_STAT_GET failed: Input/output error"
    ]
    assert [(s.port, s.name) for s in samples if s.via == "netlink"] == [(2, "rdma_rx_bytes")]


def test_optional_lists_every_optional_counter_and_whether_it_is_on(live):
    host, _, _ = live(enabled={"rdma_rx_bytes"})
    out, _ = counters_cli(host, "optional", "mlx5_0/1")
    assert out.splitlines() == [
        "DEV     PORT  COUNTER        ENABLED",
        "mlx5_0  1     cc_rx_ce_pkts  no",
        "mlx5_0  1     rdma_tx_bytes  no",
        "mlx5_0  1     rdma_rx_bytes  yes",
    ]


def test_optional_json_with_index_under_details(live):
    import json

    host, _, _ = live()
    out, _ = counters_cli(host, "optional", "mlx5_0/2", json=True, details=True)
    assert json.loads(out)[0] == {
        "ifname": "mlx5_0",
        "port": 2,
        "counter": "cc_rx_ce_pkts",
        "enabled": False,
        "index": 40,
    }


def test_enable_adds_to_what_is_on_and_disable_takes_away(live):
    host, kernel, _ = live(enabled={"rdma_rx_bytes"})
    counters_cli(host, "enable", "mlx5_0/1", "rdma_tx_bytes,cc_rx_ce_pkts")
    assert kernel.enabled[1] == {"rdma_rx_bytes", "rdma_tx_bytes", "cc_rx_ce_pkts"}
    counters_cli(host, "disable", "mlx5_0/1", "rdma_rx_bytes")
    assert kernel.enabled[1] == {"rdma_tx_bytes", "cc_rx_ce_pkts"}
    assert kernel.enabled[2] == set()  # the other port untouched
    counters_cli(host, "disable", "mlx5_0/1", "all")
    assert kernel.enabled[1] == set()


def test_enable_an_unknown_counter_names_the_optional_ones(live):
    host, kernel, _ = live()
    with pytest.raises(NotFoundError) as e:
        counters_cli(host, "enable", "mlx5_0/1", "rdma_tx_bytez")
    assert e.value.message == "mlx5_0/1 has no optional counter 'rdma_tx_bytez'"
    assert "cc_rx_ce_pkts, rdma_rx_bytes, rdma_tx_bytes" in e.value.hint
    assert A.RDMA_NLDEV_CMD_STAT_SET not in kernel.commands


def test_enable_without_cap_net_admin(live):
    host, _, _ = live(stat_set_error=errno.EPERM)
    with pytest.raises(PermissionDeniedError) as e:
        counters_cli(host, "enable", "mlx5_0/1", "rdma_tx_bytes")
    assert e.value.message == "RDMA_NLDEV_CMD_STAT_SET needs CAP_NET_ADMIN"


@pytest.mark.parametrize(
    "words", [("enable",), ("enable", "mlx5_0/1"), ("optional", "mlx5_0", "x")]
)
def test_bad_words_are_usage_errors(live, words):
    host, _, _ = live()
    with pytest.raises(UsageError):
        counters_cli(host, *words)


def test_optional_counters_need_the_live_kernel(mlx5_ib_hca):
    result = mlx5_ib_hca("counters", "optional")
    assert result.code == 2
    assert result.err.startswith("ibtool: error: optional counters exist only in netlink")


def test_an_unknown_device_for_enable(live):
    host, _, _ = live()
    with pytest.raises(IbtoolError) as e:
        counters_cli(host, "enable", "mlx5_9/1", "rdma_tx_bytes")
    assert e.value.message == "unknown device 'mlx5_9'"

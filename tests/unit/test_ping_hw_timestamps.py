"""`ibtool ping --hw-timestamps`: round trips on the HCA's clock where the device stamps its
completions (mlx5; faked at the device boundary: query_device_ex, query_rt_values_ex and the
completions' timestamps of pyverbs_fakes.py), and a clear refusal where it does not (rxe, whose
refusal the testbed shows) or where pyverbs cannot read the clock."""

from __future__ import annotations

import pytest

from ibtool.errors import ExitCode
from tests.unit.fake_host import ROCE_GID
from tests.unit.pyverbs_fakes import FakeContext
from tests.unit.test_ping_edges import PingServer

GHZ = 1_000_000  # hca_core_clock in kHz: one tick a nanosecond, as ConnectX-5's 1 GHz clock


@pytest.fixture
def stamping(fake_pyverbs, live_roce):
    """mlx5_0/1 (RoCE, GID 3) whose device stamps completions with a 1 GHz 64-bit counter."""
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port(
        "mlx5_0", 1, link_layer=2, gids={3: ROCE_GID}, timestamp_mask=2**64 - 1,
        core_clock_khz=GHZ,
    )  # fmt: skip
    return live_roce


def test_each_reply_has_its_round_trip_on_the_hca_clock(stamping, monkeypatch):
    with PingServer(monkeypatch) as server:
        r = stamping("ping", "127.0.0.1", "--port", str(server.port), "-c", "3", "-i", "0",
                     "--hw-timestamps")  # fmt: skip
    assert r.code == ExitCode.OK, r.err
    lines = r.out.splitlines()
    # The fake counter moves 1000 ticks (1 us) when read before the post, when the server's
    # receive completes and when the reply's does: 2 us from the post to the reply.
    assert [line.split(" rtt=")[1].split(" us ")[1] for line in lines[1:4]] == ["hw=2.00 us"] * 3
    assert lines[-1] == "hw rtt min/avg/median/max/mdev = 2.00/2.00/2.00/2.00/0.00 us"
    assert lines[-2].startswith("rtt min/avg/median/max/mdev = ")


def test_json_carries_the_hca_figures(stamping, monkeypatch):
    with PingServer(monkeypatch) as server:
        r = stamping("-j", "ping", "127.0.0.1", "--port", str(server.port), "-c", "2", "-i", "0",
                     "--hw-timestamps")  # fmt: skip
    assert r.code == ExitCode.OK, r.err
    assert [x["hw_rtt_us"] for x in r.json["replies"]] == [2.0, 2.0]
    assert r.json["hw_rtt_us"]["median"] == 2.0


def test_without_the_option_nothing_changes(stamping, monkeypatch):
    with PingServer(monkeypatch) as server:
        r = stamping("-j", "ping", "127.0.0.1", "--port", str(server.port), "-c", "1")
    assert "hw_rtt_us" not in r.json and "hw_rtt_us" not in r.json["replies"][0]


def test_a_device_that_does_not_stamp_is_unsupported(fake_pyverbs, live_roce):
    fabric = fake_pyverbs("rdma-core-65")
    fabric.add_port("mlx5_0", 1, link_layer=2, gids={3: ROCE_GID})  # mask 0, as rxe's
    r = live_roce("ping", "127.0.0.1", "--hw-timestamps")
    assert (r.code, r.out) == (ExitCode.UNSUPPORTED, "")
    assert r.err == (
        "ibtool: error: mlx5_0 does not timestamp its completions (completion_timestamp_mask "
        "0x0, hca_core_clock 0 kHz) (hint: completion timestamps are an mlx5 (ConnectX-4 and "
        "later) feature: leave --hw-timestamps out)\n"
    )
    assert not fabric.qps


def test_a_pyverbs_that_cannot_read_the_clock_is_unsupported(stamping, monkeypatch):
    monkeypatch.delattr(FakeContext, "query_rt_values_ex")  # pyverbs before rdma-core 36
    r = stamping("ping", "127.0.0.1", "--hw-timestamps")
    assert r.code == ExitCode.UNSUPPORTED
    assert r.err.startswith(
        "ibtool: error: this pyverbs has no Context.query_rt_values_ex, which reads the HCA "
        "clock (rdma-core 36 and later have it)"
    )


@pytest.mark.parametrize(
    "argv, over",
    [
        (["--server"], "--server"),
        (["--compat", "rping", "192.0.2.1"], "--compat rping"),
    ],
)
def test_only_a_verbs_client_times_on_the_hca(stamping, argv, over):
    r = stamping("ping", *argv, "--hw-timestamps")
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err.startswith(f"ibtool: error: --hw-timestamps with {over} ")


def test_every_client_that_builds_itself_still_has_what_ping_reads():
    # cmping.Client and pingpong.PingpongClient do not call ping.Client.__init__; ping() reads
    # hw (and sets hw_us) on all of them. Missing, --cm died on an AttributeError.
    from ibtool.rdma.ping import cmping, pingpong

    for client in (cmping.Client, pingpong.PingpongClient):
        assert client.hw is None and client.hw_us is None

"""ibtool counters on fixture trees, and rates from two samples: wraps, saturation, resets."""

from __future__ import annotations

import pytest

from ibtool.model import CounterSample
from ibtool.rates import counter_rate, is_saturated

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


def sample(name, value, source="hw", width=None, scale=1):
    return CounterSample("mlx5_0", 1, name, value, source, width, scale)


def test_pma_data_counters_are_shown_in_bytes(mlx5_ib_hca):
    r = mlx5_ib_hca("-j", "counters", "mlx5_0/1")
    assert r.code == 0
    rows = {row["counter"]: row for row in r.json}
    raw = int(
        (
            mlx5_ib_hca.root / "sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
        ).read_text()
    )
    assert rows["port_xmit_data"]["value"] == raw * 4
    assert rows["port_xmit_data"]["unit"] == "bytes"
    assert rows["port_xmit_wait"]["saturated"] is True
    assert rows["symbol_error"]["error"] is True and rows["symbol_error"]["saturated"] is False


def test_errors_shows_only_nonzero_error_counters(mlx5_ib_hca):
    r = mlx5_ib_hca("-j", "counters", "--errors")
    assert r.code == 0 and r.json
    assert all(row["error"] and row["value"] > 0 for row in r.json)


def test_iwarp_without_pma_is_unknown_with_one_warning_per_port(i40iw_iwarp):
    r = i40iw_iwarp("-j", "counters")
    assert r.code == 0
    pma = [row for row in r.json if row["source"] == "pma"]
    assert pma and all(row["value"] is None for row in pma)
    assert len(r.warnings) == 1 and "PMA counters unavailable" in r.warnings[0]


def test_explain_names_meaning_and_causes(cli):
    r = cli("counters", "--explain", "symbol_error")
    assert r.code == 0 and "minor link errors" in r.out and "Usually raised by" in r.out


def test_explain_unknown_counter_exits_not_found(cli):
    r = cli("counters", "--explain", "no_such_counter")
    assert r.code == 4 and "no explanation for counter 'no_such_counter'" in r.err


def test_captured_rxe_has_hw_counters_only(captured_rxe):
    r = captured_rxe("-j", "counters")
    assert r.code == 0
    names = {row["counter"] for row in r.json}
    assert {"sent_pkts", "rcvd_pkts", "duplicate_request"} <= names
    assert {row["source"] for row in r.json} == {"hw"}


def test_rate_is_the_delta_per_second():
    assert counter_rate(sample("sent_pkts", 100), sample("sent_pkts", 350), 2.0) == (125.0, None)


def test_pma_data_rate_is_in_bytes():
    old = sample("port_xmit_data", 1000, "pma", 32, 4)
    new = sample("port_xmit_data", 1250, "pma", 32, 4)
    assert counter_rate(old, new, 1.0) == (1000.0, None)


def test_mlx5_q_counter_wraps_at_32_bits():
    old, new = sample("out_of_buffer", (1 << 32) - 10), sample("out_of_buffer", 5)
    assert counter_rate(old, new, 1.0) == (15.0, "wrapped")


def test_saturated_pma_counter_has_no_rate():
    old = sample("port_xmit_wait", (1 << 32) - 5, "pma", 32)
    new = sample("port_xmit_wait", (1 << 32) - 1, "pma", 32)
    assert counter_rate(old, new, 1.0) == (None, "saturated")


@pytest.mark.parametrize("name", ["sent_pkts", "symbol_error"])
def test_a_counter_that_went_back_was_reset(name):
    assert counter_rate(sample(name, 500), sample(name, 3), 1.0) == (None, "reset")


def test_unreadable_sample_has_no_rate():
    assert counter_rate(sample("x", None), sample("x", 3), 1.0) == (None, "unknown")


# -- reset, not wrap; saturation ----------------------------------------------------------------


def test_a_pma_counter_that_went_down_was_reset():
    # procfs mlx5_0 port_xmit_data, then the device re-created
    old = sample("port_xmit_data", 2880761508848, "pma", 64, 4)
    assert counter_rate(old, sample("port_xmit_data", 1203, "pma", 64, 4), 1.0) == (None, "reset")


def test_a_32_bit_pma_counter_near_its_maximum_that_went_down_was_reset_not_wrapped():
    old = sample("port_xmit_packets", U32_MAX - 10, "pma", 32)
    assert counter_rate(old, sample("port_xmit_packets", 5, "pma", 32), 1.0) == (None, "reset")


def test_a_saturated_error_counter_that_went_down_was_cleared():
    old, new = sample("symbol_error", 65535, "pma", 16), sample("symbol_error", 0, "pma", 16)
    assert counter_rate(old, new, 1.0) == (None, "reset")


def test_a_mlx5_q_counter_that_dropped_far_was_reset_not_wrapped():
    # procfs mlx5_0 hw_counters/rx_read_requests, then the count of a re-created device
    old, new = sample("rx_read_requests", 175528982), sample("rx_read_requests", 41)
    assert counter_rate(old, new, 1.0) == (None, "reset")


def test_a_32_bit_reading_then_a_64_bit_one_is_a_rate():
    # a noietf table passing 2^32: the first sample could not tell it was 64-bit
    old = sample("port_rcv_data", U32_MAX - 999, "pma", 32, 4)
    new = sample("port_rcv_data", U32_MAX + 1001, "pma", 64, 4)
    assert counter_rate(old, new, 2.0) == (4000.0, None)


def test_a_pma_counter_reaching_its_maximum_has_no_rate():
    # node_exporter mlx4_0 port_xmit_wait: 4294967295
    old, new = (
        sample("port_xmit_wait", 3599, "pma", 32),
        sample("port_xmit_wait", U32_MAX, "pma", 32),
    )
    assert counter_rate(old, new, 1.0) == (None, "saturated")


def test_a_64_bit_counter_is_saturated_only_at_2_64_minus_1():
    assert not is_saturated(sample("port_xmit_data", U32_MAX, "pma", 64, 4))
    assert is_saturated(sample("port_xmit_data", U64_MAX, "pma", 64, 4))

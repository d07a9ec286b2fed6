"""ibtool counters on fixture trees, and rates from two samples: wraps, saturation, resets.

Values marked "procfs" or "node_exporter" are those of real adapters in the sysfs fixtures of
prometheus/procfs (testdata/fixtures.ttar) and prometheus/node_exporter (collector/fixtures).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ibtool.errors import ExitCode
from ibtool.model import counters as counterinfo
from ibtool.model.rates import counter_rate, is_saturated
from ibtool.model.records import CounterSample
from ibtool.sources.sysfs.infiniband import SysfsSource
from tests.fixtures import captured_kernel
from tests.fixtures.sysfs_trees import require_capture

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


def sample(name, value, source="hw", width=None, scale=1):
    return CounterSample("mlx5_0", 1, name, value, source, width, scale)


def counter_file(ibtool, device: str, port: int, name: str, directory="counters") -> Path:
    return ibtool.root / "sys/class/infiniband" / device / "ports" / str(port) / directory / name


def write(path: Path, value) -> None:
    path.write_text(f"{value}\n", encoding="utf-8")


def by_name(result) -> dict:
    return {row["counter"]: row for row in result.json}


def samples_of(ibtool, device: str, port: int) -> dict[str, CounterSample]:
    return {s.name: s for s in SysfsSource(str(ibtool.root)).counters(device, port)}


class Clock:
    """`time` for the counters plugin: sleep() lets the counters move, then the time passes."""

    def __init__(self, between):
        self.now, self.between = 1000.0, between

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.between()
        self.now += seconds


@pytest.fixture
def between_samples(monkeypatch):
    """between_samples(change): --rate runs change() between its two samples, 1 s apart."""
    from ibtool_plugins import counters

    return lambda change: monkeypatch.setattr(counters, "time", Clock(change))


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


def test_where_a_value_was_read_is_a_detail(mlx5_ib_hca):
    assert all("via" not in row for row in mlx5_ib_hca("-j", "counters").json)
    assert {row["via"] for row in mlx5_ib_hca("-d", "-j", "counters").json} == {"sysfs"}
    assert "VIA" not in mlx5_ib_hca("counters").out.splitlines()[0]
    assert mlx5_ib_hca("-d", "counters").out.splitlines()[0].split()[-1] == "VIA"


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


SNAPSHOT = captured_kernel.CAPTURED / "snapshot" / "host.json.gz"


def interrupted() -> None:
    raise KeyboardInterrupt  # a second sample was about to be taken: it should not be


SNAPSHOT_RATES = [
    (["--rate"], "--rate"),
    (["--rate", "--interval", "0.5"], "--rate"),
    (["--watch", "1"], "--watch"),
    (["-j", "--watch", "1", "--errors"], "--watch"),
]


@pytest.mark.parametrize(
    ("argv", "flag"), SNAPSHOT_RATES, ids=[" ".join(argv) for argv, _ in SNAPSHOT_RATES]
)
def test_rates_of_a_snapshot_are_refused_as_it_holds_one_reading(cli, between_samples, argv, flag):
    between_samples(interrupted)
    path = require_capture(SNAPSHOT)
    r = cli("--snapshot", str(path), "counters", *argv)
    assert (r.code, r.out) == (ExitCode.USAGE, "")
    assert r.err == (
        f"ibtool: error: counters {flag} needs two readings, and a snapshot holds one "
        "(hint: ibtool snapshot diff A B shows how the counters moved between two snapshots)\n"
    )


def test_a_snapshot_still_shows_its_counters(cli):
    r = cli("-j", "--snapshot", str(require_capture(SNAPSHOT)), "counters", "rxe0/1")
    assert r.code == 0
    assert "sent_pkts" in {row["counter"] for row in r.json}


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


# -- widths: IBTA PortCounters ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, width",
    [
        ("symbol_error", 16),
        ("port_rcv_errors", 16),
        ("port_rcv_remote_physical_errors", 16),
        ("port_rcv_switch_relay_errors", 16),
        ("port_xmit_discards", 16),
        ("VL15_dropped", 16),
        ("link_downed", 8),
        ("link_error_recovery", 8),
        ("port_xmit_constraint_errors", 8),
        ("port_rcv_constraint_errors", 8),
        ("local_link_integrity_errors", 4),
        ("excessive_buffer_overrun_errors", 4),
        ("port_xmit_data", 32),
        ("port_rcv_data", 32),
        ("port_xmit_packets", 32),
        ("port_rcv_packets", 32),
        ("port_xmit_wait", 32),
        ("unicast_xmit_packets", 64),
        ("multicast_rcv_packets", 64),
    ],
)
def test_pma_counter_widths_are_the_ibta_ones(name, width):
    assert counterinfo.pma_width(name, wide=False) == width


@pytest.mark.parametrize("name", counterinfo.PMA_EXTENDED)
def test_data_and_packet_counters_of_an_extended_table_are_64_bit(name):
    assert counterinfo.pma_width(name, wide=True) == 64
    assert counterinfo.pma_width("port_xmit_wait", wide=True) == 32  # PortCounters only


def test_a_counter_is_saturated_at_the_maximum_of_its_own_width(mlx5_ib_hca):
    values = {
        "symbol_error": 65535,
        "port_rcv_errors": 65534,
        "link_downed": 255,
        "link_error_recovery": 254,
        "local_link_integrity_errors": 15,
        "excessive_buffer_overrun_errors": 14,
        "port_xmit_constraint_errors": 255,
        "VL15_dropped": 65535,
    }
    for name, value in values.items():
        write(counter_file(mlx5_ib_hca, "mlx5_0", 1, name), value)
    rows = by_name(mlx5_ib_hca("-j", "counters", "mlx5_0/1"))
    assert {name: rows[name]["saturated"] for name in values} == {
        "symbol_error": True,
        "port_rcv_errors": False,
        "link_downed": True,
        "link_error_recovery": False,
        "local_link_integrity_errors": True,
        "excessive_buffer_overrun_errors": False,
        "port_xmit_constraint_errors": True,
        "VL15_dropped": True,
    }


# -- 64-bit data and packet counters -----------------------------------------------------------


def test_a_data_counter_above_2_32_without_the_unicast_files_is_64_bit(hfi1_opa):
    # procfs hfi1_0: no unicast/multicast files, port_rcv_data 345091702026 words
    r = hfi1_opa("-j", "counters", "hfi1_0/1")
    assert r.code == 0 and r.warnings == []
    rows = by_name(r)
    assert rows["port_rcv_data"]["value"] == 345091702026 * 4
    assert not any(row["saturated"] for row in r.json)
    samples = samples_of(hfi1_opa, "hfi1_0", 1)
    # the kernel shows one table per port: the packet counters (below 2^32) are 64-bit too
    assert [samples[n].width for n in counterinfo.PMA_EXTENDED] == [64, 64, 64, 64]
    assert (samples["symbol_error"].width, samples["port_xmit_wait"].width) == (16, 32)


def test_one_data_counter_above_2_32_makes_the_port_table_64_bit(hfi1_opa):
    write(counter_file(hfi1_opa, "hfi1_0", 1, "port_xmit_packets"), U32_MAX)
    s = samples_of(hfi1_opa, "hfi1_0", 1)["port_xmit_packets"]
    assert (s.width, is_saturated(s)) == (64, False)


def test_without_proof_of_64_bits_a_data_counter_at_2_32_minus_1_is_saturated(hfi1_opa):
    for name in counterinfo.PMA_EXTENDED:
        write(counter_file(hfi1_opa, "hfi1_0", 1, name), 1000)
    write(counter_file(hfi1_opa, "hfi1_0", 1, "port_xmit_data"), U32_MAX)
    rows = by_name(hfi1_opa("-j", "counters", "hfi1_0/1"))
    assert rows["port_xmit_data"]["saturated"] is True


def test_rate_of_a_data_counter_above_2_32_is_its_throughput(hfi1_opa, between_samples):
    f = counter_file(hfi1_opa, "hfi1_0", 1, "port_xmit_data")
    between_samples(lambda: write(f, 273558326543 + 250_000_000))
    r = hfi1_opa("-j", "counters", "hfi1_0/1", "--rate")
    row = by_name(r)["port_xmit_data"]
    assert (row["rate_per_sec"], row["note"], row["saturated"]) == (1e9, None, False)


def test_data_counters_in_bytes_stay_exact_above_2_64(mlx5_ib_hca):
    write(counter_file(mlx5_ib_hca, "mlx5_0", 1, "port_rcv_data"), U64_MAX)
    row = by_name(mlx5_ib_hca("-j", "counters", "mlx5_0/1"))["port_rcv_data"]
    assert row["value"] == U64_MAX * 4 and row["saturated"] is True  # 64 bits, all ones
    assert "73786976294838206460" in mlx5_ib_hca("counters", "mlx5_0/1").out


# -- counters_ext (Mellanox OFED before 4.5) ----------------------------------------------------


def test_counters_ext_gives_the_64_bit_values_under_the_counters_names(mlx4_ofed_ib):
    r = mlx4_ofed_ib("-j", "counters", "mlx4_0/1")
    assert r.code == 0 and r.warnings == []
    names = [row["counter"] for row in r.json]
    assert len(names) == len(set(names)) and {row["source"] for row in r.json} == {"pma"}
    assert not [n for n in names if n.endswith("_64") or n.startswith(("port_uni", "port_multi"))]
    rows = by_name(r)
    # counters/port_xmit_data is stuck at 2^32-1; counters_ext/port_xmit_data_64 (procfs) wins
    assert counter_file(mlx4_ofed_ib, "mlx4_0", 1, "port_xmit_data").read_text() == "4294967295\n"
    assert (rows["port_xmit_data"]["value"], rows["port_xmit_data"]["saturated"]) == (
        26509113295 * 4,
        False,
    )
    assert rows["port_rcv_data"]["value"] == 2221223609 * 4
    assert rows["port_xmit_wait"]["value"] == 3599  # counters/ only
    # node_exporter's counters_ext/port_unicast_xmit_packets and port_multicast_rcv_packets
    assert (rows["unicast_xmit_packets"]["value"], rows["multicast_rcv_packets"]["value"]) == (
        61239,
        93,
    )
    widths = {n: s.width for n, s in samples_of(mlx4_ofed_ib, "mlx4_0", 1).items()}
    assert widths["port_xmit_data"] == widths["unicast_xmit_packets"] == 64


def test_counters_ext_rates_are_those_of_the_64_bit_counters(mlx4_ofed_ib, between_samples):
    f = counter_file(mlx4_ofed_ib, "mlx4_0", 1, "port_xmit_data_64", "counters_ext")
    between_samples(lambda: write(f, 26509113295 + 1_000_000))
    row = by_name(mlx4_ofed_ib("-j", "counters", "mlx4_0/1", "--rate"))["port_xmit_data"]
    assert (row["rate_per_sec"], row["note"]) == (4e6, None)


def test_a_64_bit_counters_table_wins_over_counters_ext(mlx4_ofed_ib):
    # node_exporter's mlx4_0 has both: counters/ with the unicast files (64-bit) and
    # port_rcv_packets 6825908347, counters_ext/port_rcv_packets_64 reading 0
    extended = {
        "port_rcv_packets": 6825908347,
        "unicast_xmit_packets": 61239,
        "unicast_rcv_packets": 61148,
        "multicast_xmit_packets": 16,
        "multicast_rcv_packets": 93,
    }
    for name, value in extended.items():
        write(counter_file(mlx4_ofed_ib, "mlx4_0", 1, name), value)
    write(counter_file(mlx4_ofed_ib, "mlx4_0", 1, "port_rcv_packets_64", "counters_ext"), 0)
    s = samples_of(mlx4_ofed_ib, "mlx4_0", 1)["port_rcv_packets"]
    assert (s.value, s.width) == (6825908347, 64)


def test_an_unavailable_counters_ext_file_leaves_its_counter_unknown(mlx4_ofed_ib):
    f = counter_file(mlx4_ofed_ib, "mlx4_0", 1, "port_xmit_data_64", "counters_ext")
    write(f, "N/A (no PMA)")
    r = mlx4_ofed_ib("-j", "counters", "mlx4_0/1")
    assert by_name(r)["port_xmit_data"]["value"] is None  # not the 32-bit 2^32-1
    assert r.warnings == [
        "ibtool: warning: mlx4_0/1: 1 PMA counters unavailable "
        "(counters_ext/port_xmit_data_64: N/A (no PMA))"
    ]


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


# -- values that are not counts -----------------------------------------------------------------


def test_a_negative_counter_is_warned_about_and_unknown(mlx5_ib_hca):
    write(counter_file(mlx5_ib_hca, "mlx5_0", 1, "port_xmit_discards"), -1)
    write(counter_file(mlx5_ib_hca, "mlx5_0", 1, "out_of_buffer", "hw_counters"), -3)
    r = mlx5_ib_hca("-j", "counters", "mlx5_0/1")
    assert r.code == 0
    assert r.warnings == [
        "ibtool: warning: mlx5_0/ports/1/counters/port_xmit_discards: negative value -1",
        "ibtool: warning: mlx5_0/ports/1/hw_counters/out_of_buffer: negative value -3",
    ]
    rows = by_name(r)
    assert rows["port_xmit_discards"]["value"] is None and rows["out_of_buffer"]["value"] is None
    assert rows["link_downed"]["value"] == 1 and rows["rx_write_requests"]["value"] == 811234
    errors = mlx5_ib_hca("-j", "counters", "mlx5_0/1", "--errors").json
    assert [row["counter"] for row in errors] == ["link_downed"]


@pytest.mark.parametrize("text", ["12abc", "1_000", "+5", "\u0663", "0x10", "1.5", ""])
def test_a_malformed_counter_warns_once_naming_the_file(mlx5_ib_hca, between_samples, text):
    f = counter_file(mlx5_ib_hca, "mlx5_0", 1, "out_of_buffer", "hw_counters")
    write(f, text)
    between_samples(lambda: write(f, text + "?"))  # still no count, and not the same text
    r = mlx5_ib_hca("-j", "counters", "mlx5_0/1", "--rate")
    assert r.code == 0
    assert r.warnings == [
        f"ibtool: warning: mlx5_0/ports/1/hw_counters/out_of_buffer: malformed value {text!r}"
    ]
    rows = by_name(r)
    assert (rows["out_of_buffer"]["value"], rows["out_of_buffer"]["note"]) == (None, "unknown")
    assert rows["port_xmit_data"]["value"] == 4873402938521 * 4 and len(rows) > 30


def test_a_count_above_2_64_minus_1_is_no_sysfs_counter(mlx5_ib_hca):
    write(counter_file(mlx5_ib_hca, "mlx5_0", 1, "symbol_error"), 1 << 64)
    r = mlx5_ib_hca("-j", "counters", "mlx5_0/1")
    assert by_name(r)["symbol_error"]["value"] is None
    assert r.warnings == [
        "ibtool: warning: mlx5_0/ports/1/counters/symbol_error: "
        "value 18446744073709551616 is above 2^64-1"
    ]

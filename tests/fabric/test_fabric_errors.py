"""`ibtool fabric errors` on a simulated fabric, counter for counter against ibqueryerrors and
perfquery: counters put in through ibsim's console (a symbol-error count at a leaf's port, xmit
discards at a spine's), thresholds from a file in infiniband-diags' format, the state between
runs, and hostile input."""

from __future__ import annotations

import json
import os

import pytest

from tests.fabric import oracle
from tests.fabric.test_fabric import diags, ibtool, said

# leaf01/1 is cabled to node001, spine01/2 to leaf02/4 (tests.fabric.ibsim.fat_tree)
SYMBOLS = ("leaf01", 1, "SymbolErrorCounter")
DISCARDS = ("spine01", 2, "PortXmitDiscards")


def put(sim, where, value: int) -> None:
    node, port, counter = where
    sim.console(f'PerformanceSet "{node}"[{port}] PortCounters.{counter}={value}')


def ours(sim, *argv) -> tuple[int, dict]:
    r = ibtool(sim, "-j", "fabric", "errors", *argv)
    assert r.returncode in (0, 1, 3), r.stderr
    return r.returncode, json.loads(r.stdout)


def over(answer: dict) -> dict[tuple[int, int], dict[str, int]]:
    return {
        (int(p["node_guid"], 16), p["port"]): {f["counter"]: f["value"] for f in p["findings"]}
        for p in answer["ports"]
        if p["findings"]
    }


@pytest.fixture
def faulted(counted):
    put(counted, SYMBOLS, 500)
    put(counted, DISCARDS, 150)
    yield counted
    put(counted, SYMBOLS, 0)
    put(counted, DISCARDS, 0)


def test_the_ports_over_their_thresholds_are_ibqueryerrors(faulted, tmp_path):
    code, answer = ours(faulted, "--no-state")
    theirs = oracle.queryerrors(diags_any(faulted, "ibqueryerrors"))
    assert over(answer) == theirs
    assert len(theirs) == 2 and code == 1  # Nagios' WARNING
    assert answer["status"] == "WARNING" and answer["unanswered"] == []
    # ibqueryerrors' "150 ports checked": the two faulted switches' and the CAs' read one by
    # one, the two clean switches' by their sum (AllPortSelect), as ibqueryerrors reads them
    assert len(answer["ports"]) == 2 * 36 + 6
    assert sorted((s["node"], s["ports"]) for s in answer["summed"]) == [
        ("leaf02", 36), ("spine02", 36)
    ]  # fmt: skip
    code, every = ours(faulted, "--no-state", "--all-ports")
    assert (code, len(every["ports"]), every["summed"]) == (1, 150, [])
    assert over(every) == theirs
    limits = tmp_path / "error_thresholds"
    limits.write_text("# raised for this fabric\nSymbolErrorCounter=600\nPortXmitDiscards = 0x10\n")
    code, answer = ours(faulted, "--no-state", "--thresholds", str(limits))
    theirs = oracle.queryerrors(
        diags_any(faulted, "ibqueryerrors", "--threshold-file", str(limits))
    )
    assert over(answer) == theirs
    assert list(theirs.values()) == [{"PortXmitDiscards": 150}]
    assert answer["thresholds"]["SymbolErrorCounter"] == 600


def test_each_ports_counters_are_perfquerys(faulted):
    """The error counters equal; the data counters count the MADs that crossed the port since
    (ours was read first), so theirs are as large or larger."""
    _, answer = ours(faulted, "--no-state", "--all-ports")
    ports = {(p["node"], p["port"]): p for p in answer["ports"]}
    data = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
    for node, port in (("leaf01", 1), ("spine01", 2), ("node003 mlx5_0", 1), ("leaf02", 4)):
        p = ports[node, port]
        theirs = oracle.perfquery(diags(faulted, "perfquery", str(p["lid"]), str(port)))
        extended = oracle.perfquery(diags(faulted, "perfquery", "-x", str(p["lid"]), str(port)))
        assert set(p["counters"]) == set(theirs) - {"PortSelect", "QP1Dropped"}
        for name, value in p["counters"].items():
            if name in data:
                assert 0 < value <= extended[name], (node, port, name)
            else:
                assert value == theirs[name], (node, port, name)


def test_the_text_names_the_cables_other_end_and_the_fix(faulted):
    r = ibtool(faulted, "fabric", "errors", "--no-state")
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert "WARNING leaf01/1 <-> node001 mlx5_0/1: SymbolErrorCounter 500" in lines
    assert "WARNING spine01/2 <-> leaf02/4: PortXmitDiscards 150" in lines
    assert any(line.startswith("SymbolErrorCounter: bit errors on the wire") for line in lines)
    assert lines[-1] == "2 of 150 ports over their thresholds, 2 of them to look at now"


def test_between_runs_only_what_grew_is_a_warning_and_a_cleared_counter_a_new_baseline(
    counted, tmp_path
):
    state = str(tmp_path / "fabric.json")
    code, answer = ours(counted, "--state", state)
    assert (code, answer["baseline"]) == (0, "first run: baseline taken")
    put(counted, SYMBOLS, 40)
    try:
        code, answer = ours(counted, "--state", state)
        (finding,) = [f for p in answer["ports"] for f in p["findings"]]
        assert code == 1 and (finding["value"], finding["delta"]) == (40, 40)
        code, answer = ours(counted, "--state", state)  # nothing new: listed, not alarmed
        (finding,) = [f for p in answer["ports"] for f in p["findings"]]
        assert code == 0 and (finding["status"], finding["delta"]) == ("OK", 0)
        put(counted, SYMBOLS, 7)  # cleared, and 7 since
        code, answer = ours(counted, "--state", state)
        (finding,) = [f for p in answer["ports"] for f in p["findings"]]
        assert code == 1 and (finding["value"], finding["delta"]) == (7, None)
    finally:
        put(counted, SYMBOLS, 0)


def test_a_saturated_counter_is_named_as_counting_no_more(counted):
    put(counted, SYMBOLS, 0xFFFF)  # PortCounters.SymbolErrorCounter is 16 bits
    try:
        r = ibtool(counted, "fabric", "errors", "--no-state")
        assert (
            "WARNING leaf01/1 <-> node001 mlx5_0/1: SymbolErrorCounter 65535 (saturated: it "
            "counts no more until cleared)"
        ) in r.stdout.splitlines()
    finally:
        put(counted, SYMBOLS, 0)


@pytest.mark.parametrize(
    "text, said_",
    [
        ("SymbolErrors=10\n", "'SymbolErrors' is not an error counter"),
        ("SymbolErrorCounter=ten\n", "'ten' is not a number"),
        ("SymbolErrorCounter=-1\n", "'-1' is not a number"),
    ],
)
def test_a_bad_thresholds_file_is_one_line_naming_the_line(counted, tmp_path, text, said_):
    limits = tmp_path / "t"
    limits.write_text("# ok\n" + text)
    r = ibtool(counted, "fabric", "errors", "--no-state", "--thresholds", str(limits))
    (line,) = said(r)
    assert r.returncode != 0 and r.stdout == ""
    assert line.startswith(f"ibtool: error: {limits}:2: {said_}")


def test_a_thresholds_path_that_is_no_file_is_refused_without_reading_it(counted, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = ibtool(counted, "fabric", "errors", "--no-state", "--thresholds", str(fifo))
    assert r.returncode == 7  # a DataError, as ibtool(8) says
    assert said(r) == [f"ibtool: error: thresholds {fifo}: not a regular file"]
    big = tmp_path / "big"
    big.write_text("#" * (70 << 10))
    r = ibtool(counted, "fabric", "errors", "--no-state", "--thresholds", str(big))
    assert said(r) == [f"ibtool: error: thresholds {big}: larger than 65536 bytes"]


def test_a_state_file_that_is_not_ours_is_replaced_with_a_warning(counted, tmp_path):
    state = tmp_path / "fabric.json"
    state.write_text('{"format": "something else"}')
    r = ibtool(counted, "fabric", "errors", "--state", str(state))
    assert r.returncode == 0, r.stderr
    assert said(r) == [
        f"ibtool: warning: state {state} is not an ibtool fabric errors state: replaced"
    ]
    assert json.loads(state.read_text())["checks"]["fabric_errors"]["data"]["ports"]


def test_the_state_options_are_for_errors_only(counted):
    r = ibtool(counted, "fabric", "links", "--no-state")
    assert r.returncode == 2 and "--no-state is for ibtool fabric errors" in r.stderr


def diags_any(sim, *argv) -> str:
    """An infiniband-diags tool that exits 1 when it found something (ibqueryerrors)."""
    r = sim.run(list(argv))
    assert r.returncode in (0, 1), r.stderr
    return r.stdout


def test_a_node_that_drops_every_mad_is_named_and_the_rest_read(tmp_path):
    """ibsim's `Error` drops MADs through a port: node004's HCA answers none, so the scan
    names the switch port whose far end did not answer, and errors reads every other port,
    each MAD bounded by --timeout and --retries."""
    from tests.fabric.conftest import SMALL, need_the_simulator
    from tests.fabric.ibsim import SimFabric

    need_the_simulator()
    with SimFabric(SMALL, tmp_path / "sim") as sim:
        sim.console('Error "node004 mlx5_0"[1] 100')
        r = ibtool(sim, "-j", "fabric", "errors", "--no-state", "--timeout", "50", "--retries",
                   "1", host="node003 mlx5_0")  # fmt: skip
        assert r.returncode == 0, r.stderr
        answer = json.loads(r.stdout)
        warned = said(r)
        assert "ibtool: warning: leaf02/1: up, and its far end did not answer" in warned
        assert any("libibnetdisc:" in w and "Connection timed out" in w for w in warned)
        assert "node004 mlx5_0" not in {p["node"] for p in answer["ports"]}
        assert {p["node"] for p in answer["ports"]} >= {"node001 mlx5_0", "node006 mlx5_0"}

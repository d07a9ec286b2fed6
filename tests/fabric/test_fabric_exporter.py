"""`ibtool exporter --fabric` on simulated fabrics: every port's series against perfquery,
iblinkinfo and ibnetdiscover on the same ports, the scrape through promtool, and a hostile node
description that must not break the exposition."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.fabric import oracle
from tests.fabric.test_fabric import CHECKOUT, IBTOOL, diags
from tests.fabric.test_fabric_errors import DISCARDS, SYMBOLS, put

DATA = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
NAMES = {  # PMA counter -> the family's name after the kind (treydock/infiniband_exporter's)
    "PortXmitData": "port_transmit_data_bytes",
    "PortRcvData": "port_receive_data_bytes",
    "PortXmitPkts": "port_transmit_packets",
    "PortRcvPkts": "port_receive_packets",
    "SymbolErrorCounter": "port_symbol_error",
    "LinkErrorRecoveryCounter": "port_link_error_recovery",
    "LinkDownedCounter": "port_link_downed",
    "PortRcvErrors": "port_receive_errors",
    "PortRcvRemotePhysicalErrors": "port_receive_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_receive_switch_relay_errors",
    "PortXmitDiscards": "port_transmit_discards",
    "PortXmitConstraintErrors": "port_transmit_constraint_errors",
    "PortRcvConstraintErrors": "port_receive_constraint_errors",
    "LocalLinkIntegrityErrors": "port_local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "port_excessive_buffer_overrun_errors",
    "VL15Dropped": "port_vl15_dropped",
    "PortXmitWait": "port_transmit_wait",
}


class Exporter:
    """`ibtool exporter --fabric` on node `host` of a simulated fabric; scraped until the
    fabric's series are there (a first scan ended and a poll took it), never a fixed sleep."""

    def __init__(self, sim, *args: str, host: str | None = None):
        env = sim.env(host)
        env["PYTHONPATH"] = CHECKOUT
        argv = [*IBTOOL, "exporter", "--listen", "127.0.0.1:0", "--interval", "1", "--fabric"]
        self.proc = subprocess.Popen(
            argv + list(args),
            env=env,
            cwd=sim.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("serving http://127.0.0.1:"):
            self.proc.kill()
            raise AssertionError(line + self.proc.communicate()[1])
        self.url = line.split()[1]

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=30) as reply:
            return reply.read().decode()

    def scanned(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            body = self.scrape()
            if "\nibtool_fabric_up " in body:
                return body
            assert time.monotonic() < deadline, "no fabric scan served within the deadline"
            time.sleep(0.1)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(30)


def samples(body: str) -> dict[str, dict[frozenset, float]]:
    """The scrape parsed by prometheus_client's parser: family -> labels -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, dict[frozenset, float]] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            found.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return found


def at(series: dict, **labels: str) -> float:
    want = set(labels.items())
    (value,) = [v for k, v in series.items() if want <= k]
    return value


@pytest.fixture(scope="module")
def scraped(counted):
    """One scan of the small tree with two error counters set, served and scraped, and the
    exporter stopped (its exit status kept); the counters put back after the module."""
    put(counted, SYMBOLS, 500)
    put(counted, DISCARDS, 150)
    try:
        exporter = Exporter(counted, "--fabric-interval", "3600")
        try:
            body = exporter.scanned()
        finally:
            code = exporter.stop()
        yield counted, body, code, exporter.proc.stderr.read()
    finally:
        put(counted, SYMBOLS, 0)
        put(counted, DISCARDS, 0)


def test_every_ports_counters_are_perfquerys(scraped):
    """The error counters equal perfquery's on the same port (LID and port of `ibnetdiscover
    -p`, the port named by its GUID there); the data counters (in bytes: 4 times the words
    perfquery -x gives) count the MADs that crossed the port since ours were read, so theirs
    are as large or larger."""
    sim, body, code, _ = scraped
    assert code == 143  # SIGTERM: the exporter and its fabric watch stopped
    got = samples(body)
    ports = oracle.ports(diags(sim, "ibnetdiscover", "-p"))
    kinds = {"SW": "switch", "CA": "hca"}
    wanted = [p for p in ports if p[0] == "CA"]  # every HCA port
    wanted += [p for p in ports if p[0] == "SW" and p[2] in (1, 2, 4, 30)]  # 4 of each switch
    for kind, lid, port, guid, _, _, far in wanted:
        theirs = oracle.perfquery(diags(sim, "perfquery", str(lid), str(port)))
        extended = oracle.perfquery(diags(sim, "perfquery", "-x", str(lid), str(port)))
        for name, suffix in NAMES.items():
            ours = at(got[f"ibtool_fabric_{kinds[kind]}_{suffix}_total"], guid=guid, port=str(port))
            if name in DATA:
                words = 4 if name in ("PortXmitData", "PortRcvData") else 1
                least = 1 if far is not None else 0  # a cabled port has moved MADs
                assert least <= ours <= extended[name] * words, (guid, port, name)
                assert ours % words == 0
            else:
                assert ours == theirs[name], (guid, port, name)
    assert len(wanted) == 6 + 4 * 4
    # the counters put in through ibsim's console, at the ports they were put on
    named = {d["description"]: g for g, d in oracle.nodes(diags(sim, "ibnetdiscover")).items()}
    leaf01, spine01 = named["leaf01"], named["spine01"]  # a switch's port GUID is its node's
    assert at(got["ibtool_fabric_switch_port_symbol_error_total"], guid=leaf01, port="1") == 500
    assert at(got["ibtool_fabric_switch_port_transmit_discards_total"], guid=spine01, port="2") == (
        150
    )
    # every port of the fabric has every counter: 4 switches of 36 ports, 6 HCAs
    assert len(got["ibtool_fabric_switch_port_vl15_dropped_total"]) == 4 * 36
    assert len(got["ibtool_fabric_hca_port_vl15_dropped_total"]) == 6


def test_every_ports_state_width_speed_and_far_end_are_ibnetdiscovers(scraped):
    sim, body, _, _ = scraped
    got = samples(body)
    ports = oracle.ports(diags(sim, "ibnetdiscover", "-p"))
    linked = oracle.linkinfo(diags(sim, "iblinkinfo", "--line"))
    kinds = {"SW": "switch", "CA": "hca"}
    for kind, _, port, guid, width, speed, far in ports:
        k, labels = kinds[kind], {"guid": guid, "port": str(port)}
        lanes = at(got[f"ibtool_fabric_{k}_port_width_lanes"], **labels)
        if far is None:  # no cable: no width, no far end
            assert lanes == 0
            assert not [v for v in got[f"ibtool_fabric_{k}_uplink_info"] if labels.items() <= v]
            continue
        lane = at(got[f"ibtool_fabric_{k}_port_speed_bytes_per_second"], **labels)
        assert (f"{lanes:g}x", LANES[lane * 8 / 1e9]) == (width, speed), (guid, port)
        state = linked[guid, port][2]
        assert at(got[f"ibtool_fabric_{k}_port_state_id"], **labels) == STATES[state]
        uplink = {
            "uplink_type": far[0], "uplink_lid": str(far[1]), "uplink_port": str(far[2]),
            "uplink_guid": far[3],
        }  # fmt: skip
        assert at(got[f"ibtool_fabric_{k}_uplink_info"], **labels, **uplink) == 1
        # the rate as treydock/infiniband_exporter gives it: 4X SDR, 8 Gb/s of data in 10
        rated = labels if k == "switch" else {"guid": guid}
        assert at(got[f"ibtool_fabric_{k}_{RATE[k]}_bytes_per_second"], **rated) == 4 * 2e9 / 8
    names = {d["description"] for d in oracle.nodes(diags(sim, "ibnetdiscover")).values()}
    ours = {dict(k).get("switch") for k in got["ibtool_fabric_switch_info"]}
    ours |= {dict(k).get("hca") for k in got["ibtool_fabric_hca_info"]}
    assert ours == names
    assert at(got["ibtool_fabric_up"]) == 1 and at(got["ibtool_fabric_scans_total"]) == 1
    assert at(got["ibtool_fabric_nodes"], type="SW") == 4
    assert at(got["ibtool_fabric_subnet_manager_state"]) == 3  # opensm, the master


LANES = {2.5: "SDR", 5.0: "DDR", 10.0: "QDR"}
STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
RATE = {"switch": "port_rate", "hca": "rate"}


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian: prometheus) missing")
def test_the_scrape_passes_promtool(scraped):
    _, body, _, _ = scraped
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_hostile_node_description_stays_a_label_value(odd):
    """ibsim's ODD fabric has an HCA whose description holds an ESC sequence: the exposition
    carries it as the label's value, parsed back the same, and promtool accepts it."""
    exporter = Exporter(odd, "--fabric-interval", "3600")
    try:
        body = exporter.scanned()
    finally:
        assert exporter.stop() == 143
    got = samples(body)
    hostile = "Hca4\x1b[31m red"
    assert hostile in {dict(k)["hca"] for k in got["ibtool_fabric_hca_info"]}
    assert hostile in {dict(k)["uplink"] for k in got["ibtool_fabric_switch_uplink_info"]}
    if shutil.which("promtool"):
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=body, capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr

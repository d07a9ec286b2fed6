"""`ibtool exporter --fabric`'s families, built from a FabricSeen: named and labelled as
treydock/infiniband_exporter's (under ibtool_fabric_), the data counters in bytes, hostile node
descriptions kept inside their label values, a failed scan seen as such, and the families
built once a scan, off the scrape."""

from __future__ import annotations

import pytest

from ibtool.live.exporter import FabricSeries, fabric_families
from ibtool.live.fabric import FabricSeen
from ibtool.model.fabric import (
    Fabric,
    FabricNode,
    FabricPort,
    NodeType,
    PortCounters,
    PortSpeed,
    SmState,
    SubnetManager,
)
from ibtool.model.records import PhysState, PortState
from ibtool.views.prometheus import exposition
from tests.unit.conftest import run_cli

SWITCH, HCA, HCA_PORT = 0x7CFE9003009CE5B0, 0x506B4B03005C2740, 0x506B4B03005C2741
EDR = PortSpeed(active=4, ext_active=2)  # LinkSpeedExtActive 2: EDR (IBTA 14.2.5.6)


def port(number, guid, lid, remote=None, state=PortState.ACTIVE, width=2):
    up = state != PortState.DOWN
    return FabricPort(
        number, guid, lid, 0, state, PhysState.LINK_UP if up else PhysState.POLLING,
        width_active=width if up else 0, speed=EDR if up else PortSpeed(), remote=remote,
    )  # fmt: skip


def fabric(switch_name="leaf01", hca_name="node001 mlx5_0") -> Fabric:
    switch = FabricNode(
        SWITCH, NodeType.SWITCH, switch_name, 2,
        {0: port(0, SWITCH, 7), 1: port(1, SWITCH, 7, (HCA, 1)),
         2: port(2, SWITCH, 7, state=PortState.DOWN)},
    )  # fmt: skip
    hca = FabricNode(HCA, NodeType.CA, hca_name, 1, {1: port(1, HCA_PORT, 12, (SWITCH, 1))})
    return Fabric({SWITCH: switch, HCA: hca}, local=(HCA, 1))


def counters(**values) -> dict:
    base = {"SymbolErrorCounter": 0, "PortXmitData": 1000, "PortRcvData": 10, "PortXmitWait": 3}
    base.update(values)
    bits = {n: 64 if n.endswith("Data") else 16 for n in base}
    return {
        (SWITCH, 1): PortCounters(SWITCH, 1, 7, dict(base), bits),
        (SWITCH, 2): PortCounters(SWITCH, 2, 7, {n: 0 for n in base}, bits),
        (HCA, 1): PortCounters(HCA, 1, 12, dict(base), bits),
    }


def seen(f=None, **kw) -> FabricSeen:
    kw.setdefault("number", 3)
    return FabricSeen(time=1795000000.0, duration=1.5, fabric=f, mads=420, **kw)


def lines(families) -> list[str]:
    return exposition(families).splitlines()


def test_the_families_are_treydocks_under_the_ibtool_fabric_prefix():
    out = lines(fabric_families(seen(fabric(), counters=counters(SymbolErrorCounter=500))))
    g, h = '"0x7cfe9003009ce5b0"', '"0x506b4b03005c2741"'  # the HCA by its port's GUID
    for line in (
        f'ibtool_fabric_switch_info{{guid={g},lid="7",switch="leaf01"}} 1.0',
        f'ibtool_fabric_switch_port_symbol_error_total{{guid={g},port="1"}} 500.0',
        f'ibtool_fabric_switch_port_symbol_error_total{{guid={g},port="2"}} 0.0',
        # 4-byte words, in bytes
        f'ibtool_fabric_switch_port_transmit_data_bytes_total{{guid={g},port="1"}} 4000.0',
        f'ibtool_fabric_switch_port_receive_data_bytes_total{{guid={g},port="1"}} 40.0',
        f'ibtool_fabric_switch_port_transmit_wait_total{{guid={g},port="1"}} 3.0',
        # 4X EDR: the values of treydock/infiniband_exporter's own test
        f'ibtool_fabric_switch_port_rate_bytes_per_second{{guid={g},port="1"}} 1.25e+10',
        f'ibtool_fabric_switch_port_raw_rate_bytes_per_second{{guid={g},port="1"}} 1.2890625e+10',
        f'ibtool_fabric_switch_uplink_info{{guid={g},port="1",switch="leaf01",'
        f'uplink="node001 mlx5_0",uplink_guid={h},uplink_lid="12",uplink_port="1",'
        'uplink_type="CA"} 1.0',
        f'ibtool_fabric_switch_port_state_id{{guid={g},port="2"}} 1.0',
        f'ibtool_fabric_switch_port_physical_state_id{{guid={g},port="2"}} 2.0',
        f'ibtool_fabric_switch_port_width_lanes{{guid={g},port="1"}} 4.0',
        f'ibtool_fabric_switch_port_width_lanes{{guid={g},port="2"}} 0.0',
        f'ibtool_fabric_switch_port_speed_bytes_per_second{{guid={g},port="1"}} 3.22265625e+09',
        f'ibtool_fabric_hca_info{{guid={h},hca="node001 mlx5_0",lid="12"}} 1.0',
        f"ibtool_fabric_hca_rate_bytes_per_second{{guid={h}}} 1.25e+10",
        f'ibtool_fabric_hca_port_transmit_data_bytes_total{{guid={h},port="1"}} 4000.0',
        "ibtool_fabric_up 1.0",
        "ibtool_fabric_scans_total 3.0",
        "ibtool_fabric_scan_mads 420.0",
        "ibtool_fabric_scan_duration_seconds 1.5",
        "ibtool_fabric_last_scan_timestamp_seconds 1.795e+09",
        'ibtool_fabric_nodes{type="CA"} 1.0',
    ):
        assert line in out, line
    assert "# TYPE ibtool_fabric_switch_port_symbol_error_total counter" in out
    assert "# TYPE ibtool_fabric_switch_port_state_id gauge" in out
    # the management port has no series, a port down no rate and no far end
    assert not [x for x in out if 'port="0"' in x]
    assert not [x for x in out if "_rate_" in x and 'port="2"' in x]
    assert not [x for x in out if "uplink_info" in x and 'port="2"' in x]
    assert not [x for x in out if x.startswith("ibtool_fabric_router")]


def test_the_subnet_managers_state_with_its_priority():
    f = fabric()
    sm = SubnetManager(f.nodes[HCA], 1, 12, HCA_PORT, 14, SmState.MASTER, 900)
    out = lines(fabric_families(seen(f, sms=_sms(sm))))
    assert (
        'ibtool_fabric_subnet_manager_state{guid="0x506b4b03005c2741",lid="12",'
        'node="node001 mlx5_0",port="1",priority="14"} 3.0'
    ) in out


def _sms(*sms):
    from ibtool.model.fabric import SmScan

    return SmScan(list(sms), [], 12, None, 0.0)


@pytest.mark.parametrize(
    "description",
    [
        'sw"} 1\nibtool_fabric_up 0\nevil{a="',  # a sample of its own, were it not escaped
        "back\\slash\\",
        "Hca4\x1b[31m red\r\t",
        "\u00e9t\u00e9 \ufffd",  # what a description that is not UTF-8 decodes to
    ],
)
def test_a_hostile_node_description_stays_inside_its_label_value(description):
    from prometheus_client.parser import text_string_to_metric_families

    text = exposition(fabric_families(seen(fabric(switch_name=description), counters=counters())))
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    (info,) = parsed["ibtool_fabric_switch_info"].samples
    assert info.labels["switch"] == description
    (up,) = parsed["ibtool_fabric_up"].samples
    assert up.value == 1.0 and "evil" not in parsed
    uplinks = parsed["ibtool_fabric_hca_uplink_info"].samples
    assert [s.labels["uplink"] for s in uplinks] == [description]


def test_a_failed_scan_serves_its_own_figures_up_0_and_no_port():
    out = lines(fabric_families(seen(error="no InfiniBand port here")))
    assert "ibtool_fabric_up 0.0" in out
    assert "ibtool_fabric_scans_total 3.0" in out
    assert not [x for x in out if "_port_" in x or "_info" in x]


class Watch:
    def __init__(self):
        self.latest, self.started = None, 0

    def start(self):
        self.started += 1


def test_the_series_are_written_once_a_scan_and_none_before_the_first():
    watch, warned = Watch(), []
    series = FabricSeries(watch, warned.append)
    assert watch.started == 0
    series.refresh()  # after the first poll: the scans begin
    assert series.text() == b"" and series.families() == []  # no scan ended yet: nothing
    watch.latest = seen(fabric(), counters=counters())
    series.refresh()
    first = series.text()
    assert first == exposition(fabric_families(watch.latest)).encode()
    series.refresh()
    assert series.text() is first  # the same scan: not written again
    broken = seen(fabric(), counters=counters(), number=4)
    object.__setattr__(broken, "counters", {(SWITCH, 1): "not counters"})
    watch.latest = broken
    series.refresh()
    assert series.text() is first and warned == [
        "fabric: scan 4 not served: AttributeError: 'str' object has no attribute 'port'"
    ]
    watch.latest = seen(error="discovery failed", number=5)
    series.refresh()
    assert "ibtool_fabric_up 0.0" in series.text().decode().splitlines()
    assert warned[-1] == "fabric: discovery failed" and watch.started == 1


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--fabric-interval", "30"], "--fabric-interval needs --fabric"),
        (["--fabric-via", "mlx5_0/1"], "--fabric-via needs --fabric"),
        (["--fabric", "--fabric-mads", "5"], "--fabric-mads"),
        (["--fabric", "--fabric-interval", "0"], "--fabric-interval"),
        (["--fabric", "--fabric-retries", "21"], "--fabric-retries"),
    ],
)
def test_fabric_options_out_of_range_or_without_fabric_are_usage_errors(tmp_path, argv, said):
    from tests.fixtures import sysfs_trees

    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    got = run_cli(["--root", str(root), "exporter", "--listen", "127.0.0.1:0", *argv])
    assert got.code == 2 and said in got.err, got.err


@pytest.mark.parametrize(
    "accept", ["", "application/openmetrics-text; version=1.0.0", "text/plain; version=1.0.0"]
)
def test_a_scrape_serves_the_fabric_as_written_once_between_the_polls_and_the_servers(accept):
    """The answer a scrape gets, the fabric's part copied as written once for its scan, is what
    the encoder the scraper asks for writes of every family in the same order
    (prometheus_client's process_* series aside: they move between two reads); with name[],
    the families asked for."""
    from prometheus_client.exposition import choose_encoder

    from ibtool.live.exporter import Endpoint, Latest

    watch = Watch()
    watch.latest = seen(fabric(), counters=counters())
    series = FabricSeries(watch, print)
    series.refresh()
    latest = Latest()
    latest.store([], 1795000000.0, 0.25)
    stats = {"connections": 1, "in_flight": 1, "accepted": 1, "responses": {}, "closed": {}}
    endpoint = Endpoint(latest, lambda: stats, None, series)
    for _ in range(2):  # the second answer from the text written for the first
        body, content_type = endpoint.metrics(accept, None)
        encoder, expected_type = choose_encoder(accept)
        whole = _whole(encoder, endpoint.families())

        def mine(text: bytes) -> list[str]:
            return [x for x in text.decode().splitlines() if "process_" not in x]

        assert mine(body) == mine(whole) and content_type == expected_type
        assert b"ibtool_fabric_switch_info" in body
    only, _ = endpoint.metrics("", ["ibtool_fabric_up"])
    assert only.decode().splitlines() == [
        "# HELP ibtool_fabric_up Whether the last fabric scan read the subnet (0: it failed)",
        "# TYPE ibtool_fabric_up gauge",
        "ibtool_fabric_up 1.0",
    ]


def _whole(encoder, families) -> bytes:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    if encoder is generate_latest:
        return exposition(families).encode()

    class Collector:
        def collect(self):
            for f in families:
                kind = CounterMetricFamily if f.type == "counter" else GaugeMetricFamily
                names = sorted({k for s in f.samples for k in s.labels})
                out = kind(f.name, f.documentation, labels=names)
                for labels, value in f.samples:
                    out.add_metric([labels.get(n, "") for n in names], value)
                yield out

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return encoder(registry)


def test_a_root_tree_has_no_fabric_and_says_so_as_a_failed_scan_beside_the_hosts_series(tmp_path):
    """A captured tree holds no fabric: the exporter serves the host as ever and the scan's
    failure as ibtool_fabric_up 0 (its error a warning), and stops on SIGTERM with its watch."""
    from tests.fixtures import sysfs_trees
    from tests.unit.test_exporter import request, start_exporter, stop_exporter, wait_until

    root = sysfs_trees.build("mlx5_ib_hca", tmp_path / "root")
    proc, url = start_exporter(root, "--fabric")
    try:
        wait_until(lambda: b"\nibtool_fabric_up " in request(url)[2], "a fabric scan served")
        body = request(url)[2].decode()
    finally:
        stop_exporter(proc)
    assert "\nibtool_fabric_up 0.0\n" in body and "ibtool_health_status" in body
    assert "ibtool_fabric_switch" not in body
    assert "fabric" in proc.stderr.read()

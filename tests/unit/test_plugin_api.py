"""The plugin API as a plugin author meets it: the hooks collected, their functions run with
faults isolated, and the types (ibtool.api) written exactly as Nagios and Prometheus read them."""

from __future__ import annotations

import importlib
import io
import json
import math
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ibtool import hookimpl
from ibtool.api import (
    CheckContext,
    HealthResult,
    MetricFamily,
    Perfdata,
    Status,
    exposition,
)
from ibtool.cli import main
from ibtool.errors import NotFoundError
from ibtool.host import Host
from ibtool.model.records import PortState
from ibtool.plugin.hooks import (
    collect_metrics,
    health_checks,
    metric_collectors,
    panel_factories,
    run_health_checks,
)
from ibtool.plugin.manager import build_plugins
from tests.conftest import under_ci
from tests.fixtures import sysfs_trees

HOOKS = ["ibtool_health_checks", "ibtool_metrics", "ibtool_register_commands", "ibtool_tui_panels"]


class Panel:
    """What a panel factory returns here: textual stays out of the unit tests."""

    def __init__(self, feed) -> None:
        self.feed = feed


def make_api_plugin():
    """A plugin using every hook: a command, a health check, a metric collector, a panel."""
    plugin = types.ModuleType("api_plugin")

    def port_states(ctx):
        for port in ctx.host.ports():
            subject = f"{port.device}/{port.port}"
            if port.state is None:
                yield HealthResult(Status.UNKNOWN, subject, "state unreadable")
            elif port.state is PortState.ACTIVE:
                rate = Perfdata("rate Gb/s", port.rate.gbps, warn="100:", min=0)
                yield HealthResult(Status.OK, subject, "ACTIVE", (rate,))
            else:
                yield HealthResult(Status.CRITICAL, subject, port.state.name)

    def port_metrics(host):
        rate = MetricFamily("ibtool_port_rate", "Signalling rate", "gauge", "bits_per_second")
        received = MetricFamily("ibtool_port_rcv_data_total", "Data received", "counter", "bytes")
        for port in host.ports():
            labels = {"device": port.device, "port": str(port.port)}
            if port.rate is not None:
                rate.add(labels, port.rate.gbps * 1e9)
        for c in host.counters():
            if c.name == "port_rcv_data":
                received.add({"device": c.device, "port": str(c.port)}, c.value * c.scale)
        return [rate, received]

    def hello(inv):
        inv.print("hello from api_plugin")

    @hookimpl
    def ibtool_register_commands(cli):
        cli.add("api-hello", hello, help="say hello")

    @hookimpl
    def ibtool_health_checks(register):
        register("port_state", port_states)

    @hookimpl
    def ibtool_metrics(register):
        register("api_port", port_metrics)

    @hookimpl
    def ibtool_tui_panels(register):
        register("ports", Panel)

    plugin.ibtool_register_commands = ibtool_register_commands
    plugin.ibtool_health_checks = ibtool_health_checks
    plugin.ibtool_metrics = ibtool_metrics
    plugin.ibtool_tui_panels = ibtool_tui_panels
    return plugin


def make_plugin(name: str, **hooks):
    """A plugin module `name` with the hook implementations given by keyword."""
    plugin = types.ModuleType(name)
    for hook, function in hooks.items():
        setattr(plugin, hook, hookimpl(function))
    return plugin


@pytest.fixture
def host(tmp_path) -> Host:
    """mlx5_0/1 ACTIVE next to mlx4_0/1, whose state file is garbage."""
    return Host(root=str(sysfs_trees.build("broken_device", tmp_path)))


def _theirs(entries: dict) -> dict:
    """What the plugins under test registered, without ibtool's own checks and collectors."""
    return {
        name: entry
        for name, entry in entries.items()
        if not getattr(entry, "__module__", "").startswith("ibtool_plugins.")
    }


def collect(*extra):
    warnings: list[str] = []
    plugins = build_plugins(extra=extra, warn=warnings.append)
    found = {
        "checks": _theirs(health_checks(plugins, warnings.append)),
        "metrics": _theirs(metric_collectors(plugins, warnings.append)),
        "panels": _theirs(panel_factories(plugins, warnings.append)),
    }
    return found, warnings


# -- the hooks, collected -----------------------------------------------------------------------


def test_the_core_collects_what_every_hook_registers(host):
    found, warnings = collect(make_api_plugin())
    assert warnings == []
    assert {k: list(v) for k, v in found.items()} == {
        "checks": ["port_state"],
        "metrics": ["api_port"],
        "panels": ["ports"],
    }
    from ibtool.live.feed import Feed

    feed = Feed(lambda: host, live=False, source="test")
    panel = found["panels"]["ports"](feed)
    assert isinstance(panel, Panel) and panel.feed is feed


def test_the_plugin_command_runs_and_plugins_lists_its_four_hooks():
    out, err = io.StringIO(), io.StringIO()
    assert main(["api-hello"], plugins=[make_api_plugin()], stdout=out, stderr=err) == 0
    assert (out.getvalue(), err.getvalue()) == ("hello from api_plugin\n", "")
    out = io.StringIO()
    assert main(["-j", "plugins"], plugins=[make_api_plugin()], stdout=out) == 0
    listed = {p["name"]: p["hooks"] for p in json.loads(out.getvalue())}
    assert listed["api_plugin"] == HOOKS
    assert listed["gids"] == ["ibtool_register_commands"]


def context(host):
    """The CheckContext factory run_health_checks takes: the same host for every check."""
    return lambda name: CheckContext(host, config=None)


def test_health_check_results_carry_the_check_name(host):
    found, _ = collect(make_api_plugin())
    assert run_health_checks(found["checks"], context(host)) == [
        HealthResult(Status.UNKNOWN, "mlx4_0/1", "state unreadable", check="port_state"),
        HealthResult(
            Status.OK,
            "mlx5_0/1",
            "ACTIVE",
            (Perfdata("rate Gb/s", 100.0, warn="100:", min=0),),
            check="port_state",
        ),
    ]


def test_metrics_of_the_plugin_in_the_text_format(host):
    found, _ = collect(make_api_plugin())
    warnings: list[str] = []
    families = collect_metrics(found["metrics"], host, warnings.append)
    assert warnings == []
    assert exposition(families) == (
        "# HELP ibtool_port_rate_bits_per_second Signalling rate\n"
        "# TYPE ibtool_port_rate_bits_per_second gauge\n"
        'ibtool_port_rate_bits_per_second{device="mlx5_0",port="1"} 1e+11\n'
        "# HELP ibtool_port_rcv_data_bytes_total Data received\n"
        "# TYPE ibtool_port_rcv_data_bytes_total counter\n"
        'ibtool_port_rcv_data_bytes_total{device="mlx5_0",port="1"} 3.89364480004e+11\n'
    )


# -- a broken plugin costs itself only ------------------------------------------------------------


def _boom(register):
    register("early", lambda host: [])
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("hook", "register", "warning"),
    [
        (
            "ibtool_health_checks",
            _boom,
            "plugin bad failed to register health checks: RuntimeError: boom",
        ),
        (
            "ibtool_metrics",
            lambda register: (register("mine", lambda host: []), register("mine", print)),
            "plugin bad failed to register metric collectors: "
            "ValueError: metric collector mine already registered by plugin bad",
        ),
        (
            "ibtool_metrics",
            lambda register: register("rate", 42),
            "plugin bad failed to register metric collectors: "
            "ValueError: metric collector rate is not callable: int",
        ),
        (
            "ibtool_tui_panels",
            lambda register: register("my panel", Panel),
            "plugin bad failed to register panels: "
            "ValueError: panel name must be a non-empty str without spaces: 'my panel'",
        ),
    ],
)
def test_a_bad_registration_is_one_warning_and_the_rest_comes_through(hook, register, warning):
    found, warnings = collect(make_plugin("bad", **{hook: register}), make_api_plugin())
    assert warnings == [warning]
    assert {k: {n: f.__name__ for n, f in v.items()} for k, v in found.items()} == {
        "checks": {"port_state": "port_states"},
        "metrics": {"api_port": "port_metrics"},
        "panels": {"ports": "Panel"},
    }


def _raises(ctx):
    raise RuntimeError("check blew up\non two lines")


def _half_generator(host):
    yield HealthResult(Status.OK, "", "fine so far")
    raise KeyError("mlx9_0")


def _bare(host):
    raise ValueError


def _unknown_device(host):
    raise NotFoundError("unknown device 'mlx9_0'", "devices here: mlx5_0")


@pytest.mark.parametrize(
    ("check", "summary"),
    [
        (_raises, "RuntimeError: check blew up on two lines"),
        (_half_generator, "KeyError: 'mlx9_0'"),
        (lambda ctx: 1 / 0, "ZeroDivisionError: division by zero"),
        (lambda ctx: [][0], "IndexError: list index out of range"),
        (_bare, "ValueError"),
        (_unknown_device, "unknown device 'mlx9_0'"),
        (lambda ctx: [42], "the check returned int, not ibtool.api.HealthResult"),
        (lambda ctx: None, "the check returned NoneType, not a list of ibtool.api.HealthResult"),
        (lambda ctx: "OK", "the check returned str, not a list of ibtool.api.HealthResult"),
        (
            lambda host: HealthResult(Status.OK, "", "one, not a list"),
            "the check returned HealthResult, not a list of ibtool.api.HealthResult",
        ),
        (
            lambda host: [HealthResult(Status.OK, "", "fine"), "and garbage"],
            "the check returned str, not ibtool.api.HealthResult",
        ),
    ],
)
def test_a_failing_check_is_one_unknown_result_and_the_others_run(host, check, summary):
    bad = make_plugin("bad", ibtool_health_checks=lambda register: register("broken", check))
    found, warnings = collect(make_api_plugin(), bad)
    assert list(found["checks"]) == ["broken", "port_state"] and warnings == []
    results = run_health_checks(found["checks"], context(host))
    assert results[0] == HealthResult(Status.UNKNOWN, "", summary, check="broken")
    assert [(r.check, r.subject, r.status) for r in results[1:]] == [
        ("port_state", "mlx4_0/1", Status.UNKNOWN),
        ("port_state", "mlx5_0/1", Status.OK),
    ]


@pytest.mark.parametrize(
    ("collector", "warning"),
    [
        (_raises, "metric collector rogue failed: RuntimeError: check blew up on two lines"),
        (
            lambda host: [MetricFamily("ok", "", "gauge"), 3],
            "metric collector rogue returned int, not ibtool.api.MetricFamily",
        ),
        (
            lambda host: {},
            "metric collector rogue returned dict, not a list of ibtool.api.MetricFamily",
        ),
        (
            lambda host: [MetricFamily("ibtool_port_rate_bits_per_second", "again", "gauge")],
            "metric collector rogue: ibtool_port_rate_bits_per_second already collected by "
            "api_port",
        ),
    ],
)
def test_a_failing_metric_collector_is_one_warning_and_the_others_collect(host, collector, warning):
    bad = make_plugin("bad", ibtool_metrics=lambda register: register("rogue", collector))
    found, warnings = collect(make_api_plugin(), bad)
    assert list(found["metrics"]) == ["api_port", "rogue"] and warnings == []
    families = collect_metrics(found["metrics"], host, warnings.append)
    assert warnings == [warning]
    assert [f.exposed_name for f in families] == [
        "ibtool_port_rate_bits_per_second",
        "ibtool_port_rcv_data_bytes_total",
    ]


# -- Status and perfdata: the Nagios Plugin Development Guidelines --------------------------------


def test_status_values_are_the_nagios_exit_codes():
    assert [(s.name, int(s)) for s in Status] == [
        ("OK", 0),
        ("WARNING", 1),
        ("CRITICAL", 2),
        ("UNKNOWN", 3),
    ]


@pytest.mark.parametrize(
    ("statuses", "worst"),
    [
        ([], Status.OK),
        ([Status.OK, Status.OK], Status.OK),
        ([Status.OK, Status.UNKNOWN], Status.UNKNOWN),
        ([Status.UNKNOWN, Status.WARNING, Status.OK], Status.WARNING),
        ([Status.CRITICAL, Status.UNKNOWN, Status.WARNING], Status.CRITICAL),
    ],
)
def test_worst_status_ranks_critical_warning_unknown_ok(statuses, worst):
    assert Status.worst(statuses) is worst


@pytest.mark.parametrize(
    ("perfdata", "text"),
    [
        (Perfdata("time", 0.006, "s"), "time=0.006s"),
        (Perfdata("time", 0.006, "s", 1, 2, 0), "time=0.006s;1;2;0"),
        (Perfdata("users", 3, warn=None, crit=10), "users=3;;10"),
        (Perfdata("used", 2643, "MB", 5948, 5958, 0, 5968), "used=2643MB;5948;5958;0;5968"),
        (Perfdata("load", 2.0, min=0), "load=2;;;0"),
        (Perfdata("loss", 12.5, "%", "~:10", "@20:30"), "loss=12.5%;~:10;@20:30"),
        (Perfdata("tiny", 1e-05, "us", max=1e16), "tiny=0.00001us;;;;10000000000000000"),
        (Perfdata("rx bytes", 5, "c"), "'rx bytes'=5c"),
        (Perfdata("a=b", -1.5), "'a=b'=-1.5"),
        (Perfdata("port's rate", 100, "B", "10:"), "'port''s rate'=100B;10:"),
    ],
)
def test_perfdata_text(perfdata, text):
    assert perfdata.text() == text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"label": "", "value": 1}, "perfdata label must be one non-empty line, not ''"),
        (
            {"label": "t", "value": 1, "unit": "GB"},
            "perfdata t: unit 'GB' is not '' nor s, ms, us, %, B, KB, MB, TB, c",
        ),
        (
            {"label": "t", "value": 1, "unit": "sec"},
            "perfdata t: unit 'sec' is not '' nor s, ms, us, %, B, KB, MB, TB, c",
        ),
        ({"label": "t", "value": "1"}, "perfdata t: value must be an int or float, not str"),
        ({"label": "t", "value": True}, "perfdata t: value must be an int or float, not bool"),
        ({"label": "t", "value": math.nan}, "perfdata t: value must be finite, not nan"),
        (
            {"label": "t", "value": 1, "warn": "10-20"},
            "perfdata t: warn '10-20' is not a Nagios range ([@]start:end)",
        ),
        (
            {"label": "t", "value": 1, "crit": ""},
            "perfdata t: crit '' is not a Nagios range ([@]start:end)",
        ),
        ({"label": "t", "value": 1, "max": math.inf}, "perfdata t: max must be finite, not inf"),
    ],
)
def test_bad_perfdata_is_a_value_error(kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        Perfdata(**kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1, "", "ok"), "status must be an ibtool.api.Status, not 1"),
        ((Status.OK, "", ""), "summary must be one non-empty line, not ''"),
        ((Status.OK, "", "ok", ("x=1",)), "perfdata must be ibtool.api.Perfdata items, not 'x=1'"),
    ],
)
def test_bad_health_result_is_a_value_error(args, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        HealthResult(*args)


def test_names_in_a_result_are_escaped_not_refused():
    # a device renamed with a newline or ESC (the kernel refuses only '/') is a subject
    # like any other: shown on its one line, never a forged one
    r = HealthResult(Status.OK, "mlx5\nok: fake/1", "ACTIVE on eth\x1b[31m0\u202e", ())
    assert (r.subject, r.summary) == ("mlx5\\nok: fake/1", "ACTIVE on eth\\x1b[31m0\\u202e")
    p = Perfdata("mlx5\r/1 rate Gb/s", 100)
    assert p.label == "mlx5\\r/1 rate Gb/s" and "\r" not in p.text()


# -- metric families and the text format: the Prometheus data model -----------------------------


def test_counter_name_loses_total_and_gains_its_unit():
    assert MetricFamily("rx_total", "", "counter").name == "rx"
    assert MetricFamily("rx_total", "", "counter", "bytes").name == "rx_bytes"
    assert MetricFamily("rx_bytes_total", "", "counter", "bytes").name == "rx_bytes"
    assert MetricFamily("rx_bytes_total", "", "counter", "bytes").exposed_name == "rx_bytes_total"
    assert MetricFamily("up_total", "", "gauge").exposed_name == "up_total"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("0rx", "", "gauge"), "bad metric name '0rx'"),
        (("rx-bytes", "", "gauge"), "bad metric name 'rx-bytes'"),
        (("", "", "gauge"), "bad metric name ''"),
        (("_total", "", "counter"), "bad metric name ''"),
        (("rx\n", "", "gauge"), "bad metric name 'rx\\n'"),
        (("rx", "", "histogram"), "metric rx: type 'histogram' is not one of ('counter', 'gauge')"),
        (("rx", "", "gauge", "Bytes/s"), "metric rx: bad unit 'Bytes/s'"),
        (("rx", None, "gauge"), "metric rx: documentation must be a str"),
    ],
)
def test_bad_metric_family_is_a_value_error(args, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        MetricFamily(*args)


@pytest.mark.parametrize(
    ("labels", "value", "message"),
    [
        ({"0port": "1"}, 1, "metric rx: bad label name '0port'"),
        ({"port-no": "1"}, 1, "metric rx: bad label name 'port-no'"),
        ({"a:b": "1"}, 1, "metric rx: bad label name 'a:b'"),
        ({"__name__": "x"}, 1, "metric rx: label __name__ is reserved (__ prefix)"),
        ({"port": 1}, 1, "metric rx: label port must be a str, not 1"),
        ({}, "1", "metric rx: value must be an int or float, not '1'"),
        ({"port": "1"}, 2, "metric rx: series {'port': '1'} added twice"),
    ],
)
def test_bad_sample_is_a_value_error(labels, value, message):
    family = MetricFamily("rx", "", "gauge")
    family.add({"port": "1"}, 1)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        family.add(labels, value)
    assert len(family.samples) == 1


def escaping_families() -> list[MetricFamily]:
    counter = MetricFamily("ibtool_rx_total", 'Help with \\ and "quotes"\nand a line', "counter")
    counter.add({"port": "1", "device": 'a"b\\c\nd'}, 7)
    gauge = MetricFamily("ibtool_values", "", "gauge")
    values = [0, -0.0, 1, 1.5, 1e-9, 1234567.0, 12345678, -12345678.0, 2**53, 1e22]
    for i, value in enumerate([*values, math.inf, -math.inf, math.nan]):
        gauge.add({"i": str(i)}, value)
    return [counter, gauge, MetricFamily("ibtool_none", "no samples", "counter")]


EXPOSITION = r"""# HELP ibtool_rx_total Help with \\ and "quotes"\nand a line
# TYPE ibtool_rx_total counter
ibtool_rx_total{device="a\"b\\c\nd",port="1"} 7.0
# HELP ibtool_values {EMPTY}
# TYPE ibtool_values gauge
ibtool_values{i="0"} 0.0
ibtool_values{i="1"} -0.0
ibtool_values{i="2"} 1.0
ibtool_values{i="3"} 1.5
ibtool_values{i="4"} 1e-09
ibtool_values{i="5"} 1.234567e+06
ibtool_values{i="6"} 1.2345678e+07
ibtool_values{i="7"} -12345678.0
ibtool_values{i="8"} 9.007199254740992e+15
ibtool_values{i="9"} 1e+22
ibtool_values{i="10"} +Inf
ibtool_values{i="11"} -Inf
ibtool_values{i="12"} NaN
# HELP ibtool_none_total no samples
# TYPE ibtool_none_total counter
""".replace("{EMPTY}", "")  # a HELP line with no text still has the space after the name


def test_exposition_escapes_and_formats_as_the_text_format_says():
    assert exposition(escaping_families()) == EXPOSITION
    assert exposition([]) == ""


def test_exposition_is_what_prometheus_client_writes():
    try:
        from prometheus_client import generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.registry import CollectorRegistry
    except ImportError:
        reason = "prometheus_client is not installed (pip install prometheus_client)"
        if under_ci():
            pytest.fail(f"{reason}: under CI=true the comparison may not skip")
        pytest.skip(reason)

    families = escaping_families()

    class Collector:
        def collect(self):
            for f in families:
                kind = CounterMetricFamily if f.type == "counter" else GaugeMetricFamily
                theirs = kind(f.name, f.documentation, unit=f.unit)
                for labels, value in f.samples:
                    theirs.add_sample(f.exposed_name, dict(labels), value)
                yield theirs

    registry = CollectorRegistry()
    registry.register(Collector())
    assert exposition(families) == generate_latest(registry).decode()


# -- cheap to import ----------------------------------------------------------------------------


def test_ibtool_api_imports_no_plugin_machinery_nor_the_host():
    probe = (
        "import sys, json; import ibtool.api; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ibtool', 'pluggy', 'decimal', 'textual'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    # the errors, and nothing else: every other name is loaded when first taken (no pluggy,
    # no Host, no Textual, not even the types of health results and metric families)
    assert json.loads(out) == [
        "ibtool",
        "ibtool._version",  # written at build time (setuptools-scm)
        "ibtool.api",
        "ibtool.errors",  # the errors a plugin raises
    ]


API_MODULES = ["ibtool.api"] + sorted(
    f"ibtool.api.{p.stem}"
    for p in (Path(__file__).resolve().parents[2] / "ibtool" / "api").glob("*.py")
    if p.stem != "__init__"
)
NOT_THE_API = {"annotations", "importlib", "TYPE_CHECKING", "Any"}  # the modules' own imports


@pytest.mark.parametrize("name", API_MODULES)
def test_every_name_the_api_promises_is_there_and_no_other(name):
    """What an __all__ lists is what ibtool-plugins(8) promises: each one resolves (the lazy
    ones too), and the module shows no public name it does not list."""
    module = importlib.import_module(name)
    assert [n for n in module.__all__ if getattr(module, n, None) is None] == []
    shown = {n for n in vars(module) if not n.startswith("_")} - NOT_THE_API
    shown -= {m.rpartition(".")[2] for m in API_MODULES}  # the submodules, once imported
    assert sorted(shown - set(module.__all__)) == []


def test_each_lazy_name_is_what_type_checkers_are_told_it_is():
    """ibtool.api loads most names on first use; its TYPE_CHECKING imports say where from, for
    type checkers, readers and the layer test. Both must give the same objects."""
    import ast

    import ibtool.api as api

    tree = ast.parse(Path(api.__file__).read_text())
    block = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    told: dict = {}
    exec(compile(ast.Module(body=block.body, type_ignores=[]), api.__file__, "exec"), told)
    told.pop("__builtins__")
    eager = {n for n in vars(api) if not n.startswith("_")} - NOT_THE_API - set(told)
    assert sorted(set(api.__all__) - set(told) - eager) == []
    assert {n: getattr(api, n) for n in told} == told
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        api.nope  # noqa: B018

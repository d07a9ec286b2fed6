"""ibtool's plugin API: the one namespace plugins import, built-in ones and others alike.

As pytest gives its plugins ``pytest`` over the private ``_pytest``, this package hands on what
a plugin needs from where the core keeps it, so a plugin never depends on where that is. The
names here and in the submodules below are the promise (ibtool-plugins(8)): a name kept for a
major version; one that goes is first kept a minor release with a DeprecationWarning.

This module is cheap to import at a plugin's top: it loads the errors a plugin raises; every
other name (the records, health results, metric families, the Host, the command registry,
rendering, hookimpl) is loaded when first taken (PEP 562's module __getattr__), so a command
pays only for what it uses. What belongs to one feature is in its submodule, imported where a
command runs it:

    ibtool.api.datapath  verbs paths: Ladder, PathSpec, MTUs, the wire's modes, the HW clock
    ibtool.api.ping      the ping clients and servers, admission limits
    ibtool.api.loopback  the loopback self-test and its operations
    ibtool.api.doctor    two hosts: diagnose, the local facts, the report's view
    ibtool.api.mesh      many hosts: the mesh run, its engines, agent, rails, saved result, views
    ibtool.api.health    checks' runs, config, state file, Slurm drain, textfile
    ibtool.api.live      the Engine and its faces: the TUI's feed, the event watch
    ibtool.api.exporter  the exporter: serve, its limits, the reload of its web config
    ibtool.api.snapshot  save, load, summary and diff of snapshots; a Host replaying one
    ibtool.api.fabric    the InfiniBand fabric: a scan's bounds, its records, their view
    ibtool.api.events    port events: the record, the differ, their text and JSON
    ibtool.api.res       resource tables (rdma res): fields, summary, filters
    ibtool.api.tui       the dashboard and its loopback screen's defaults

* health results and perfdata: the Nagios Plugin Development Guidelines (monitoring-plugins.org,
  "Plugin Return Codes" and "Performance data");
* metric families: the Prometheus data model and text exposition format 0.0.4, written exactly
  as prometheus_client's ``generate_latest`` writes them.

May import ibtool.tui, ibtool.live, ibtool.health, ibtool.doctor, ibtool.mesh, ibtool.plugin,
ibtool.snapshot, ibtool.rdma, ibtool.host, ibtool.views, ibtool.web and ibtool.model; never
ibtool.sources (the Host is the way to them), ibtool.cli or a plugin.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ibtool.errors import (
    CommandFailed,
    DataError,
    IbtoolError,
    NoDevicesError,
    NotFoundError,
    Terminated,
    UnsupportedError,
    UsageError,
)

if TYPE_CHECKING:  # what _LAZY loads, for type checkers and readers
    from ibtool import __version__, hookimpl
    from ibtool.argtypes import number, parse_size
    from ibtool.host import PORT_SHOWN, Host
    from ibtool.model import counters
    from ibtool.model.gidrule import as_ip, best_gid
    from ibtool.model.health import UNITS, HealthResult, Perfdata, Range, Status, Threshold
    from ibtool.model.names import parse_selector
    from ibtool.model.rates import Sampler, counter_delta, is_saturated
    from ibtool.model.records import (
        VL_CAP,
        Bond,
        CounterSample,
        Device,
        Gid,
        GidType,
        LinkLayer,
        PhysState,
        PKey,
        Port,
        PortState,
        Protocol,
    )
    from ibtool.plugin.commands import Invocation, add_selector, open_host, selector
    from ibtool.plugin.context import (
        CheckContext,
        HealthCheck,
        MetricCollector,
        PanelFactory,
    )
    from ibtool.plugin.hooks import health_checks, panel_factories
    from ibtool.rdma.wire import MODES as WIRE_MODES
    from ibtool.views import render
    from ibtool.views.prometheus import METRIC_TYPES, MetricFamily, Sample, exposition

# name -> (module, its attribute; None: the module itself), loaded on first use
_LAZY: dict[str, tuple[str, str | None]] = {
    **{
        name: ("ibtool.model.health", name)
        for name in ("UNITS", "HealthResult", "Perfdata", "Range", "Status", "Threshold")
    },
    **{
        name: ("ibtool.plugin.context", name)
        for name in ("CheckContext", "HealthCheck", "MetricCollector", "PanelFactory")
    },
    **{
        name: ("ibtool.views.prometheus", name)
        for name in ("METRIC_TYPES", "MetricFamily", "Sample", "exposition")
    },
    "__version__": ("ibtool", "__version__"),
    "hookimpl": ("ibtool", "hookimpl"),
    "number": ("ibtool.argtypes", "number"),
    "parse_size": ("ibtool.argtypes", "parse_size"),
    "PORT_SHOWN": ("ibtool.host", "PORT_SHOWN"),
    "Host": ("ibtool.host", "Host"),
    "parse_selector": ("ibtool.model.names", "parse_selector"),
    "counters": ("ibtool.model.counters", None),
    "as_ip": ("ibtool.model.gidrule", "as_ip"),
    "best_gid": ("ibtool.model.gidrule", "best_gid"),
    "Sampler": ("ibtool.model.rates", "Sampler"),
    "counter_delta": ("ibtool.model.rates", "counter_delta"),
    "is_saturated": ("ibtool.model.rates", "is_saturated"),
    **{
        name: ("ibtool.model.records", name)
        for name in (
            "VL_CAP",
            "Bond",
            "CounterSample",
            "Device",
            "Gid",
            "GidType",
            "LinkLayer",
            "PhysState",
            "PKey",
            "Port",
            "PortState",
            "Protocol",
        )
    },  # fmt: skip
    "Invocation": ("ibtool.plugin.commands", "Invocation"),
    "add_selector": ("ibtool.plugin.commands", "add_selector"),
    "selector": ("ibtool.plugin.commands", "selector"),
    "open_host": ("ibtool.plugin.commands", "open_host"),
    "health_checks": ("ibtool.plugin.hooks", "health_checks"),
    "panel_factories": ("ibtool.plugin.hooks", "panel_factories"),
    "WIRE_MODES": ("ibtool.rdma.wire", "MODES"),
    "render": ("ibtool.views.render", None),
}


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ibtool.api' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # once: the next use is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "METRIC_TYPES",
    "PORT_SHOWN",
    "UNITS",
    "VL_CAP",
    "WIRE_MODES",
    "Bond",
    "CheckContext",
    "CommandFailed",
    "CounterSample",
    "DataError",
    "Device",
    "Gid",
    "GidType",
    "HealthCheck",
    "HealthResult",
    "Host",
    "IbtoolError",
    "Invocation",
    "LinkLayer",
    "MetricCollector",
    "MetricFamily",
    "NoDevicesError",
    "NotFoundError",
    "PKey",
    "PanelFactory",
    "Perfdata",
    "PhysState",
    "Port",
    "PortState",
    "Protocol",
    "Range",
    "Sample",
    "Sampler",
    "Status",
    "Terminated",
    "Threshold",
    "UnsupportedError",
    "UsageError",
    "__version__",
    "add_selector",
    "as_ip",
    "best_gid",
    "counter_delta",
    "counters",
    "exposition",
    "health_checks",
    "hookimpl",
    "is_saturated",
    "number",
    "open_host",
    "panel_factories",
    "parse_selector",
    "parse_size",
    "render",
    "selector",
]

"""The one surface plugins import: the types of the plugin API (see ibtool.plugin.hookspecs).

Cheap to import: a plugin module imports this at its top. The types live where the core uses
them (ibtool.model.health, ibtool.plugin.context, ibtool.views.prometheus); this module hands
them on, so a plugin never depends on where that is.

* health results and perfdata: the Nagios Plugin Development Guidelines (monitoring-plugins.org,
  "Plugin Return Codes" and "Performance data");
* metric families: the Prometheus data model and text exposition format 0.0.4, written exactly
  as prometheus_client's ``generate_latest`` writes them (ibtool does not depend on it).
"""

from __future__ import annotations

from ibtool.model.health import UNITS, HealthResult, Perfdata, Range, Status, Threshold
from ibtool.plugin.context import (
    CheckContext,
    HealthCheck,
    MetricCollector,
    PanelFactory,
)
from ibtool.views.prometheus import METRIC_TYPES, MetricFamily, Sample, exposition

__all__ = [
    "METRIC_TYPES",
    "UNITS",
    "CheckContext",
    "HealthCheck",
    "HealthResult",
    "MetricCollector",
    "MetricFamily",
    "PanelFactory",
    "Perfdata",
    "Range",
    "Sample",
    "Status",
    "Threshold",
    "exposition",
]

"""Metric families and their Prometheus text exposition.

The Prometheus data model and text exposition format 0.0.4, written exactly as
prometheus_client's ``generate_latest`` writes them. ibtool's one encoder of that format: the
textfiles (`health --textfile`, the mesh's `--textfile`) are written by it without importing
prometheus_client, and the exporter answers a text-format scrape with it too (prometheus_client
is left what ibtool does not write: OpenMetrics, and its process_* metrics).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import NamedTuple

from ibtool.model.deferred import dataclass

METRIC_TYPES = ("counter", "gauge")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class Sample(NamedTuple):
    labels: Mapping[str, str]
    value: float


@dataclass
class MetricFamily:
    """A Prometheus metric family: one name, its help text and type, and its samples.

    As in prometheus_client's CounterMetricFamily and GaugeMetricFamily: a `unit` (``bytes``,
    ``seconds``) is appended to the name unless the name already ends in it, and a counter's
    name is kept without ``_total``, which is stripped if given: the exposition writes the
    family as ``NAME_total`` (OpenMetrics names the family without the suffix, the 0.0.4 text
    format names it after its samples).
    """

    name: str
    documentation: str
    type: str
    unit: str = ""
    samples: list[Sample] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.type not in METRIC_TYPES:
            raise ValueError(f"metric {self.name}: type {self.type!r} is not one of {METRIC_TYPES}")
        if self.unit and not _LABEL_NAME.fullmatch(self.unit):
            raise ValueError(f"metric {self.name}: bad unit {self.unit!r}")
        if not isinstance(self.documentation, str):
            raise ValueError(f"metric {self.name}: documentation must be a str")
        if self.type == "counter" and self.name.endswith("_total"):
            self.name = self.name[: -len("_total")]
        if self.unit and not self.name.endswith("_" + self.unit):
            self.name += "_" + self.unit
        if not _METRIC_NAME.fullmatch(self.name):
            raise ValueError(f"bad metric name {self.name!r}")
        self._series: set[frozenset[tuple[str, str]]] | None = set()

    @property
    def exposed_name(self) -> str:
        """The name in the text format: with ``_total`` for a counter."""
        return self.name + "_total" if self.type == "counter" else self.name

    def add(self, labels: Mapping[str, str], value: float) -> None:
        """Add the sample of one series, e.g. ``add({"device": "mlx5_0", "port": "1"}, 42)``."""
        for name, label_value in labels.items():
            if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name):
                raise ValueError(f"metric {self.name}: bad label name {name!r}")
            if name.startswith("__"):
                raise ValueError(f"metric {self.name}: label {name} is reserved (__ prefix)")
            if not isinstance(label_value, str):
                raise ValueError(
                    f"metric {self.name}: label {name} must be a str, not {label_value!r}"
                )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"metric {self.name}: value must be an int or float, not {value!r}")
        if self._series is None:
            raise ValueError(f"metric {self.name}: sealed, no sample may be added")
        series = frozenset(labels.items())
        if series in self._series:
            raise ValueError(f"metric {self.name}: series {dict(labels)} added twice")
        self._series.add(series)
        self.samples.append(Sample(dict(labels), value))

    def seal(self) -> MetricFamily:
        """No sample is added after this: the set that keeps a series from being added twice
        is let go (as much memory again as the samples themselves, for a family kept long
        and large, as the fabric's are). Returns the family."""
        self._series = None
        return self


def _go_float(value: float) -> str:
    """A sample value as prometheus_client's floatToGoString writes it: +Inf, -Inf, NaN, Python
    repr otherwise, with a Go-style exponent from a million up (1234567.0 -> 1.234567e+06)."""
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def exposition(families: Iterable[MetricFamily]) -> str:
    """The Prometheus text format 0.0.4 of `families`: HELP and TYPE lines, then one line per
    sample with its labels in name order. Byte for byte what prometheus_client's
    ``generate_latest`` writes for the same families."""
    lines = []
    for family in families:
        name = family.exposed_name
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines += [f"# HELP {name} {help_text}\n", f"# TYPE {name} {family.type}\n"]
        for labels, value in family.samples:
            pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{pairs}}} " if pairs else f"{name} ")
            lines.append(f"{_go_float(value)}\n")
    return "".join(lines)

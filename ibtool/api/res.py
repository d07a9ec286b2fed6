"""Resource tables as `rdma res show` has them: the fields of each kind, the summary's, the
owners of a resource, and the filter words (`ibtool res qp lqpn 7`)."""

from __future__ import annotations

from ibtool.views.res import (
    COUNTED_SINCE,
    FIELDS_OF,
    SUMMARY_FIELDS,
    Owners,
    Row,
    count_field,
)
from ibtool.views.resfilter import parse_words

__all__ = [
    "COUNTED_SINCE",
    "FIELDS_OF",
    "SUMMARY_FIELDS",
    "Owners",
    "Row",
    "count_field",
    "parse_words",
]

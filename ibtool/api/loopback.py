"""The loopback self-test: its operations (OPS), each one's outcome (OpStatus), the run of all
(selftest) or of one (run_op) on a Loopback of QPs."""

from __future__ import annotations

from ibtool.rdma.loopback.operations import Loopback
from ibtool.rdma.loopback.results import OPS
from ibtool.rdma.loopback.results import Status as OpStatus
from ibtool.rdma.loopback.selftest import run as selftest
from ibtool.rdma.loopback.selftest import run_op

__all__ = ["OPS", "Loopback", "OpStatus", "run_op", "selftest"]

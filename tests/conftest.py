"""Where integration tests run, for the whole test tree.

Tests marked `integration` need a kernel RDMA stack: they run inside the SoftRoCE testbed VM
(`make integration`, which sets IBTOOL_TESTBED=1) or on a host with RDMA devices, and skip with
the reason anywhere else. Under CI=true no integration test may skip, for any reason: the skip
becomes a failure, so CI cannot go green without the kernel checks. `make unit` deselects them
(`-m 'not integration'`), so the host run is unaffected.
"""

from __future__ import annotations

import os

import pytest

NO_RDMA = (
    "needs a kernel RDMA stack: run `make integration` (the SoftRoCE testbed VM) "
    "or run on a host with RDMA devices"
)


def _temporary_files_in_memory() -> None:
    """tmp_path in /dev/shm (PYTEST_DEBUG_TEMPROOT), unless TMPDIR or PYTEST_DEBUG_TEMPROOT
    says where: most unit tests build a sysfs tree of up to 1,300 files, which tmpfs writes
    (and pytest later removes) three times as fast as a disk."""
    if os.environ.get("PYTEST_DEBUG_TEMPROOT") or os.environ.get("TMPDIR"):
        return
    try:
        shm = os.statvfs("/dev/shm")
    except OSError:
        return
    if shm.f_bavail * shm.f_frsize >= 2 << 30 and os.access("/dev/shm", os.W_OK | os.X_OK):
        os.environ["PYTEST_DEBUG_TEMPROOT"] = "/dev/shm"


_temporary_files_in_memory()


def in_testbed() -> bool:
    return os.environ.get("IBTOOL_TESTBED") == "1"


def real_rdma_host() -> bool:
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("integration") and not (in_testbed() or real_rdma_host()):
        if under_ci():
            pytest.fail(f"integration test outside the testbed under CI=true: {NO_RDMA}")
        pytest.skip(NO_RDMA)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and under_ci()
        and item.get_closest_marker("integration")
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"an integration test may not skip under CI=true; it skipped: {reason}"

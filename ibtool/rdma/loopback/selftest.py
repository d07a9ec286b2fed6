"""Loopback self-test, the run: each operation warmed up, timed round by round, its bandwidth
measured, its last checks made, and whatever ended it said in its OpResult."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ibtool.errors import IbtoolError
from ibtool.rdma.completions import CompletionError, CompletionTimeout
from ibtool.rdma.ladder import DEFAULT_PATH, PathSpec
from ibtool.rdma.loopback.fabric import FabricTest
from ibtool.rdma.loopback.operations import Loopback
from ibtool.rdma.loopback.results import (
    ATOMIC_OPS,
    BANDWIDTH_OPS,
    Mismatch,
    OpResult,
    OpUnsupported,
    Status,
)


def run_op(lb: Loopback, op: str, iters: int, timeout: float, bandwidth_iters: int = 0) -> OpResult:
    """One operation: a warm-up, `iters` timed and verified rounds, pipelined bandwidth (SEND,
    WRITE, READ, with `bandwidth_iters`), its last checks; its result, whatever happened."""
    result = OpResult(op, Status.PASS, lb.size)
    if op in ATOMIC_OPS and not lb.atomics:
        result.status, result.error = Status.UNSUPPORTED, "device reports atomic_caps NONE"
        return result
    step: Callable[[int, float], None] = getattr(lb, op)
    try:
        step(iters, time.monotonic() + timeout)  # warm-up: first-touch faults, ARP, caches
        for i in range(iters):
            deadline = time.monotonic() + timeout
            t0 = time.perf_counter()
            step(i, deadline)
            result.latencies_us.append((time.perf_counter() - t0) * 1e6)
            result.iters += 1
        if bandwidth_iters and op in BANDWIDTH_OPS:
            result.bandwidth_mbps = lb.bandwidth(
                op, bandwidth_iters, time.monotonic() + timeout * 4
            )
        lb.finish(op, result, timeout)
    except OpUnsupported as e:
        result.status, result.error = Status.UNSUPPORTED, e.message
    except CompletionTimeout as e:
        result.status, result.error = Status.TIMEOUT, e.message
    except (CompletionError, Mismatch) as e:
        result.status, result.error = Status.FAIL, e.message
    except IbtoolError as e:
        result.status, result.error = Status.FAIL, e.message
    finally:
        try:
            result.facts = {**lb.facts(op), **result.facts}
        finally:
            lb.release(op)
    return result


def run(
    device: str,
    port: int,
    gid_index: int | None,
    ops: Iterable[str],
    size: int,
    iters: int,
    timeout: float,
    depth: int = 16,
    path: PathSpec = DEFAULT_PATH,
    **fabric,
) -> list[OpResult]:
    """`fabric`: FabricTest's keyword arguments (qkey, mcast_source)."""
    with FabricTest(device, port, gid_index, size, depth, path, **fabric) as lb:
        return [run_op(lb, op, iters, timeout, bandwidth_iters=max(iters, depth * 8)) for op in ops]

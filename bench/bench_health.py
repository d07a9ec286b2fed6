#!/usr/bin/env python3
"""Benchmark: `ibtool health` as cron runs it, against NHC's check_hw_ib logic, and an
`ibtool exporter` scrape of 64 ports; wall time (median of several runs) and peak memory.

`ibtool health` checks more (counter deltas against a state file, GIDs, uverbs, flaps) than
check_hw_ib (state, phys_state, rate), so the ratio is the price of that; the target (issue 10)
is a run well under a second on the 500-VF tree, as a check cron runs every minute must be.
On a host with RDMA devices (the testbed) the live host is measured too.

Usage: .venv/bin/python bench/bench_health.py [--vfs 500] [--runs 7] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.sysfs_trees import sriov_vfs, uverbs  # noqa: E402

IBTOOL = [sys.executable, "-m", "ibtool"]
NHC = [str(REPO / "bench" / "nhc_check_hw_ib.sh")]
TARGET = 1.0


def run(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of one run, through GNU time."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - t0
    if proc.returncode > 3:  # 0-3 are health's answers
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return took, int(proc.stderr.strip().splitlines()[-1])


def median_of(cmd: list[str], runs: int) -> tuple[float, int]:
    results = [run(cmd) for _ in range(runs)]
    return statistics.median(t for t, _ in results), max(m for _, m in results)


def row(what: str, seconds: float, rss: int, reference: float | None = None) -> None:
    ratio = f"{seconds / reference:6.2f}x" if reference else ""
    print(f"  {what:<44} {seconds * 1000:8.1f} ms {rss / 1024:7.1f} MiB  {ratio}")


def bench_health(
    root: str | None, label: str, runs: int, work: Path, one: str | None = None
) -> None:
    """`one`: a tree of one device, whose run is ibtool's start-up and little else: what is
    left of the ratio above it is the price per device."""
    where = ["--root", root] if root else []
    state = work / f"state-{label}.json"
    print(f"{label}:")
    nhc, nhc_rss = median_of([*NHC, root or "/"], runs)
    row("NHC check_hw_ib logic (bash loop)", nhc, nhc_rss)
    if one is not None:
        floor, floor_rss = median_of([*IBTOOL, "--root", one, "health", "--no-state"], runs)
        row("ibtool health --no-state, 1 device (start-up)", floor, floor_rss, nhc)
    cron = [*IBTOOL, *where, "health", "--state", str(state)]
    run(cron)  # the first run takes the baseline; cron's every later run compares with it
    took, rss = median_of(cron, runs)
    row("ibtool health (state file, every check)", took, rss, nhc)
    took2, rss2 = median_of([*IBTOOL, *where, "health", "--no-state"], runs)
    row("ibtool health --no-state", took2, rss2, nhc)
    took3, rss3 = median_of([*IBTOOL, "--version"], runs)
    row("ibtool --version (interpreter floor)", took3, rss3, nhc)
    verdict = "under" if took < TARGET else "OVER"
    print(f"  target: a cron run {verdict} {TARGET:g} s ({took:.3f} s)")


def bench_exporter(work: Path, scrapes: int) -> None:
    root = work / "ports64"
    sriov_vfs(root, count=63)  # the PF and 63 VFs: 64 devices of one port each
    uverbs(root, sorted(os.listdir(root / "sys/class/infiniband")))
    proc = subprocess.Popen(
        [*IBTOOL, "--root", str(root), "exporter", "--listen", "127.0.0.1:0", "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = proc.stdout.readline().split()[1]
        body = ""
        while "ibtool_exporter_poll_duration_seconds" not in body:
            with urllib.request.urlopen(url, timeout=30) as reply:
                body = reply.read().decode()
            time.sleep(0.1)
        times = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as reply:
                body = reply.read()
            times.append(time.perf_counter() - t0)
        with open(f"/proc/{proc.pid}/status") as f:
            hwm = int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))
        poll = re.search(rb"^ibtool_exporter_poll_duration_seconds (\S+)", body, re.M).group(1)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    finally:
        proc.terminate()
        proc.wait(30)
    print("ibtool exporter, 64 ports:")
    print(f"  scrape (median of {scrapes})  {statistics.median(times) * 1000:8.1f} ms")
    print(f"  scrape (max)               {max(times) * 1000:8.1f} ms")
    print(f"  one poll of the host       {float(poll) * 1000:8.1f} ms")
    print(f"  series per scrape          {series:8d}  ({len(body) / 1024:.0f} KiB)")
    print(f"  peak memory (VmHWM)        {hwm / 1024:8.1f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vfs", type=int, default=500)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--scrapes", type=int, default=20)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ibtool-bench-health-"))
    try:
        if args.vfs:  # --vfs 0: the live host only (under emulation the tree takes minutes)
            root = work / "vfs"
            sriov_vfs(root, count=args.vfs)
            uverbs(root, sorted(os.listdir(root / "sys/class/infiniband")))
            one = work / "one"
            sriov_vfs(one, count=0)
            uverbs(one, sorted(os.listdir(one / "sys/class/infiniband")))
            what = f"{args.vfs + 1} devices (PF + {args.vfs} VFs, --root)"
            bench_health(str(root), what, args.runs, work, str(one))
            print()
        if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
            bench_health(None, "this host (live)", args.runs, work)
            print()
        bench_exporter(work, args.scrapes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

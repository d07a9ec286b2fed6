#!/usr/bin/env python3
"""Benchmark: `ibtool -j res qp` against `rdma -j res show qp` with 1,000 live QPs.

Needs a kernel with RDMA devices (run it in the testbed:
`tests/testbed/testbed run -- .venv/bin/python bench/bench_res.py`). Both tools list the QPs
several times before and while tests/testbed/res_holder.py holds 1,000 more (one context, RC
QPs in RESET, plus a few in INIT/RTS), in the same run: median wall times, their ratio, what
the 1,000 QPs add to each, the peak RSS of each tool (getrusage of the children), and ibtool's
time for the same listing called in-process (interpreter and imports already paid, as in the
TUI or an exporter). Both outputs must list the same QPs, so a fast wrong answer cannot win.
The holder is stopped (its objects destroyed) on every exit path.

In the testbed a fresh ibtool process pays ~4 s before any work: Python itself (~1.2 s), the
scan of installed distributions for plugins (~1.5 s) and its imports, since every stat of the
shared 9p root costs ~2 ms under TCG (it was ~13 s while pyroute2's package __init__ was
imported whole). That floor is in the command times and is why the in-process figure is
printed too.

Usage: .venv/bin/python bench/bench_res.py [--qps 1000] [--runs 5] [--device rxe0]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IBTOOL = [sys.executable, "-m", "ibtool", "-j", "res", "qp"]
RDMA = ["rdma", "-j", "res", "show", "qp"]


def timed(cmd: list[str], runs: int) -> tuple[float, str]:
    """Median wall seconds and the last stdout."""
    times, out = [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        out = proc.stdout
    return statistics.median(times), out


def peak_rss_mib(cmd: list[str]) -> float:
    """Peak RSS of one run of cmd, from a fresh child of a fresh helper process."""
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True, "
        "check=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout  # fmt: skip
    return int(out) / 1024


def in_process(runs: int) -> float:
    """Median seconds of `ibtool -j res qp` called through cli.main in this process."""
    sys.path.insert(0, str(REPO))
    from ibtool.cli import main as ibtool_main

    times = []
    for _ in range(runs + 1):  # the first pays the imports
        t0 = time.perf_counter()
        code = ibtool_main(["-j", "res", "qp"], stdout=io.StringIO(), stderr=io.StringIO())
        times.append(time.perf_counter() - t0)
        if code != 0:
            raise SystemExit(f"ibtool -j res qp failed in-process ({code})")
    return statistics.median(times[1:])


def measure(runs: int) -> dict:
    rdma_s, rdma_out = timed(RDMA, runs)
    ibtool_s, ibtool_out = timed(IBTOOL, runs)
    ours, theirs = json.loads(ibtool_out), json.loads(rdma_out)
    if ours != theirs:
        raise SystemExit(f"the outputs differ: ibtool {len(ours)} QPs, rdma {len(theirs)}")
    return {"qps": ours, "rdma": rdma_s, "ibtool": ibtool_s, "warm": in_process(runs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default=os.environ.get("IBTOOL_TB_DEVICE", "rxe0"))
    args = ap.parse_args()
    idle = measure(args.runs)
    holder = subprocess.Popen(
        [sys.executable, str(REPO / "tests/testbed/res_holder.py"), args.device,
         "--rc", str(args.qps)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        t0 = time.perf_counter()
        line = holder.stdout.readline()
        if not line:
            raise SystemExit("res_holder.py failed to create the QPs")
        info = json.loads(line)
        print(f"{args.qps} RC QPs in RESET (+3) created on {args.device} in "
              f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
        busy = measure(args.runs)
        held = [q for q in busy["qps"] if q.get("pid") == info["pid"]]
        if len(held) < args.qps:
            raise SystemExit(f"ibtool lists {len(held)} of the holder's {args.qps + 3} QPs")
        rss = {"rdma": peak_rss_mib(RDMA), "ibtool": peak_rss_mib(IBTOOL)}
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=120)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    n0, n1 = len(idle["qps"]), len(busy["qps"])
    print(f"both tools list the same QPs ({n0} idle, {n1} held); medians of {args.runs}")
    before, after = f"{n0} QPs", f"{n1} QPs"
    print(f"{'':24}{before:>12}{after:>12}{'added':>12}{'peak RSS':>11}")
    for name, key in (("rdma -j res show qp", "rdma"), ("ibtool -j res qp", "ibtool")):
        a, b = idle[key], busy[key]
        print(f"{name:24}{a * 1e3:9.1f} ms{b * 1e3:9.1f} ms{(b - a) * 1e3:9.1f} ms"
              f"{rss[key]:7.1f} MiB")  # fmt: skip
    a, b = idle["warm"], busy["warm"]
    print(f"{'ibtool in-process':24}{a * 1e3:9.1f} ms{b * 1e3:9.1f} ms{(b - a) * 1e3:9.1f} ms")
    print(f"ibtool / rdma with {n1} QPs: {busy['ibtool'] / busy['rdma']:.1f} x (commands), "
          f"{busy['warm'] / busy['rdma']:.1f} x (ibtool in-process)")  # fmt: skip
    added = (busy["warm"] - idle["warm"]) / max(n1 - n0, 1) * 1e6
    print(f"ibtool per added QP: {added:.0f} us (in-process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

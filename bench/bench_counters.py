#!/usr/bin/env python3
"""Benchmark: `ibtool counters` against `rdma statistic show`, on the live kernel.

Run it where RDMA devices exist, e.g. in the testbed:

    tests/testbed/testbed run -- .venv/bin/python bench/bench_counters.py

Prints, for each command, the median wall time of several runs (each run is a fresh process,
as a monitoring job would start it), the ratio against iproute2's `rdma` measured in the same
run, and the peak RSS of each process. ibtool reads sysfs (PMA and driver counters) and asks
netlink STAT_GET for what sysfs lacks; `rdma statistic show` asks netlink only.
Also: `ibtool --version` (interpreter floor), a bare import of the netlink layer (pyroute2's
netlink core), and `ibtool -j counters` called in-process, to show what is start-up and what
is work. In the testbed a fresh process pays ~1.2 s for Python alone and ~1.5 s to scan the
installed distributions for plugins (every stat of the 9p root costs ~2 ms under TCG).

Usage: bench_counters.py [--runs 15]
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

IBTOOL = [sys.executable, "-m", "ibtool"]


def timed(cmd: list[str], runs: int) -> tuple[float, float, int]:
    """(median s, min s, peak RSS KiB) over `runs` fresh processes (RSS from wait4, per run)."""
    times, peak = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        times.append(time.perf_counter() - t0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({code}): {err.strip()}")
        peak = max(peak, usage.ru_maxrss)
    return statistics.median(times), min(times), peak


def counters_seen(cmd: list[str]) -> int:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    if data and isinstance(data[0], dict) and "counter" in data[0]:
        return len(data)
    total = 0
    for entry in data:  # rdma: one object per port, counters as keys (or nested)
        counters = entry.get("counters", entry)
        total += sum(1 for k, v in counters.items() if isinstance(v, int) and k != "port")
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
        raise SystemExit("no RDMA devices here: run it in the testbed (see the docstring)")
    cases = [
        ("rdma -j statistic show", ["rdma", "-j", "statistic", "show"]),
        ("ibtool --version", [*IBTOOL, "--version"]),
        ("ibtool -j counters", [*IBTOOL, "-j", "counters"]),
        ("ibtool counters", [*IBTOOL, "counters"]),
        (
            "python: import the netlink layer",
            [sys.executable, "-c", "import ibtool.sources.netlink.client"],
        ),
        ("ibtool -j counters --rate", [*IBTOOL, "-j", "counters", "--rate", "--interval", "0.2"]),
    ]
    print(f"{len(os.listdir('/sys/class/infiniband'))} RDMA devices, {args.runs} runs each")
    print(
        f"counters listed: ibtool {counters_seen([*IBTOOL, '-j', 'counters'])}, "
        f"rdma {counters_seen(['rdma', '-j', 'statistic', 'show'])}"
    )
    print(f"{'command':<34} {'median ms':>10} {'min ms':>8} {'x rdma':>7} {'RSS MiB':>8}")
    base = None
    for label, cmd in cases:
        median, fastest, rss = timed(cmd, args.runs)
        base = base or median
        print(
            f"{label:<34} {median * 1000:>10.1f} {fastest * 1000:>8.1f} "
            f"{median / base:>7.1f} {rss / 1024:>8.1f}"
        )
    # The same listing called in-process (interpreter, imports and plugin discovery paid once, as
    # in the TUI or an exporter): what ibtool itself costs beyond Python's start-up.
    from ibtool.cli import main as ibtool_main

    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        code = ibtool_main(["-j", "counters"], stdout=io.StringIO(), stderr=io.StringIO())
        times.append(time.perf_counter() - t0)
        if code != 0:
            raise SystemExit(f"in-process ibtool -j counters exited {code}")
    median = statistics.median(times)
    print(
        f"{'ibtool -j counters, in-process':<34} {median * 1000:>10.1f} {min(times) * 1000:>8.1f} "
        f"{median / base:>7.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

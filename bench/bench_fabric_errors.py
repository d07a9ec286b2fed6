#!/usr/bin/env python3
"""Benchmark: `ibtool fabric errors` against the pile it replaces, `ibnetdiscover` then
`ibqueryerrors`, on a simulated 648-HCA fat tree with error counters put in.

ibsim serves a two-level fat tree (36 leaves of 18 HCAs, 18 spines of 36 ports) with opensm
(tests/fabric/ibsim.py); a symbol-error count is put on a leaf's port and transmit discards on a
spine's. Both run from the same node as whole processes, in turn (A B A B ...), and must name
the same ports over the same thresholds (none: any error counts), so a fast wrong answer cannot
win. Printed: median wall and CPU seconds of each, their ratio, each one's peak RSS, and
ibtool's peak on a tree of half the leaves, for memory against the fabric's size.

Usage: .venv/bin/python bench/bench_fabric_errors.py [--runs 9] [--leaves 36] [--hcas 18]
       [--spines 18]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fabric import oracle  # noqa: E402
from tests.fabric.ibsim import SimFabric, fat_tree  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fabric import arguments, timed  # noqa: E402

PILE = "ibnetdiscover >/dev/null && ibqueryerrors"


def peak_mib(argv: list[str], env: dict) -> float:
    """The largest peak RSS of the processes `argv` runs (/usr/bin/time per process)."""
    if argv[0] == "sh":
        runs = [["ibnetdiscover"], ["ibqueryerrors"]]
    else:
        runs = [argv]
    peaks = []
    for one in runs:
        r = subprocess.run(["/usr/bin/time", "-f", "%M", *one], env=env, capture_output=True,
                           text=True)  # fmt: skip
        peaks.append(int(r.stderr.strip().splitlines()[-1]) / 1024)
    return max(peaks)


def faulted(sim: SimFabric) -> None:
    sim.console('PerformanceSet "leaf05"[7] PortCounters.SymbolErrorCounter=500')
    sim.console('PerformanceSet "spine02"[3] PortCounters.PortXmitDiscards=150')


def main() -> int:
    args = arguments(__doc__)
    if args is None:
        return 1
    ours = [sys.executable, "-m", "ibtool", "-j", "fabric", "errors", "--no-state"]
    theirs = ["sh", "-c", PILE]
    peaks = {}
    half = max(args.leaves // 2, 1)
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # umad2sim's stand-in sysfs (./sys-PID) goes there, not the checkout
        net = fat_tree(half, args.hcas, args.spines)
        with SimFabric(net, Path(scratch) / "half") as sim:
            env = sim.env("node001 mlx5_0")
            env["PYTHONPATH"] = str(REPO)
            peaks["half"] = peak_mib(ours, env)
        net = fat_tree(args.leaves, args.hcas, args.spines)
        with SimFabric(net, Path(scratch) / "full") as sim:
            faulted(sim)
            env = sim.env("node001 mlx5_0")
            env["PYTHONPATH"] = str(REPO)
            a, b = [], []
            for _ in range(args.runs):
                a.append(timed(ours, env, ok=(0, 1)))
                b.append(timed(theirs, env, ok=(0, 1)))
            answer = json.loads(a[-1][2])
            found = {
                (int(p["node_guid"], 16), p["port"]): {
                    f["counter"]: f["value"] for f in p["findings"]
                }
                for p in answer["ports"]
                if p["findings"]
            }
            assert found == oracle.queryerrors(b[-1][2]) and len(found) == 2, (
                "ibtool and ibqueryerrors named different ports"
            )
            peaks["ibtool"] = peak_mib(ours, env)
            peaks["pile"] = peak_mib(theirs, env)
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    print(f"fabric: {args.leaves} leaves x {args.hcas} HCAs, {args.spines} spines: "
          f"{len(answer['ports'])} ports read; {args.runs} runs each, medians")  # fmt: skip
    print(f"ibtool -j fabric errors         wall {med(a, 0):.3f} s  cpu {med(a, 1):.3f} s  "
          f"peak {peaks['ibtool']:.1f} MiB")  # fmt: skip
    print(f"ibnetdiscover + ibqueryerrors   wall {med(b, 0):.3f} s  cpu {med(b, 1):.3f} s  "
          f"peak {peaks['pile']:.1f} MiB")  # fmt: skip
    print(f"ratio                           wall {med(a, 0) / med(b, 0):.2f}x  "
          f"cpu {med(a, 1) / med(b, 1):.2f}x")  # fmt: skip
    print(f"ibtool's peak at {half} leaves: {peaks['half']:.1f} MiB "
          f"(at {args.leaves}: {peaks['ibtool']:.1f} MiB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: `ibtool fabric` against `ibnetdiscover -p` on a simulated 648-HCA fat tree.

ibsim serves a two-level fat tree (36 leaves of 18 HCAs, 18 spines of 36 ports) with opensm as
its subnet manager, on the host (tests/fabric/ibsim.py); both tools run from the same node,
each as a whole process, in turn (A B A B ...), and must find the same links, so a fast wrong
answer cannot win. Printed: median wall and CPU seconds of each, their ratio, each one's peak
RSS, the SMPs the scan used, and ibtool's scan called in-process (the interpreter and imports
already paid, as the exporter or the dashboard would).

Usage: .venv/bin/python bench/bench_fabric.py [--runs 9] [--leaves 36] [--hcas 18] [--spines 18]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fabric import oracle  # noqa: E402
from tests.fabric.ibsim import SimFabric, fat_tree, missing  # noqa: E402


def timed(argv: list[str], env: dict, ok: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """(wall s, CPU s of the children) of one whole run, and its output; an exit status not in
    `ok` ends the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t
    if r.returncode not in ok:
        raise SystemExit(f"{argv} exited {r.returncode}: {r.stderr[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.stdout


def arguments(doc: str) -> argparse.Namespace | None:
    """The fat tree's size and the runs, from the command line; None (said why) where this
    host cannot simulate a fabric."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--leaves", type=int, default=36)
    ap.add_argument("--hcas", type=int, default=18)
    ap.add_argument("--spines", type=int, default=18)
    args = ap.parse_args()
    if missing():
        print(f"no simulated fabric here: {', '.join(missing())} missing", file=sys.stderr)
        return None
    return args


def main() -> int:
    args = arguments(__doc__)
    if args is None:
        return 1
    net = fat_tree(args.leaves, args.hcas, args.spines)
    with tempfile.TemporaryDirectory() as scratch, SimFabric(net, Path(scratch)) as sim:
        os.chdir(scratch)  # umad2sim's stand-in sysfs (./sys-PID) goes there, not the checkout
        env = sim.env("node001 mlx5_0")
        env["PYTHONPATH"] = str(REPO)
        ours = [sys.executable, "-m", "ibtool", "-j", "fabric"]
        theirs = ["ibnetdiscover", "-p"]
        a, b = [], []
        for _ in range(args.runs):
            a.append(timed(ours, env))
            b.append(timed(theirs, env))
        found = json.loads(a[-1][2])
        ends = {
            frozenset((lk[e]["port_guid"], lk[e]["port"]) for e in ("a", "b"))
            for lk in found["links"]
        }
        want = {
            frozenset({(g, p), (far[3], far[2])})
            for _, _, p, g, _, _, far in oracle.ports(b[-1][2])
            if far
        }
        assert ends == want, "ibtool and ibnetdiscover found different links"
        code = (
            "import time, resource\nfrom ibtool.host import Host\n"
            "h = Host()\nt = time.monotonic(); f = h.fabric()\n"
            "print(round(time.monotonic() - t, 4), f.mads, len(f.nodes), len(f.links()),"
            " resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
        )
        scan = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True).stdout.split()  # fmt: skip
        peak = {}
        for name, argv in (("ibtool", ours), ("ibnetdiscover", theirs)):
            r = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], env=env,
                               capture_output=True, text=True, check=True)  # fmt: skip
            peak[name] = int(r.stderr.strip().splitlines()[-1]) / 1024
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    print(f"fabric: {args.leaves} leaves x {args.hcas} HCAs, {args.spines} spines: "
          f"{scan[2]} nodes, {scan[3]} links, {scan[1]} SMPs; "
          f"{args.runs} runs each, medians")  # fmt: skip
    print(f"ibtool -j fabric     wall {med(a, 0):.3f} s  cpu {med(a, 1):.3f} s  "
          f"peak {peak['ibtool']:.1f} MiB")  # fmt: skip
    print(f"ibnetdiscover -p     wall {med(b, 0):.3f} s  cpu {med(b, 1):.3f} s  "
          f"peak {peak['ibnetdiscover']:.1f} MiB")  # fmt: skip
    print(
        f"ratio                wall {med(a, 0) / med(b, 0):.2f}x  cpu {med(a, 1) / med(b, 1):.2f}x"
    )
    print(f"ibtool's scan in-process (imports paid): {float(scan[0]):.3f} s, "
          f"process peak {int(scan[4]) / 1024:.1f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

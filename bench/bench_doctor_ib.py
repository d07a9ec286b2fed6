#!/usr/bin/env python3
"""Benchmark: what `ibtool doctor` adds on an InfiniBand port, on a simulated 648-HCA fat tree.

ibsim serves a two-level fat tree (36 leaves of 18 HCAs, 18 spines of 36 ports) with opensm as
its subnet manager, on the host (tests/fabric/ibsim.py). From the first HCA to the last (a
route across a spine, 4 links), each run is one process under umad2sim
(tests/fabric/doctor_peer.py) that times doctor's InfiniBand part as `ibtool doctor` runs it:
this end's cable and SM (libibumad and libibmad loaded, the first SMPs), then the LID route and
the peer cable's counters. Printed: the median of each and of their sum, against the
infiniband-diags commands an operator runs for the same answers (sminfo, ibtracert, perfquery
of both cables' switch ports), each a whole process, and the whole `ibtool doctor --no-probe`.

Usage: .venv/bin/python bench/bench_doctor_ib.py [--runs 9] [--leaves 36] [--hcas 18] [--spines 18]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_fabric import arguments, timed  # noqa: E402

from tests.fabric.ibsim import SimFabric, fat_tree  # noqa: E402


def main() -> int:
    args = arguments(__doc__)
    if args is None:
        return 1
    net = fat_tree(args.leaves, args.hcas, args.spines)
    here, there = "node001 mlx5_0", f"node{args.leaves * args.hcas:03d} mlx5_0"
    with tempfile.TemporaryDirectory() as scratch, SimFabric(net, Path(scratch)) as sim:
        os.chdir(scratch)
        env = {**sim.env(here), "PYTHONPATH": str(REPO)}
        words = subprocess.run(["ibaddr", "-L"], env=sim.env(there), capture_output=True,
                               text=True, check=True).stdout.split()  # fmt: skip
        dst = int(words[words.index("start") + 1], 0)
        probe = [sys.executable, "-m", "tests.fabric.doctor_peer", str(dst), there]
        local, route, diags, whole = [], [], [], []
        for _ in range(args.runs):
            _, _, out = timed(probe, env)
            got = json.loads(out)
            local.append(got["seconds"]["local"])
            route.append(got["seconds"]["route"])
            fabric = got["fabric"]
            hops = fabric["route"]["hops"]
            t = time.monotonic()
            timed(["sminfo"], env)
            timed(["ibtracert", str(fabric["route"]["source"]["lid"]), str(dst)], env)
            for cable in (fabric["cable"], fabric["peer_cable"]):
                timed(["perfquery", str(cable["far"]["lid"]), str(cable["far"]["port"])], env)
            diags.append(time.monotonic() - t)
            whole.append(timed([sys.executable, "-m", "ibtool", "doctor", "--no-probe"], env,
                               ok=(0, 1, 2))[0])  # fmt: skip
        assert got["checks"]["lid_route"]["status"] == "PASS", got["checks"]["lid_route"]
        print(f"fabric: {args.leaves} leaves x {args.hcas} HCAs, {args.spines} spines; "
              f"{here} -> {there} (LID {dst}), {len(hops)} links; {args.runs} runs")  # fmt: skip
        med = statistics.median
        total = [a + b for a, b in zip(local, route)]
        print(f"doctor's InfiniBand part: {med(total) * 1000:.1f} ms median "
              f"(cable and SM {med(local) * 1000:.1f} ms, route and peer cable "
              f"{med(route) * 1000:.1f} ms)")  # fmt: skip
        print(f"sminfo + ibtracert + 2 perfquery, whole processes: {med(diags) * 1000:.1f} ms")
        print(f"ibtool doctor --no-probe, whole process (no peer): {med(whole) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

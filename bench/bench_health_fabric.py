"""Benchmark: what `ibtool health`'s fabric check adds to a run and costs a port, against the
same questions asked by hand with infiniband-diags (smpquery, perfquery, sminfo), on a
simulated fabric.

ibsim serves a fat tree (tests/fabric/ibsim.py) with opensm; everything runs on node001
(umad2sim gives a process one port of its node). Whole processes, in turn (A B A B ...):
`ibtool health --no-state --check fabric`; the whole `ibtool health --no-state` with and
without the check (what it adds to a cron run); and the pile a person would run for the port:
`smpquery -D nodeinfo` and `portinfo` of the far end, `perfquery` of its port, `sminfo`. Then,
in one process, the cable of the port read again and again (Host.cables, the MADs of one port,
no start-up): its cost a port. Printed: medians of wall and CPU seconds, the ratio, and the
MADs a port costs.

Usage: .venv/bin/python bench/bench_health_fabric.py [--runs 9] [--leaves 36] [--hcas 18]
       [--spines 18]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fabric.ibsim import SimFabric, fat_tree  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fabric import arguments, timed  # noqa: E402

NODE = "node001 mlx5_0"
# umad2sim frees only the first of the agents a closed umad port registered (umad2sim.c
# close_fd), of 32 a process: an SMP port (two classes) leaks one, so a process opens ~31
REPEAT = 15
# One port's cable read REPEAT times in one process: the cost of a port without start-up.
LOOP = f"""
import time
from ibtool.host import Host
host = Host("/")
host.cables()
t, c = time.monotonic(), time.process_time()
for _ in range({REPEAT}):
    assert host.cables()[0].counters is not None
print(time.monotonic() - t, time.process_time() - c)
"""


def main() -> int:
    args = arguments(__doc__)
    if args is None:
        return 1
    health = [sys.executable, "-m", "ibtool", "-j", "health", "--no-state", "--config",
              "/dev/null"]  # fmt: skip
    fabric, whole, without, by_hand = [], [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # umad2sim's stand-in sysfs (./sys-PID) goes there, not the checkout
        net = fat_tree(args.leaves, args.hcas, args.spines)
        with SimFabric(net, Path(scratch) / "tree") as sim:
            env = sim.env(NODE)
            env["PYTHONPATH"] = str(REPO)
            answer = json.loads(timed([*health, "--check", "fabric"], env)[2])
            cable = answer["results"][0]["summary"]  # cable to leaf01/1: ...
            far_port = int(cable.split("/")[1].split(":")[0])
            info = sim.run(["smpquery", "-D", "portinfo", "0,1", "0"], host=NODE).stdout
            lid = int(info.split("Lid:")[1].split()[0].strip("."))
            theirs = ["sh", "-c", f"smpquery -D nodeinfo 0,1 >/dev/null && smpquery -D portinfo "
                      f"0,1 {far_port} >/dev/null && perfquery {lid} {far_port} >/dev/null && "
                      "sminfo >/dev/null"]  # fmt: skip
            for _ in range(args.runs):
                fabric.append(timed([*health, "--check", "fabric"], env))
                by_hand.append(timed(theirs, env))
                whole.append(timed(health, env, ok=(0, 1, 2, 3)))
                without.append(timed([*health, "--skip", "fabric"], env, ok=(0, 1, 2, 3)))
            loop = timed([sys.executable, "-c", LOOP], env)[2].split()
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    print(f"fabric: {args.leaves} leaves x {args.hcas} HCAs, {args.spines} spines; on {NODE}; "
          f"{args.runs} runs each, medians")  # fmt: skip
    rows = [
        ("health --check fabric", fabric),
        ("smpquery x2 + perfquery + sminfo (by hand)", by_hand),
        ("health (every check)", whole),
        ("health --skip fabric", without),
    ]
    for name, xs in rows:
        print(f"{name:<44} wall {med(xs, 0):.3f} s  cpu {med(xs, 1):.3f} s")
    print(f"{'ratio: the check / by hand':<44} wall {med(fabric, 0) / med(by_hand, 0):.2f}x  "
          f"cpu {med(fabric, 1) / med(by_hand, 1):.2f}x")  # fmt: skip
    added = [med(whole, i) - med(without, i) for i in (0, 1)]
    print(f"{'the check in a whole run':<44} wall {added[0] * 1000:.1f} ms  "
          f"cpu {added[1] * 1000:.1f} ms")  # fmt: skip
    wall, cpu = (float(x) / REPEAT * 1000 for x in loop)
    print(f"{'a port (its cable, in process)':<44} wall {wall:.2f} ms  cpu {cpu:.2f} ms")
    print("MADs a port: 6 SMPs and 2 PMA MADs (3 with PortCountersExtended); an SM: 3 SMPs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Doctor's InfiniBand checks run on one node of a simulated fabric against a peer whose facts
are given, as its `ibtool ping --server` would tell them (a peer server under umad2sim has no
sysfs to read its LID from, and no verbs to serve with): run under umad2sim with SIM_HOST set,
as ``python -m tests.fabric.doctor_peer PEER_LID [PEER_HOST]``; prints JSON: the checks, the
text's lines and the fabric part of doctor's JSON, and the seconds the MADs took."""

from __future__ import annotations

import json
import sys
import time

from ibtool.doctor import ib
from ibtool.doctor.checks import Context, run_checks
from ibtool.doctor.facts import collect
from ibtool.host import Host
from ibtool.model.doctor import Facts
from ibtool.views import doctor as view


def main(argv: list[str]) -> int:
    said: list[str] = []
    host = Host(warn=said.append)
    device = host.ports(None, fields=("state",))[0]
    local = collect(host, device.device, device.port)
    peer = Facts(hostname=argv[2] if len(argv) > 2 else "peer", device="mlx5_0", port=1,
                 link_layer="InfiniBand", state="ACTIVE", lid=int(argv[1]))  # fmt: skip
    began = time.monotonic()
    path = ib.gather_local(host, local, lambda: {}, said.append)
    mid = time.monotonic()
    path = ib.gather_route(host, path, peer, None)
    took = (mid - began, time.monotonic() - mid)
    findings = run_checks(local, peer, Context(peer="peer", fabric=path))
    print(json.dumps({
        "checks": {f.check: f.to_json() for f in findings},
        "text": view.lines(findings),
        "fabric": path.to_json(),
        "seconds": {"local": took[0], "route": took[1]},
        "warnings": [w for w in said if not w.endswith(": missing")],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

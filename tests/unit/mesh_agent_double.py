"""A mesh agent that speaks the protocol with no RDMA behind it, for the ClusterShell engine's
unit test (its exec worker starts one a node): `python mesh_agent_double.py NODE [MODE]`.

MODE: `ok` (its pings all answered), `garbage` (a non-protocol line after the hello), `exit`
(exits 3 after its hello), `early` (exits 3 before its hello, saying why on stderr), `banner`
(prints a login banner first, then behaves)."""

import json
import sys

node, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "ok")
index = int("".join(c for c in node if c.isdigit()) or 0)


def say(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


if mode == "early":
    sys.stderr.write("ibtool: error: no RDMA devices (/sys/class/infiniband does not exist)\n")
    sys.exit(3)
if mode == "banner":
    print("Welcome to the cluster. Unauthorized access prohibited.", flush=True)
say(
    {
        "t": "hello",
        "v": 1,
        "id": f"{index:016x}",
        "node": node,
        "endpoints": [
            {
                "device": "mlx5_0",
                "port": 1,
                "state": "ACTIVE",
                "link_layer": "Ethernet",
                "address": f"10.0.0.{index}",
                "gid_index": 3,
                "hw": True,
                "problem": None,
            }
        ],
    }
)
if mode == "exit":
    sys.stderr.write("ibtool: no RDMA device\n")
    sys.exit(3)
if mode == "garbage":
    say({"t": "result", "r": "x"})
mine = None
for line in sys.stdin:
    msg = json.loads(line)
    if msg["t"] == "plan":
        mine = [i for i, e in enumerate(msg["endpoints"]) if e[0] == f"{index:016x}"]
        groups, shifts = msg["schedule"]["groups"], msg["schedule"]["shifts"]
        say({"t": "ready", "problems": {}})
    elif msg["t"] == "round":
        r, pairs = msg["r"], []
        for g, members in groups.items():
            if r < len(shifts[g]):
                for i in mine:
                    if i in members:
                        k = members.index(i)
                        d = members[(k + shifts[g][r]) % len(members)]
                        pairs.append([i, d, 1, 5, 5, 2.5, 3.0, 3.5, True, None])
        say({"t": "result", "r": r, "pairs": pairs})
    elif msg["t"] == "end":
        break

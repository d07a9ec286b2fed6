"""A mesh agent that speaks the protocol with no RDMA behind it, for the engines' unit tests
(ClusterShell's exec worker or a stand-in srun starts one a node):
`python mesh_agent_double.py NODE [MODE] --connect [ADDR]:PORT [--detach]`, the arguments in
any order, as the real agent it reads its join on stdin, joins the coordinator over TCP
(ibtool.mesh.channel.join, the agent's own), leaves its starter with --detach, and speaks
there.

MODE: `ok` (its pings all answered), `garbage` (a non-protocol line after the hello), `exit`
(exits 3 after its hello), `early` (exits 3 before joining, saying why on stderr), `banner`
(prints a login banner first, then behaves)."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from ibtool.mesh import channel  # noqa: E402
from ibtool.mesh.agent import detach_from_starter  # noqa: E402
from ibtool.mesh.protocol import VERSION  # noqa: E402

args, connect, detach = [], None, False
argv = iter(sys.argv[1:])
for a in argv:
    if a == "--connect":
        connect = channel.parse_listen(next(argv))
    elif a == "--detach":
        detach = True
    else:
        args.append(a)
node, mode = args[0], (args[1] if len(args) > 1 else "ok")
index = int("".join(c for c in node if c.isdigit()) or 0)

if mode == "early":
    sys.stderr.write("ibtool: error: no RDMA devices (/sys/class/infiniband does not exist)\n")
    sys.exit(3)
if mode == "banner":
    print("Welcome to the cluster. Unauthorized access prohibited.", flush=True)
given = channel.read_join(sys.stdin.buffer.readline())
sock = channel.join(channel.coordinator_address(connect[0]), connect[1], given)
if detach:
    detach_from_starter()
stream = sock.makefile("rwb")


def say(msg):
    stream.write((json.dumps(msg) + "\n").encode())
    stream.flush()


say(
    {
        "t": "hello",
        "v": VERSION,
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
for line in stream:
    msg = json.loads(line)
    if msg["t"] == "plan":
        mine = [e[0] for e in msg["endpoints"] if e[1] == f"{index:016x}"]
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

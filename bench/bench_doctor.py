#!/usr/bin/env python3
"""What `ibtool doctor PEER` costs, against what an operator runs by hand for the same answers.

Run in the runner of the two-host testbed (the peer is `ssh peer`):
    tests/testbed/testbed pair -- .venv/bin/python bench/bench_doctor.py [ROUNDS]

Each round times, as whole commands (Python start-up included):
- `ibtool doctor PEER`: both ends' facts, the checks, the probe (3 SENDs, 3 WRITE IMMs);
- `ibtool doctor PEER --no-probe`: the facts and the checks;
- the peer's answer alone: one FACTS query on the ping port, timed in this process;
- `ibtool ping PEER -c 3` twice (send, write-imm): the probe's round trips as ping runs them;
- the pile doctor replaces, run by hand: ibv_devinfo -v, rdma link, ip route get, the sysctls,
  nft list ruleset, here and on the peer over ssh, then an ibv_rc_pingpong of 3 iterations.
Under QEMU TCG absolute times are meaningless (a Python start-up is ~1.5 s here, ~0.05 s on a
host): the ratios of one round, doctor over the pile, are what to compare. The goal on a real
host is doctor against a peer in under 2 s.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time

IBTOOL = [sys.executable, "-m", "ibtool"]
PORT, PP_PORT = 18791, 18792


def ssh(command: str) -> list[str]:
    return ["ssh", "peer", f"cd {os.getcwd()} && set -a && . /run/ibtool-testbed.env && set +a "
            f"&& {command}"]  # fmt: skip


def timed(argv: list[str], ok=(0,)) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return took


def wait_port(host: str, port: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing listens at {host}:{port}")


def peer_listens(port: int, timeout: float = 180) -> None:
    """Until the peer's /proc/net/tcp shows `port` listening: read, never connected to, as
    ibv_rc_pingpong serves the first connection only."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = subprocess.run(ssh("cat /proc/net/tcp"), capture_output=True, text=True).stdout
        for row in rows.splitlines()[1:]:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens at the peer's port {port}")


def pile(peer: str, gid: str, device: str) -> float:
    """What an operator types for doctor's answers, both ends and a stock ping."""
    local = (f"ibv_devinfo -v -d {device} >/dev/null; rdma link show >/dev/null; "
             f"sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.all.arp_ignore >/dev/null; "
             "nft list ruleset >/dev/null 2>&1; cat /proc/self/limits >/dev/null")  # fmt: skip
    server = subprocess.Popen(
        ssh(f"{local}; exec ibv_rc_pingpong -d {device} -g {gid} -p {PP_PORT} -n 3"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(["sh", "-c", f"{local}; ip route get {peer} >/dev/null"], check=True)
    peer_listens(PP_PORT)  # the pingpong server listens after the peer's commands ran
    subprocess.run(["ibv_rc_pingpong", "-d", device, "-g", gid, "-p", str(PP_PORT), "-n", "3",
                    peer], capture_output=True, check=True, timeout=120)  # fmt: skip
    took = time.monotonic() - t0
    server.wait(timeout=60)
    return took


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    peer = os.environ["IBTOOL_TB_PEER_HOST"]
    device, gid = os.environ["IBTOOL_TB_DEVICE"], os.environ["IBTOOL_TB_IPV4_GID_INDEX"]
    peer_gid = os.environ.get("IBTOOL_TB_PEER_IPV4_GID_INDEX", gid)
    server = subprocess.Popen(
        ssh(f"exec {sys.executable} -m ibtool ping --server --port {PORT}"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    from ibtool.rdma.ping.facts import query_facts

    try:
        wait_port(peer, PORT)
        rows: dict[str, list[float]] = {}
        for _ in range(rounds):
            doctor = [*IBTOOL, "doctor", peer, "--port", str(PORT), "--timeout", "30"]
            rows.setdefault("doctor", []).append(timed(doctor))
            rows.setdefault("doctor --no-probe", []).append(timed([*doctor, "--no-probe"]))
            t0 = time.monotonic()
            query_facts(peer, PORT, 30.0)
            rows.setdefault("the peer's facts (query)", []).append(time.monotonic() - t0)
            ping = [*IBTOOL, "ping", peer, "--port", str(PORT), "-c", "3", "-i", "0"]
            rows.setdefault("ibtool ping -c 3, both modes", []).append(
                timed(ping) + timed([*ping, "--mode", "write-imm"])
            )
            rows.setdefault("the pile by hand", []).append(pile(peer, peer_gid, device))
        print(f"{rounds} rounds, seconds (min / median / max):")
        for name, values in rows.items():
            print(f"  {name:32} {min(values):6.2f} {statistics.median(values):6.2f} "
                  f"{max(values):6.2f}")  # fmt: skip
        ratio = [d / p for d, p in zip(rows["doctor"], rows["the pile by hand"])]
        print(f"doctor / the pile, per round: median {statistics.median(ratio):.2f} "
              f"(min {min(ratio):.2f}, max {max(ratio):.2f})")  # fmt: skip
    finally:
        server.terminate()
        subprocess.run(ssh(f"pkill -f 'ping --server --port {PORT}'"), capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

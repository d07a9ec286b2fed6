"""The two hosts of `testbed pair`: this guest (the runner, A) and the peer (B), reached with
`ssh peer` (tests/testbed/guest.sh, setup_pair: dropbear on B, a per-run key and an ssh master
connection on A, so each command costs no new key exchange).

`Pair.local` and `Pair.peer` are `Host`s with the same methods: `run(argv, timeout)` -> a
CompletedProcess, `start(argv)` -> a `Process` (its stdout lines as they come, `stop()`), and the
host's facts from the topology (address, device, GID index, kernel, release). A command on the
peer runs there from its checkout (`repo`) with its own testbed environment
(/run/ibtool-testbed.env), as the runner's does here.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

ENV_FILE = "/run/ibtool-testbed.env"
PID_MARK = "@ibtool-pair-pid "


def in_pair() -> bool:
    return os.environ.get("IBTOOL_TESTBED") == "1" and os.environ.get("IBTOOL_TB_PAIR") == "1"


def listening_in(tables: str, port: int) -> bool:
    """Whether /proc/net/tcp{,6} rows (`tables`, both files' text) show a TCP socket listening
    on `port`: read, never connected to (ibv_rc_pingpong serves the first connection only)."""
    for row in tables.splitlines():
        fields = row.split()
        if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:  # 0A: TCP_LISTEN
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
            except ValueError:
                continue  # the header line
    return False


class Process:
    """A command started on a host, its standard output lines as a reader thread gets them."""

    def __init__(self, host: Host, argv: Sequence[str], popen_argv: list[str]):
        self.host = host
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            popen_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.pid: int | None = None if host.remote else self.proc.pid
        self.lines: list[str] = []
        self._eof = False
        self._changed = threading.Condition()
        self._err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()
        if host.remote:  # the remote shell's first line: the pid the command was exec'd as
            self.wait_for_lines(lambda _: self.pid is not None, timeout=60)

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                if self.pid is None and line.startswith(PID_MARK):
                    self.pid = int(line[len(PID_MARK) :])
                else:
                    self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def _read_err(self) -> None:
        self._err.extend(self.proc.stderr)

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_for_lines(self, enough: Callable[[list[str]], bool], timeout: float = 60):
        """Its lines once `enough(lines)` says so; an error if it ends or `timeout` passes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not enough(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    raise AssertionError(
                        f"{self.argv} on {self.host.name}: got {self.lines}, exit "
                        f"{self.proc.poll()}, stderr {''.join(self._err)!r}"
                    )
                self._changed.wait(min(left, 1.0))
            return list(self.lines)

    def send_signal(self, sig: int) -> None:
        if not self.running():
            return
        if self.host.remote:
            if self.pid is not None:
                self.host.run(["kill", f"-{int(sig)}", str(self.pid)], timeout=60)
        else:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        """Wait for it to end by itself: exit status, all its stdout, its stderr."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return rc, *self._output()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str, str]:
        """Signal it (on its host) and wait; SIGKILL after `timeout`. Safe to call again."""
        self.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # the ssh client; its remote command may be gone with it
                self.proc.wait()
        return self.proc.returncode, *self._output()

    def _output(self) -> tuple[str, str]:
        with self._changed:
            while not self._eof:
                self._changed.wait(1.0)
        self._err_reader.join(30)
        return "".join(self.lines), "".join(self._err)


class Host:
    """One guest of the pair: its facts, and commands run on it."""

    def __init__(self, name: str, facts: dict[str, str], remote: bool):
        self.name = name
        self.remote = remote
        self.ipv4 = facts["ipv4"]
        self.ipv6 = facts.get("ipv6", "")
        self.device = facts["device"]
        self.netdev = facts["netdev"]
        self.gid_index = int(facts["ipv4_gid_index"])
        self.ipv6_gid_index = int(facts["ipv6_gid_index"]) if facts.get("ipv6_gid_index") else None
        self.kernel = facts["kernel"]
        self.release = facts.get("release", "")
        self.repo = facts["repo"]
        self.rdma_core = facts.get("rdma_core", "")  # the Debian package version, e.g. 33.2-1
        self.python = sys.executable if not remote else f"{self.repo}/.venv/bin/python"
        self.started: list[Process] = []

    def rdma_core_major(self) -> int:
        try:
            return int(self.rdma_core.split(".", 1)[0].split(":")[-1])
        except ValueError:
            return 0

    def __repr__(self) -> str:
        return f"<{self.name} {self.ipv4} {self.release} {self.kernel}>"

    def _ssh(self, command: str) -> list[str]:
        """ssh argv running the shell line `command` on the peer, from its checkout, with its
        testbed environment."""
        return [
            "ssh",
            "peer",
            f"cd {shlex.quote(self.repo)} && set -a && . {ENV_FILE} && set +a && {command}",
        ]

    def ibtool(self, *args: str) -> list[str]:
        """The argv of `ibtool ARGS...` with this host's interpreter."""
        return [self.python, "-m", "ibtool", *args]

    def run(self, argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `argv` on this host: its exit status (ssh passes the remote one on), stdout and
        stderr as text. On the peer the command is bounded by `timeout` there too."""
        argv = list(argv)
        if self.remote:
            command = self._ssh(f"timeout -k 5 {int(timeout)} {shlex.join(argv)}")
        else:
            command = argv
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 30)
        return subprocess.CompletedProcess(list(argv), proc.returncode, proc.stdout, proc.stderr)

    def start(self, argv: Sequence[str]) -> Process:
        """Start `argv` on this host in the background; stopped at the fixture's teardown."""
        if self.remote:
            line = f'echo "{PID_MARK}$$" && exec {shlex.join(argv)}'
            process = Process(self, argv, self._ssh(line))
        else:
            process = Process(self, argv, list(argv))
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.running():
                process.stop()
        self.started.clear()

    def rdma_res(self, kind: str) -> list[dict]:
        """`rdma -j res show KIND` on this host."""
        proc = self.run(["rdma", "-j", "res", "show", kind], timeout=60)
        assert proc.returncode == 0, f"{self.name}: rdma res show {kind}: {proc.stderr}"
        return json.loads(proc.stdout or "[]")

    def resources(self) -> set[tuple[str, str]]:
        """Every QP and rdma_cm id on this host, the kernel's own too, as (kind, id)."""
        qps = {("qp", f"{q.get('ifname')}/{q.get('lqpn')}") for q in self.rdma_res("qp")}
        cms = {("cm_id", json.dumps(c, sort_keys=True)) for c in self.rdma_res("cm_id")}
        return qps | cms

    def listening(self, port: int) -> bool:
        if self.remote:
            tables = self.run(["cat", "/proc/net/tcp", "/proc/net/tcp6"], timeout=60).stdout
        else:
            tables = ""
            for path in ("/proc/net/tcp", "/proc/net/tcp6"):
                try:
                    with open(path) as f:
                        tables += f.read()
                except OSError:
                    pass
        return listening_in(tables, port)

    def cm_listening(self, pid: int) -> bool:
        """Whether process `pid` of this host has a listening rdma_cm id (rping -s)."""
        return any(
            c.get("pid") == pid and "LISTEN" in json.dumps(c) for c in self.rdma_res("cm_id")
        )


class Pair:
    """The runner (`local`, this guest) and the peer, from the testbed topology."""

    def __init__(self, topology: dict[str, str]):
        self.topology = topology
        peer = {k[len("peer_") :]: v for k, v in topology.items() if k.startswith("peer_")}
        self.local = Host("runner", topology, remote=False)
        self.peer = Host("peer", peer, remote=True)

    def hosts(self) -> tuple[Host, Host]:
        return self.local, self.peer

    def resources(self) -> dict[str, set[tuple[str, str]]]:
        return {host.name: host.resources() for host in self.hosts()}

    def wait_nothing_left(self, before: dict[str, set[tuple[str, str]]], timeout: float = 60):
        """Until neither host shows a QP or rdma_cm id it did not have in `before`."""
        deadline = time.monotonic() + timeout
        while True:
            left = {h.name: h.resources() - before[h.name] for h in self.hosts()}
            if not any(left.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"left behind after {timeout} s: {left}")
            time.sleep(0.5)

    def stop_all(self) -> None:
        for host in self.hosts():
            host.stop_all()

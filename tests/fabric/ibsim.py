"""A simulated InfiniBand fabric for the tests: ibsim (Debian ibsim-utils) with opensm as its
subnet manager, on the host, no kernel module and no VM.

ibsim reads the fabric from a net file in ibnetdiscover's format and serves MADs over a unix
socket (named by IBSIM_SOCKNAME, so each fabric here has its own); any libibumad program run
with libumad2sim.so preloaded talks to it instead of the kernel, sitting on the node SIM_HOST
names. Faults go in through ibsim's console (its standard input, held open here):
``PerformanceSet "leaf05"[7] PortCounters.SymbolErrorCounter=500``, ``Unlink "leaf06"[21]``,
``Error "node"[port] RATE`` (MADs dropped).

Every wait is for the thing itself (ibsim's prompt, opensm's "SUBNET UP", a counter that reads
back), bounded by a deadline, never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sysconfig
import time
import uuid
from pathlib import Path

# ibsim-utils installs it in the libdir: Debian's multiarch one (/usr/lib/<triplet>/umad2sim)
_LIBDIRS = [f"/usr/lib/{sysconfig.get_config_var('MULTIARCH') or ''}", "/usr/lib64", "/usr/lib"]
UMAD2SIM = next(
    (p for d in _LIBDIRS if os.path.exists(p := f"{d.rstrip('/')}/umad2sim/libumad2sim.so")), ""
)
TOOLS = ("ibsim", "opensm", "ibnetdiscover", "sminfo", "perfquery", "iblinkinfo")
START_TIMEOUT = 120.0  # opensm's first sweep of a 700-node fabric takes a few seconds here


def missing() -> list[str]:
    """What this host lacks to simulate a fabric (Debian: ibsim-utils, opensm, infiniband-diags)."""
    gone = [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]
    return gone + ([] if UMAD2SIM else ["libumad2sim.so"])


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _until(what: str, ready, timeout: float = START_TIMEOUT, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        got = ready()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(step)
        step = min(step * 1.5, 0.5)


class SimFabric:
    """One ibsim fabric, and opensm on it unless ``sm=False``; a context manager."""

    def __init__(self, net: str, workdir: Path, *, sm: bool = True, sm_host: str | None = None):
        self.net, self.dir, self.with_sm, self.sm_host = net, Path(workdir), sm, sm_host
        self.sock = f"ibtool-test-{uuid.uuid4().hex[:12]}"
        self.sim: subprocess.Popen | None = None
        self.sm: subprocess.Popen | None = None
        self.started: list[subprocess.Popen] = []  # every opensm started: each ends with it

    # -- the environment a program needs to sit on one node of this fabric ---------------------

    def env(self, host: str | None = None, base: dict | None = None) -> dict:
        env = dict(os.environ if base is None else base)
        env.update(LD_PRELOAD=UMAD2SIM, IBSIM_SOCKNAME=self.sock)
        env.pop("SIM_HOST", None)
        if host is not None:
            env["SIM_HOST"] = host
        return env

    def run(self, argv: list[str], host: str | None = None, timeout: float = 60.0, **kw):
        """A program on node `host` (default: the first in the net file); its CompletedProcess.
        It runs in the fabric's directory: umad2sim makes its stand-in sysfs in the working
        directory (./sys-PID), and a program killed before it removes it leaves it there."""
        kw.setdefault("cwd", self.dir)
        return subprocess.run(
            argv, env=self.env(host), capture_output=True, text=True, timeout=timeout, **kw
        )

    # -- life --------------------------------------------------------------------------------

    def __enter__(self) -> SimFabric:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "net").write_text(self.net)
        self.log = self.dir / "ibsim.log"
        with open(self.log, "wb") as out:
            self.sim = subprocess.Popen(
                [_tool("ibsim"), "-s", "-N", "4096", "-S", "512", "-P", "32768", "net"],
                cwd=self.dir, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "IBSIM_SOCKNAME": self.sock}, start_new_session=True,
            )  # fmt: skip
        try:
            _until(
                "ibsim's console prompt", lambda: b"sim>" in self.log.read_bytes() or self._dead()
            )
            if self._dead():
                raise RuntimeError(f"ibsim exited: {self.log.read_text()[-2000:]}")
            if self.with_sm:
                self.start_sm()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _dead(self) -> bool:
        return self.sim is not None and self.sim.poll() is not None

    def start_sm(
        self, priority: int = 0, host: str | None = None, until: bytes = b"SUBNET UP"
    ) -> subprocess.Popen:
        """opensm on `host` (default: the net file's first node), waited for until its log
        says `until`: that it has swept the subnet and brought it up, or (b"STANDBY") that it
        found a master and stands by."""
        osm = self.dir / f"osm-{host or 'first'}"
        osm.mkdir(exist_ok=True)
        log = osm / "osm.log"
        env = self.env(host or self.sm_host)
        env.update(OSM_TMP_DIR=str(osm), OSM_CACHE_DIR=str(osm))
        # its log written as it goes (opensm.conf's force_log_flush), for "SUBNET UP"
        (osm / "opensm.conf").write_text("force_log_flush TRUE\n")
        proc = subprocess.Popen(
            [_tool("opensm"), "-F", str(osm / "opensm.conf"), "-f", str(log),
             "-p", str(priority), "-s", "1"],
            cwd=osm, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.started.append(proc)
        if self.sm is None:
            self.sm = proc
        _until(
            f"opensm's {until.decode()}",
            lambda: (log.exists() and until in log.read_bytes()) or proc.poll() is not None,
        )
        if proc.poll() is not None:
            raise RuntimeError(f"opensm exited {proc.returncode}: {log.read_text()[-2000:]}")
        return proc

    def stop_sm(self) -> None:
        if self.sm is not None:
            _kill(self.sm)
            self.sm = None

    def console(self, line: str) -> None:
        """One command to ibsim's console (its effect is for the caller to wait for)."""
        assert self.sim is not None and self.sim.stdin is not None
        self.sim.stdin.write(line.encode() + b"\n")
        self.sim.stdin.flush()

    def __exit__(self, *exc) -> None:
        self.stop_sm()
        for proc in self.started:  # a standby started beside the master too
            _kill(proc)
        if self.sim is not None:
            with contextlib.suppress(OSError):
                self.sim.stdin.close()
            _kill(self.sim)
            self.sim = None


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# -- fabrics of our own making ---------------------------------------------------------------


def fat_tree(leaves: int, hcas_per_leaf: int, spines: int, switch_ports: int = 36,
             hca: str = "node{:03d} mlx5_0", widths: dict | None = None) -> str:  # fmt: skip
    """A two-level fat tree in ibnetdiscover's net format: each leaf has `hcas_per_leaf` HCAs
    on its first ports and one uplink to every spine on the ports after them; `widths` maps
    (node name, port) to an enabled-width bitmask (1 = 1X, 2 = 4X) put on that port."""
    assert hcas_per_leaf + spines <= switch_ports and leaves <= switch_ports
    widths = widths or {}

    def port(name: str, p: int, far: str, fp: int) -> str:
        w = widths.get((name, p))
        return f'[{p}]\t"{far}"[{fp}]' + (f" w={w}" if w else "")

    hca_names = [hca.format(i + 1) for i in range(leaves * hcas_per_leaf)]
    blocks = []
    for s in range(spines):
        name = f"spine{s + 1:02d}"
        lines = [f'Switch\t{switch_ports} "{name}"']
        lines += [port(name, leaf + 1, f"leaf{leaf + 1:02d}", hcas_per_leaf + s + 1)
                  for leaf in range(leaves)]  # fmt: skip
        blocks.append("\n".join(lines))
    for leaf in range(leaves):
        name = f"leaf{leaf + 1:02d}"
        lines = [f'Switch\t{switch_ports} "{name}"']
        for h in range(hcas_per_leaf):
            lines.append(port(name, h + 1, hca_names[leaf * hcas_per_leaf + h], 1))
        for s in range(spines):
            lines.append(port(name, hcas_per_leaf + s + 1, f"spine{s + 1:02d}", leaf + 1))
        blocks.append("\n".join(lines))
    for i, h in enumerate(hca_names):
        leaf, p = divmod(i, hcas_per_leaf)
        blocks.append(f'Hca\t1 "{h}"\n' + port(h, 1, f"leaf{leaf + 1:02d}", p + 1))
    return "\n\n".join(blocks) + "\n"

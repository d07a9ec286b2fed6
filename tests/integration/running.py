"""An ibtool process of an integration test, and its output lines as they come."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time


def _sigint_default() -> None:
    # A non-interactive shell's background job starts with SIGINT ignored and children inherit
    # it (Python then installs no KeyboardInterrupt handler): give Ctrl-C back, as a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def listening(port: int) -> bool:
    """Whether a TCP socket of this network namespace listens on `port` (IPv4 or IPv6), as
    /proc/net/tcp says: read, never connected to (a perftest server accepts one connection)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                return True
    return False


def wait_listening(server: subprocess.Popen, port: int, timeout: float = 60) -> None:
    """Until `server` listens on TCP `port`; an error if it exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not listening(port):
        if server.poll() is not None:
            said = f"{server.args[0]} exited ({server.returncode})"
            raise AssertionError(f"{said} before it listened on port {port}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{server.args[0]} did not listen on port {port} in {timeout} s")
        time.sleep(0.05)


class Running:
    """An ibtool process and the lines of its standard output as they come (a reader thread)."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ibtool", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_sigint_default,
        )
        self.lines: list[str] = []
        self._eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def wait_for_lines(self, enough, timeout: float = 60) -> list[str]:
        """Its lines once `enough(lines)` says so."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not enough(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    raise AssertionError(f"got {self.lines}, exit {self.proc.poll()}")
                self._changed.wait(min(left, 1.0))
            return list(self.lines)

    def finish(self, sig: int | None = None, timeout: float = 120) -> tuple[int, str, str]:
        """Signal it (or not) and wait: exit status, all its standard output, its stderr."""
        try:
            if sig is not None:
                self.proc.send_signal(sig)
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(30)
        return rc, "".join(self.lines), self.proc.stderr.read()

"""How ibtool ends when it cannot write standard output or is told to stop: one line on standard
error and the exit code ibtool(8) documents (74 for standard output, 130 for Ctrl-C, 143 for
SIGTERM); only a reader that went away (a broken pipe on standard output) ends it quietly, 0.
`monitor` and `ping` are signalled in test_monitor.py and test_ping_edges.py."""

from __future__ import annotations

import errno
import io
import os
import selectors
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from ibtool import hookimpl
from ibtool.cli import main
from ibtool.errors import ExitCode
from tests.fixtures import sysfs_trees

REPO = Path(__file__).resolve().parents[2]
ENOSPC = "ibtool: error: cannot write standard output: No space left on device\n"
CLOSED = "ibtool: error: cannot write standard output: it is closed\n"


class Full(io.StringIO):
    """A standard output on a file system with no space left."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullOnFlush(io.StringIO):
    """Writes are buffered; the flush finds no space left."""

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def closed() -> io.StringIO:
    out = io.StringIO()
    out.close()
    return out


@pytest.fixture
def tree(tmp_path) -> Path:
    return sysfs_trees.build("mlx5_ib_hca", tmp_path)


@pytest.mark.parametrize(
    "stdout, said",
    [(Full, ENOSPC), (FullOnFlush, ENOSPC), (closed, CLOSED)],
    ids=["write", "flush", "closed"],
)
@pytest.mark.parametrize("argv", [["dev"], ["-j", "gids"], ["--help"]], ids=" ".join)
def test_standard_output_that_cannot_be_written_is_one_line_and_74(tree, stdout, said, argv):
    err = io.StringIO()
    code = main(["--root", str(tree), *argv], stdout=stdout(), stderr=err)
    assert (code, err.getvalue()) == (ExitCode.IO_ERROR, said)


@pytest.mark.parametrize("stdout", [Full, FullOnFlush, closed], ids=["write", "flush", "closed"])
def test_the_version_too(stdout):  # printed before anything is loaded
    err = io.StringIO()
    assert main(["-V"], stdout=stdout(), stderr=err) == ExitCode.IO_ERROR
    assert err.getvalue() in (ENOSPC, CLOSED)


def ibtool(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ibtool", *argv],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        **kwargs,
    )


def test_a_full_disk_is_one_line_and_74(tree):
    with open("/dev/full", "w") as full:
        proc = ibtool("--root", str(tree), "dev", stdout=full)
    # and no "Exception ignored" from the interpreter's own last flush
    assert (proc.returncode, proc.stderr) == (ExitCode.IO_ERROR, ENOSPC)


def test_a_closed_standard_output_is_one_line_and_74(tree):
    proc = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "ibtool"]
        + ["--root", str(tree), "dev"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (ExitCode.IO_ERROR, CLOSED)


def test_a_reader_that_went_away_is_a_quiet_0(tree):
    reader, writer = os.pipe()
    os.close(reader)
    try:
        proc = ibtool("--root", str(tree), "dev", stdout=writer)
    finally:
        os.close(writer)
    assert (proc.returncode, proc.stderr) == (ExitCode.OK, "")


def test_a_broken_pipe_elsewhere_is_not_taken_for_standard_outputs():
    plugin = types.ModuleType("pipes_plugin")

    def run(inv):
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))  # a socket's, say

    @hookimpl
    def ibtool_register_commands(cli):
        cli.add("pipes", run, help="break a pipe")

    plugin.ibtool_register_commands = ibtool_register_commands
    out, err = io.StringIO(), io.StringIO()
    code = main(["pipes"], plugins=[plugin], stdout=out, stderr=err)
    assert (code, out.getvalue()) == (ExitCode.INTERNAL, "")
    assert err.getvalue() == (
        "ibtool: internal error: BrokenPipeError: [Errno 32] Broken pipe "
        "(run with --debug for the traceback)\n"
    )


@pytest.mark.parametrize(
    "sig, code, said",
    [
        (signal.SIGINT, ExitCode.INTERRUPTED, "ibtool: interrupted\n"),
        (signal.SIGTERM, ExitCode.TERMINATED, "ibtool: terminated\n"),
    ],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_ends_counters_watch_with_its_code(tree, sig, code, said):
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibtool", "--root", str(tree), "counters", "--watch", "0.05"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        while not sel.select(timeout=0.5):  # the first interval's rates (or blank line) are out
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        proc.stdout.readline()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (code, said)


def test_ctrl_c_inside_a_string_exec_still_exits_130_under_python_m(tmp_path):
    """A Ctrl-C that lands while a string is exec()'d (dataclasses write their methods so)
    leaves CPython's unhandled-KeyboardInterrupt mark set though main() handled it; `python -m
    ibtool` must still exit 130, not die by SIGINT (-2)."""
    plugin = tmp_path / "ibtool_test_string_exec.py"
    plugin.write_text(
        "from ibtool import hookimpl\n"
        "def run(inv):\n"
        "    exec('raise KeyboardInterrupt')  # the Ctrl-C, landing inside a string exec\n"
        "@hookimpl\n"
        "def ibtool_register_commands(cli):\n"
        "    cli.add('interrupted-in-exec', run, help='a test command')\n"
    )
    env = {**os.environ, "IBTOOL_PLUGINS": "ibtool_test_string_exec",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "ibtool", "interrupted-in-exec"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (130, "ibtool: interrupted\n")

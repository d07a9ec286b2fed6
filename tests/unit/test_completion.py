"""`ibtool completion bash|zsh`: the scripts are written from the real parser (every command,
alias, option and choice), the committed copies are what the command prints, and the scripts
complete in a real bash and a real zsh: commands, options, choices, files, and device and port
names read from a --root tree, a hostile device name included, never evaluated."""

from __future__ import annotations

import argparse
import io
import os
import pty
import re
import select
import shutil
import subprocess
import time
import types
from pathlib import Path

import pytest
from ibtool_plugins import completion

from ibtool import hookimpl
from ibtool.cli import RecordingParser, build_parser, main
from ibtool.errors import ExitCode
from ibtool.plugin.manager import ENV_DISABLE_AUTOLOAD
from tests.unit.own_commands import own_commands

REPO = Path(__file__).resolve().parents[2]
COMMITTED = {"bash": REPO / "completion" / "ibtool.bash", "zsh": REPO / "completion" / "_ibtool"}
REGENERATE = (
    "regenerate the committed scripts: make completion (that is: "
    "IBTOOL_DISABLE_PLUGIN_AUTOLOAD=1 .venv/bin/ibtool completion bash > completion/ibtool.bash; "
    "IBTOOL_DISABLE_PLUGIN_AUTOLOAD=1 .venv/bin/ibtool completion zsh > completion/_ibtool)"
)
# A device directory whose name a shell would run, were it ever evaluated.
HOSTILE = "a b$(touch PWNED);`touch PWNED2`*'\""


def run(argv, plugins=()):
    out, err = io.StringIO(), io.StringIO()
    environ = {**os.environ, ENV_DISABLE_AUTOLOAD: "1"}
    code = main(argv, plugins=plugins, stdout=out, stderr=err, environ=environ)
    return int(code), out.getvalue(), err.getvalue()


def script(shell: str) -> str:
    code, out, err = run(["completion", shell])
    assert (code, err) == (0, "")
    return out


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    _, registry = own_commands()
    return build_parser(registry)


def subparsers(parser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.fixture
def tree(tmp_path) -> Path:
    """A --root tree: mlx5_0 (ports 1 and 2), rxe0 (port 1) and a device named HOSTILE."""
    ib = tmp_path / "tree" / "sys" / "class" / "infiniband"
    for dev, ports in (("mlx5_0", (1, 2)), ("rxe0", (1,)), (HOSTILE, (7,))):
        for p in ports:
            (ib / dev / "ports" / str(p)).mkdir(parents=True)
    return tmp_path / "tree"


# -- the command --------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_committed_script_is_what_the_command_prints(shell):
    assert COMMITTED[shell].read_text() == script(shell), REGENERATE


def test_an_unknown_shell_is_a_usage_error_in_one_line():
    code, out, err = run(["completion", "fish"])
    assert (code, out) == (ExitCode.USAGE, "")
    assert err == (
        "ibtool: error: no completion for shell 'fish': bash and zsh have one "
        "(hint: ibtool completion bash, or ibtool completion zsh)\n"
    )


def test_no_shell_is_a_usage_error_in_one_line():
    code, out, err = run(["completion"])
    assert (code, out) == (ExitCode.USAGE, "")
    assert (
        err.startswith("ibtool: error: which shell? bash or zsh (hint: ") and err.count("\n") == 1
    )


def test_a_plugin_s_command_and_options_are_completed_too():
    plugin = types.ModuleType("hello_plugin")

    def configure(p):
        p.add_argument("--who", choices=["world", "rdma"])
        p.add_argument("--greeting-file", metavar="FILE")

    @hookimpl
    def ibtool_register_commands(cli):
        cli.add("hello", lambda inv: None, help="say hello", configure=configure, aliases=("hi",))

    plugin.ibtool_register_commands = ibtool_register_commands
    code, out, _ = run(["completion", "bash"], plugins=[plugin])
    assert code == 0
    assert "hello|hi) _ibtool_name=hello ;;" in out
    assert "'hello --who') _ibtool_kind=choices _ibtool_r=(world rdma) ;;" in out
    assert "'hello --greeting-file'" in out and "hello) _ibtool_r=(-h --help" in out


# -- the parser, introspected --------------------------------------------------------------------


def test_the_recording_parser_lists_every_action_argparse_holds(parser):
    """`arguments` (public) is argparse's private `_actions`: nothing added is missed."""
    for p in [parser, *subparsers(parser).values()]:
        assert isinstance(p, RecordingParser)
        listed = [*p.arguments, *([p.subcommands] if p.subcommands else [])]
        assert sorted(map(id, listed)) == sorted(map(id, p._actions)), p.prog


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_every_command_alias_option_and_choice_is_in_the_script(parser, shell):
    text = script(shell)
    scopes = {s.name: s for s in completion.scopes(parser)}
    for name, sub in subparsers(parser).items():
        assert re.search(rf"^    _ibtool_r=\(.*(?<![\w-]){re.escape(name)}(?![\w-])", text, re.M)
        command = next(s for s in scopes.values() if name in s.names)
        offered = re.search(rf"^        {command.name}\) _ibtool_r=\((.*)\) ;;$", text, re.M)
        assert offered is not None, name
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            for o in action.option_strings:
                assert o in offered.group(1).split(), f"{name} {o}"
            for c in action.choices or ():
                assert re.search(rf"(?<![\w-]){re.escape(str(c))}(?![\w-])", text), f"{name} {c}"


def _kinds(parser) -> dict[str, str]:
    """'command option' -> kind, for every value Tab completes with something."""
    found = {}
    for s in completion.scopes(parser):
        for o, (kind, _) in s.values.items():
            if kind is not None and o not in ("--root", "--snapshot"):
                found[f"{s.name} {o}"] = kind
        for i, p in enumerate(s.positionals):
            if p.kind is not None:
                found[f"{s.name} #{i}"] = p.kind
    return found


def test_what_each_value_completes_with(parser):
    """The mapping, explicit: a new option naming a device, a port or a file changes it."""
    assert _kinds(parser) == {
        "counters #0": "devport",
        "dev #0": "devport",
        "doctor #0": "host",
        "doctor --compat": "choices",
        "doctor --dev": "devport",
        "fabric --via": "devport",
        "exporter --config": "file",
        "exporter --web.config.file": "file",
        "exporter --fabric-via": "devport",
        "fabric --against": "file",
        "fabric --state": "file",
        "fabric --thresholds": "file",
        "gids #0": "devport",
        "gids --port": "port",
        "gids --type": "choices",
        "health --config": "file",
        "health --state": "file",
        "health --textfile": "file",
        "loopback #0": "devport",
        "mesh --dev": "devport",
        "mesh --exclude": "devport",
        "mesh --rail": "devport",  # the DEV of DEV=N
        "mesh --mode": "choices",
        "mesh --plot": "file",
        "mesh --textfile": "file",
        "ping #0": "host",
        "ping --compat": "choices",
        "ping --dev": "devport",
        "ping --mode": "choices",
        "ping --mtu": "choices",
        "port #0": "devport",
        "res #0": "devport",
        "snapshot #0": "file",
        "snapshot --via": "devport",
        "tui --config": "file",
    }
    for s in completion.scopes(parser):
        assert s.values["--root"] == ("dir", []) and s.values["--snapshot"] == ("file", [])


SUSPECT = re.compile(r"dev|port|file|path|dir|host|peer|root|snapshot|config|state", re.I)


def test_every_option_that_may_name_a_device_port_or_file_is_decided(parser):
    """An option whose name or metavar speaks of one is completed by its metavar's kind or is
    in completion.KINDS (None there: it names something else, a TCP port)."""
    undecided = []
    for name, sub in [("", parser), *subparsers(parser).items()]:
        if name and sub.prog.split()[-1] != name:
            continue  # an alias
        for a in sub.arguments:
            said = " ".join([*a.option_strings, a.dest, str(a.metavar or "")])
            if a.nargs == 0 or a.choices or not SUSPECT.search(said):
                continue
            names = [*a.option_strings, a.dest]
            if any((name, n) in completion.KINDS for n in names):
                continue
            if completion.metavar_kind(a.metavar if isinstance(a.metavar, str) else None):
                continue
            if a.dest in ("snapshot_limit",):  # NAME=VALUE: limits, said in ibtool(8)
                continue
            undecided.append(f"{name} {names[0]} {a.metavar}")
    assert undecided == []


@pytest.mark.parametrize(
    "metavar, kind",
    [
        ("DEV[/PORT]", "devport"),
        ("[show] [DEV[/PORT]]", "devport"),
        ("DEV", "dev"),
        ("DIR", "dir"),
        ("FILE", "file"),
        ("FILE.png", "file"),
        ("PATH.prom", "file"),
        ("ADDR:PORT", None),
        ("NAME=VALUE", None),
        ("NETDEV|IP", None),
        (None, None),
    ],
)
def test_metavar_kind(metavar, kind):
    assert completion.metavar_kind(metavar) == kind


def test_a_word_the_script_cannot_hold_is_refused():
    p = RecordingParser(prog="x")
    p.add_argument("--mode", choices=["a b", "$(x)"])
    with pytest.raises(ValueError, match="not a word the completion script can hold"):
        completion.scopes(p)


# -- bash ---------------------------------------------------------------------------------------


def bash_complete(line: list[str], cwd: Path) -> list[str]:
    """COMPREPLY of the bash script for COMP_WORDS=line, the cursor on its last word."""
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    program = (
        'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); '
        'COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; _ibtool; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    proc = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program, "bash", COMMITTED["bash"], *line],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=20,
    )
    assert proc.stderr == ""
    return [w for w in proc.stdout.split("\n") if w]


def test_bash_syntax():
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    proc = subprocess.run(["bash", "-n", COMMITTED["bash"]], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize(
    "line, expected",
    [
        (["ibtool", "pi"], ["ping"]),
        (["ibtool", "p"], ["ping", "plugins", "port"]),
        (["ibtool", "-j", "st"], ["stats"]),
        (["ibtool", "--ro"], ["--root"]),
        (
            ["ibtool", "ping", "--m"],
            ["--mtu", "--mode", "--max-sessions", "--max-per-source", "--max-rate", "--max-memory"],
        ),
        (["ibtool", "ping", "--mode", ""], ["send", "write-imm"]),
        (["ibtool", "ping", "--mtu", "1"], ["1024"]),
        (["ibtool", "gid", "--type", ""], ["ib", "v1", "v2"]),
        (["ibtool", "gids", "--type", "=", "v"], ["v1", "v2"]),
        (["ibtool", "gids", "--type=v"], ["--type=v1", "--type=v2"]),
        (["ibtool", "snapshot", ""], ["save", "show", "diff"]),
        (["ibtool", "system", "s"], ["show", "set"]),
        (["ibtool", "completion", ""], ["bash", "zsh"]),
        (["ibtool", "ping", "-c", "3", "--interval", ""], []),
        # -p no:NAME blocks a plugin (readline splits it at the colon); a bare -p is --pretty
        (["ibtool", "-p", "no", ":", "ping", "pi"], ["ping"]),
        (["ibtool", "-p", "no:ping", "-j", "pi"], ["ping"]),
        (["ibtool", "-p", "pi"], ["ping"]),
    ],
)
def test_bash_completes_commands_options_and_choices(tmp_path, line, expected):
    assert bash_complete(line, tmp_path) == expected


def test_bash_completes_the_options_of_ping(tmp_path):
    got = bash_complete(["ibtool", "ping", "-"], tmp_path)
    for o in ("-h", "--server", "--dev", "--port", "-c", "--count", "-W", "--allow", "--json"):
        assert o in got
    assert "--type" not in got and "-V" not in got


def test_bash_completes_device_names_from_the_root_tree(tree, tmp_path):
    got = bash_complete(["ibtool", "--root", str(tree), "dev", ""], tmp_path)
    assert got[0] == "show"
    assert sorted(got[1:]) == sorted(["mlx5_0", "rxe0", _bash_quoted(HOSTILE)])
    assert bash_complete(["ibtool", "--root", str(tree), "port", "m"], tmp_path) == ["mlx5_0"]
    assert bash_complete(["ibtool", "port", "--root", str(tree), "show", "r"], tmp_path) == ["rxe0"]


def test_bash_completes_dev_port(tree, tmp_path):
    root = ["ibtool", "--root", str(tree)]
    assert bash_complete([*root, "gids", "mlx5_0/"], tmp_path) == ["mlx5_0/1", "mlx5_0/2"]
    assert bash_complete([*root, "ping", "--dev", "rxe0/"], tmp_path) == ["rxe0/1"]
    assert bash_complete([*root, "doctor", "--dev", "mlx"], tmp_path) == ["mlx5_0"]
    # readline splits --root=DIR at the =
    split = ["ibtool", "--root", "=", str(tree), "counters", "show", "mlx5_0/2"]
    assert bash_complete(split, tmp_path) == ["mlx5_0/2"]
    assert bash_complete(["ibtool", f"--root={tree}", "loopback", "rx"], tmp_path) == ["rxe0"]


def test_bash_completes_port_numbers(tree, tmp_path):
    got = bash_complete(["ibtool", "--root", str(tree), "gids", "--port", ""], tmp_path)
    assert sorted(got) == ["1", "2", "7"]


def test_bash_reads_no_device_without_a_tree(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bash_complete(["ibtool", "--root", str(empty), "dev", "m"], tmp_path) == []
    assert bash_complete(["ibtool", "--root", str(empty), "dev", "m/"], tmp_path) == []


def test_bash_completes_files_and_directories(tmp_path):
    (tmp_path / "node.prom").write_text("")
    (tmp_path / "nodes").mkdir()
    got = bash_complete(["ibtool", "health", "--textfile", "no"], tmp_path)
    assert sorted(got) == ["node.prom", "nodes"]
    assert bash_complete(["ibtool", "--root", "no"], tmp_path) == ["nodes"]
    assert sorted(bash_complete(["ibtool", "snapshot", "diff", "a", "no"], tmp_path)) == [
        "node.prom",
        "nodes",
    ]


def _bash_quoted(word: str) -> str:
    proc = subprocess.run(["bash", "-c", 'printf %q "$1"', "bash", word], capture_output=True)
    return proc.stdout.decode()


def test_bash_never_runs_a_device_s_name(tree, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    got = bash_complete(["ibtool", "--root", str(tree), "dev", "a"], cwd)
    assert got == [_bash_quoted(HOSTILE)]
    got = bash_complete(["ibtool", "--root", str(tree), "gids", HOSTILE + "/"], cwd)
    assert got == [_bash_quoted(HOSTILE + "/7")]
    assert sorted(os.listdir(cwd)) == []


# -- zsh ----------------------------------------------------------------------------------------


def zsh() -> str:
    path = shutil.which("zsh")
    if path is None:
        pytest.skip("zsh is not installed (Debian: apt-get install zsh)")
    return path


def test_zsh_syntax():
    proc = subprocess.run([zsh(), "-n", COMMITTED["zsh"]], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")


ZSHRC = r"""
PROMPT='' RPROMPT='' PS2=''
fpath=({fpath} $fpath)
autoload -Uz compinit && compinit -u -D
bindkey '^I' complete-word
_capture_start() {{ print -r -- '<<START>>' }}
_capture_end() {{ print -r -- '<<END>>'; exit }}
compprefuncs=(_capture_start)
comppostfuncs=(_capture_end)
compadd() {{
    if [[ ${{@[1,(i)(-|--)]}} == *-(O|A|D)\ * ]]; then
        builtin compadd "$@"
        return $?
    fi
    local -a __hits
    builtin compadd -A __hits "$@"
    local h
    for h in "${{__hits[@]}}"; do print -r -- "HIT:$IPREFIX$h"; done
    builtin compadd "$@"
}}
print -r -- '<<READY>>'
"""


def zsh_complete(line: str, cwd: Path, home: Path) -> list[str]:
    """What a real interactive zsh, compinit'ed with completion/ in $fpath, offers when Tab
    is pressed after `line` (each match as compadd takes it, quoted for the line)."""
    home.mkdir(exist_ok=True)
    (home / ".zshrc").write_text(ZSHRC.format(fpath=COMMITTED["zsh"].parent))
    env = {"ZDOTDIR": str(home), "HOME": str(home), "TERM": "dumb", "PATH": os.environ["PATH"]}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [zsh(), "-i"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    os.close(slave)
    out, sent = b"", False
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and b"<<END>>" not in out:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if not sent and b"<<READY>>" in out:
                os.write(master, line.encode() + b"\t")
                sent = True
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    text = out.decode(errors="replace").replace("\r", "")
    assert "<<END>>" in text, f"no completion ran: {text!r}"
    done = text.split("<<START>>", 1)[1].split("<<END>>", 1)[0]
    return [h[4:] for h in done.splitlines() if h.startswith("HIT:")]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("ibtool pi", ["ping"]),
        ("ibtool ping --mo", ["--mode"]),
        ("ibtool ping --mode ", ["send", "write-imm"]),
        ("ibtool gids --type=v", ["--type=v1", "--type=v2"]),
        ("ibtool completion ", ["bash", "zsh"]),
        ("ibtool -p no:ping -j pi", ["ping"]),
    ],
)
def test_zsh_completes_in_a_real_shell(tmp_path, line, expected):
    assert zsh_complete(line, tmp_path, tmp_path / "home") == expected


def test_zsh_completes_devices_and_ports_of_the_root_tree(tree, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    home = tmp_path / "home"
    got = zsh_complete(f"ibtool --root {tree} dev ", cwd, home)
    assert got[0] == "show"
    assert sorted(got[1:]) == sorted(["mlx5_0", "rxe0", _zsh_quoted(HOSTILE)])
    assert zsh_complete(f"ibtool --root={tree} ping --dev=mlx5_0/", cwd, home) == [
        "--dev=mlx5_0/1",
        "--dev=mlx5_0/2",
    ]
    assert sorted(zsh_complete(f"ibtool --root {tree} gids --port ", cwd, home)) == [
        "1",
        "2",
        "7",
    ]
    assert zsh_complete(f"ibtool --root {tree} dev a", cwd, home) == [_zsh_quoted(HOSTILE)]
    assert zsh_complete(f"ibtool --root '{tree}' port r", cwd, home) == ["rxe0"]  # unquoted
    assert sorted(os.listdir(cwd)) == []


def test_zsh_completes_files(tmp_path):
    (tmp_path / "node.prom").write_text("")
    got = zsh_complete("ibtool health --textfile no", tmp_path, tmp_path / "home")
    assert got == ["node.prom"]


def _zsh_quoted(word: str) -> str:
    proc = subprocess.run([zsh(), "-fc", "print -rn -- ${(q)1}", "zsh", word], capture_output=True)
    return proc.stdout.decode()

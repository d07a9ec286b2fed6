"""Argument parsing, global options, plugin loading and exit codes: the only place that exits."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence

from ibtool import __version__
from ibtool.errors import ExitCode, IbtoolError, OutputError, Terminated, UsageError
from ibtool.model.names import escaped

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the way to --version
if TYPE_CHECKING:  # imported past `--version`'s fast path, where a command is run
    from typing import TextIO

    from ibtool.plugin.commands import CommandRegistry, HostFactory, Invocation

PROG = "ibtool"


class _Warnings:
    """Diagnostics on stderr, each distinct message once."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.seen:
            self.seen.add(message)
            self.err.write(f"{PROG}: warning: {escaped(message)}\n")


def split_plugin_blocks(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Take `-p no:NAME` / `-pno:NAME` out of argv; a bare -p stays (it means --pretty)."""
    rest, blocked = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == "-p" and i + 1 < len(argv) and argv[i + 1].startswith("no:"):
            blocked.append(argv[i + 1][3:])
            i += 2
            continue
        if arg.startswith("-pno:"):
            blocked.append(arg[5:])
        else:
            rest.append(arg)
        i += 1
    return rest, blocked


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    d = {"default": argparse.SUPPRESS} if suppress else {}
    g = parser.add_argument_group("global options")
    g.add_argument("-j", "--json", action="store_true", help="JSON output", **d)
    g.add_argument("-p", "--pretty", action="store_true", help="indented JSON (implies -j)", **d)
    g.add_argument("-d", "--details", action="store_true", help="more fields (verbs, decodes)", **d)
    g.add_argument(
        "--root",
        metavar="DIR",
        help="read DIR/sys/class/infiniband instead of /",
        **({"default": argparse.SUPPRESS} if suppress else {"default": "/"}),
    )
    g.add_argument(
        "--snapshot",
        metavar="FILE",
        help="read a snapshot (ibtool snapshot save) instead of this host",
        **({"default": argparse.SUPPRESS} if suppress else {"default": None}),
    )
    g.add_argument(
        "--snapshot-limit",
        action="append",
        metavar="NAME=VALUE",
        help="raise a limit on what a snapshot may hold: size, expanded, entries, path, depth",
        **({"default": argparse.SUPPRESS} if suppress else {"default": None}),
    )
    g.add_argument("--debug", action="store_true", help="show tracebacks of errors", **d)


class _Recording:
    """An argument group (or mutually exclusive group) whose add_argument also lists the
    action in the parser's `arguments`; anything else is the group's own."""

    def __init__(self, group, arguments: list[argparse.Action]) -> None:
        self.group = group
        self.arguments = arguments

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = self.group.add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    def add_argument_group(self, *args, **kwargs) -> _Recording:
        return _Recording(self.group.add_argument_group(*args, **kwargs), self.arguments)

    def add_mutually_exclusive_group(self, *args, **kwargs) -> _Recording:
        return _Recording(self.group.add_mutually_exclusive_group(*args, **kwargs), self.arguments)

    def __getattr__(self, name: str):
        return getattr(self.group, name)


class RecordingParser(argparse.ArgumentParser):
    """An ArgumentParser that says what it holds through public attributes, for `ibtool
    completion` (argparse keeps its actions in private ones): `arguments`, every action added
    to it (through its groups too), in order; `subcommands`, its add_subparsers() action (whose
    `choices` map each command name and alias to the command's parser, a RecordingParser)."""

    def __init__(self, *args, **kwargs) -> None:
        self.arguments: list[argparse.Action] = []
        self.subcommands: argparse.Action | None = None
        self._built = False  # argparse's own groups (positionals, options) stay unwrapped
        super().__init__(*args, **kwargs)
        self._built = True

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    def add_argument_group(self, *args, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        return _Recording(group, self.arguments) if self._built else group

    def add_mutually_exclusive_group(self, *args, **kwargs):
        return _Recording(super().add_mutually_exclusive_group(*args, **kwargs), self.arguments)

    def add_subparsers(self, *args, **kwargs):
        self.subcommands = super().add_subparsers(*args, **kwargs)
        return self.subcommands


def _parser_class(out: TextIO, err: TextIO) -> type[argparse.ArgumentParser]:
    class Parser(RecordingParser):
        # argparse writes to sys.stdout/sys.stderr itself; route it to main()'s streams.
        def _print_message(self, message, file=None):
            if message:
                (err if file is sys.stderr else out).write(message)

    return Parser


class _VersionAction(argparse.Action):
    """-V/--version where the fast path in main() did not see it (after a global option's
    value): the same lines, through the parser's stream."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(_version_text(), sys.stdout)
        parser.exit()


def _version_text() -> str:
    from ibtool.sources.versions import report

    return "".join(f"{line}\n" for line in report(__version__))


def build_parser(
    registry: CommandRegistry,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    only: str | None = None,
) -> argparse.ArgumentParser:
    """The whole command line's parser. `only`: the command being run (a name or an alias):
    the parser then holds that command alone, with its options, as argparse reads nothing of
    the others once the command word is given (its choices and help are the whole parser's)."""
    parser = _parser_class(out or sys.stdout, err or sys.stderr)(
        prog=PROG,
        description="RDMA management and diagnostics: ibtool OBJECT [show] [DEV[/PORT]] ...",
        epilog="-p no:NAME blocks plugin NAME. See ibtool(8) for exit codes.",
    )
    parser.add_argument(
        "-V",
        "--version",
        action=_VersionAction,
        help="print the versions of ibtool, Python, pyverbs, rdma-core and the kernel, and exit",
    )
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="OBJECT")
    for command in sorted(registry.commands.values(), key=lambda c: c.name):
        if only is not None and only not in (command.name, *command.aliases):
            continue
        p = sub.add_parser(
            command.name, aliases=list(command.aliases), help=command.help, description=command.help
        )
        _global_options(p, suppress=True)
        if command.configure:
            command.configure(p)
        p.set_defaults(_command=command)
    return parser


# The global options that take a value, as argparse matches them: whole, or a unique prefix
# of the long name (`--ro DIR`), or joined to it (`--root=DIR`).
_VALUED = ("--root", "--snapshot", "--snapshot-limit")


def invoked(argv: Sequence[str], names: Iterable[str]) -> str | None:
    """The command word of `argv` (blocks taken out) when it is one of `names`, as argparse
    will find it: the first word that is neither an option nor a global option's value. None
    when it is not a command's or may not be where argparse finds it (an ambiguous option):
    the whole parser is built then, and says what is wrong."""
    known = set(names)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or arg == "-":
            return None
        if not arg.startswith("-"):
            return arg if arg in known else None
        if "--help".startswith(arg) if arg.startswith("--") else "h" in arg:
            return None  # the whole parser's help
        if arg.startswith("--") and "=" not in arg:
            matches = [o for o in _VALUED if o.startswith(arg)]
            if arg in _VALUED or len(matches) == 1:
                i += 1  # its value
            elif len(matches) > 1:
                return None  # ambiguous: argparse's error, from the whole parser
        i += 1
    return None


def register_commands(plugins, registry: CommandRegistry, warn) -> None:
    """Every plugin's commands, ibtool's own first, then the others in load order: of two
    plugins registering one name, ibtool's own keeps it, else the first loaded
    (CommandRegistry)."""
    import io

    from ibtool.plugin.manager import fault

    registry.warn = warn
    registry.builtin = plugins.builtin
    # Called plugin by plugin so that one broken registration costs only that plugin.
    for impl in plugins.hookimpls("ibtool_register_commands"):
        registry.current_plugin = impl.plugin_name
        try:
            impl.function(cli=registry)
        except KeyboardInterrupt:  # the user's Ctrl-C (or SIGTERM: Terminated)
            raise
        except BaseException as e:  # SystemExit too: a plugin never decides the exit status
            registry.withdraw(impl.plugin_name)
            warn(f"plugin {impl.plugin_name} failed to register commands: {fault(e)}")
    registry.current_plugin = None
    # build_parser calls every command's configure, and a fault there would end every command:
    # another plugin's is tried first on a parser of its own, and a failing one is left out.
    for command in list(registry.commands.values()):
        if command.configure is None or plugins.builtin(command.plugin) is not None:
            continue
        parser = _parser_class(io.StringIO(), io.StringIO())(prog=f"{PROG} {command.name}")
        _global_options(parser, suppress=True)
        try:
            command.configure(parser)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # argparse's error() is a SystemExit
            registry.remove(command.name)
            said = f"command {command.name!r} not registered: its options: {fault(e)}"
            warn(f"plugin {command.plugin}: {said}")


def plugins_command(registry: CommandRegistry, plugins) -> None:
    """Register `ibtool plugins`: the plugins loaded, their versions and hooks."""
    from ibtool.views import render

    fields = [
        render.Field("name", lambda i: i.name, label=""),
        render.Field("version", lambda i: i.version),
        render.Field("distribution", lambda i: i.distribution, label="from"),
        render.Field("essential", lambda i: i.essential or None, text=lambda v: "yes"),
        render.Field("hooks", lambda i: list(i.hooks), text=",".join),
    ]

    def run(inv: Invocation) -> None:
        infos = plugins.describe()
        if inv.json:
            inv.emit_json([render.record_json(i, fields, True) for i in infos])
        else:
            for i in infos:
                inv.print(render.record_line(i, fields, True))

    registry.current_plugin = "core"
    registry.add("plugins", run, help="list loaded plugins, their versions and hooks")
    registry.current_plugin = None


def _snapshot_limits(settings: list[str] | None):
    if not settings:
        return None
    from ibtool.snapshot import limits as snaplimits

    return snaplimits.parse(settings)


def _replayed_answer_unusable(e: Exception) -> Exception | None:
    """A snapshot is untrusted input: what a command could not make of an answer it replayed
    is the file's damage (exit 7), not a bug of ibtool's (70)."""
    from ibtool import snapshot

    return snapshot.replayed_damage(e)


def _print_traceback(err: TextIO) -> None:
    import traceback  # --debug's: no other run pays for it

    traceback.print_exc(file=err)


def _terminate(signum, frame):
    raise Terminated


def _unwind_on_sigterm():
    """SIGTERM unwinds like Ctrl-C, so every QP, CQ, MR and PD is destroyed on the way out."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminate)


class _Stdout:
    """main()'s standard output: whatever the stream, a write or flush that fails is an
    OutputError, so that it is told from a broken socket and from a bug."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream  # None: Python found descriptor 1 closed at startup (`>&-`)

    def _failed(self, e: Exception) -> OutputError:
        if isinstance(e, BrokenPipeError):
            return OutputError("its reader went away", broken_pipe=True)
        if isinstance(e, OSError):
            return OutputError(e.strerror or str(e))
        return OutputError("it is closed")

    def write(self, text: str) -> int:
        if self.stream is None:
            raise OutputError("it is closed")
        try:
            return self.stream.write(text)
        except OSError as e:
            raise self._failed(e) from None
        except ValueError as e:  # a closed file object; an encoding error is not ours to say
            if not getattr(self.stream, "closed", False):
                raise
            raise self._failed(e) from None

    def flush(self) -> None:
        if self.stream is None or getattr(self.stream, "closed", False):
            return  # nothing was written to it, or write() said so already
        try:
            self.stream.flush()
        except OSError as e:
            raise self._failed(e) from None

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _discard(stream: TextIO | None) -> None:
    """Point the stream's descriptor at /dev/null: what it still buffers cannot be written, and
    the interpreter's last flush at exit must not fail on it again."""
    try:
        fd = stream.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(
    argv: Sequence[str] | None = None,
    *,
    plugins: Iterable[object] = (),
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    host_factory: HostFactory | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run ibtool with `argv` and return its exit status. `plugins`: plugin objects loaded
    beside the installed ones; `stdout`, `stderr`: where it writes; `host_factory`: what builds
    the host the commands read (not a --snapshot's) from the invocation (default: the running
    host or the --root tree, plugin.commands.default_host); `environ`: where plugin loading
    reads IBTOOL_PLUGINS and IBTOOL_DISABLE_PLUGIN_AUTOLOAD (default: the process's
    environment)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = _Stdout(stdout if stdout is not None else sys.stdout)
    err = stderr or sys.stderr
    try:
        code = _main(argv, plugins, out, err, host_factory, environ)
        out.flush()
        return code
    except OutputError as e:
        _discard(out.stream)
        if e.broken_pipe:
            return ExitCode.OK  # `ibtool gids | head`: the reader left; say nothing more.
        err.write(f"{PROG}: error: cannot write standard output: {e.reason}\n")
        return ExitCode.IO_ERROR


def _main(
    argv: list[str],
    plugins: Iterable[object],
    out: _Stdout,
    err: TextIO,
    host_factory: HostFactory | None,
    environ: Mapping[str, str] | None,
) -> int:
    warn = _Warnings(err)
    debug = "--debug" in argv
    leading = argv[: next((i for i, a in enumerate(argv) if a[:1] != "-"), len(argv))]
    if "-V" in leading or "--version" in leading:
        out.write(_version_text())  # before plugin loading: the fast path
        return ExitCode.OK
    try:
        argv, blocked = split_plugin_blocks(argv)
        from ibtool.plugin.commands import CommandRegistry, Invocation, default_host
        from ibtool.plugin.manager import build_plugins

        loaded = build_plugins(blocked=blocked, extra=plugins, warn=warn, environ=environ)
        registry = CommandRegistry()
        register_commands(loaded, registry, warn)
        plugins_command(registry, loaded)
        only = invoked(argv, registry.names())
        parser = build_parser(registry, out, err, only=only)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse: --help, --version, or a usage error (already printed)
            return int(e.code or 0)
        command = getattr(args, "_command", None)
        if command is None:
            err.write(parser.format_help())
            return ExitCode.USAGE
        inv = Invocation(
            args=args,
            json=args.json or args.pretty,
            pretty=args.pretty,
            details=args.details,
            root=args.root,
            snapshot=args.snapshot,
            snapshot_limits=_snapshot_limits(args.snapshot_limit),
            out=out,
            warn=warn,
            plugins=loaded,
            host_factory=host_factory or default_host,
            parser=parser,
            whole_parser=None if only is None else lambda: build_parser(registry, out, err),
        )
        if inv.root != "/" and not os.path.isdir(inv.root):
            raise UsageError(f"--root {inv.root}: not a directory")
        if inv.root != "/" and inv.snapshot is not None:
            raise UsageError("--root and --snapshot both name what to read", "give one of them")
        previous = _unwind_on_sigterm()
        try:
            code = command.run(inv)
        except Exception as e:
            damaged = _replayed_answer_unusable(e)
            if damaged is None:
                raise
            raise damaged from e
        finally:
            inv.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return ExitCode.OK if code is None else int(code)
    except IbtoolError as e:
        if debug:
            _print_traceback(err)
        hint = f" (hint: {e.hint})" if e.hint else ""
        err.write(f"{PROG}: error: {escaped(e.message + hint)}\n")
        return e.exit_code
    except Terminated:
        err.write(f"{PROG}: terminated\n")
        return ExitCode.TERMINATED
    except KeyboardInterrupt:
        err.write(f"{PROG}: interrupted\n")
        return ExitCode.INTERRUPTED
    except OutputError:
        raise  # main() says it
    except Exception as e:
        if debug:
            _print_traceback(err)
        else:
            err.write(
                f"{PROG}: internal error: {type(e).__name__}: {escaped(str(e))} "
                "(run with --debug for the traceback)\n"
            )
        return ExitCode.INTERNAL

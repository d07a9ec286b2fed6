"""`ibtool completion bash|zsh`: the shell's completion script, generated from the parser ibtool
parsed this very command line with (every command and alias of the plugins loaded, their
options, the global options, the values of each `choices=`), so that it follows the code.

What an option's value or a positional word names, and so how Tab completes it, is its KIND:
the metavar says it where it can (DEV[/PORT], FILE, PATH, DIR), and KINDS says it where it
cannot (a --port that is an RDMA port number, or a TCP one). Device names and port numbers are
not known here: the script lists DIR/sys/class/infiniband (DIR: a --root given earlier on the
line, else /) when Tab is pressed, in the shell, without starting Python; nothing it reads
there is ever evaluated.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass

from ibtool.api import Invocation, UsageError, hookimpl

# How Tab completes a value:
#   choices  the values of the option's choices=
#   file     a file name;  dir: a directory name;  host: a host name
#   dev      an RDMA device name, read live;  devport: DEV or DEV/PORT, read live
#   port     an RDMA port number (those of every device), read live
#   None     nothing (a number, an address, a name only the user knows)
KIND_NAMES = ("choices", "file", "dir", "host", "dev", "devport", "port")

# (command, option string or positional dest) -> kind, where the metavar does not say it. An
# option whose name or metavar speaks of a device, a port, a file, a directory or a host must
# be here or be told by its metavar (tests/unit/test_completion.py holds that).
KINDS: dict[tuple[str, str], str | None] = {
    ("gids", "--port"): "port",  # an RDMA port number, 0 to 255
    ("ping", "--port"): None,  # the server's TCP port
    ("doctor", "--port"): None,  # the TCP port of the peer's ping server
    ("mesh", "--tcp-port"): None,
    ("mesh", "--listen"): None,  # ADDR[:PORT] the agents join
    ("mesh", "--connect"): None,  # an agent's: the coordinator's ADDR:PORT
    ("exporter", "--listen"): None,  # ADDR:PORT to serve HTTP on
    ("fabric", "--against"): "file",  # a snapshot file
    ("ping", "--bind"): None,  # an address of this host
    ("gids", "--netdev"): None,  # a netdev, not an RDMA device
    ("gids", "--best"): None,  # a netdev or an IP address
    ("ping", "host"): "host",
    ("doctor", "peer"): "host",
}

# A word of a shell script this module writes unquoted: option strings, command names,
# choices, keywords. Anything else in the parser is refused rather than quoted.
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:+@%=-]*|-[A-Za-z0-9-][A-Za-z0-9_.,:+@%=-]*")


def metavar_kind(metavar: str | None) -> str | None:
    """The kind a metavar names: DEV[/PORT], DEV, DIR, FILE (FILE.png), PATH (PATH.prom)."""
    m = metavar or ""
    if re.search(r"\bDEV\b", m):
        return "devport" if re.search(r"\bDEV\[?/PORT\b", m) else "dev"
    if re.search(r"\bDIR\b", m):
        return "dir"
    if re.search(r"\b(FILE|PATH)\b", m):
        return "file"
    return None


def kind_of(command: str, action: argparse.Action) -> str | None:
    """How Tab completes the value of `action` (an option or a positional) of `command` ("" for
    ibtool's own options, before the command)."""
    for name in (*action.option_strings, action.dest):
        if (command, name) in KINDS:
            return KINDS[(command, name)]
    if action.choices and action.option_strings:
        return "choices"
    return metavar_kind(action.metavar if isinstance(action.metavar, str) else None)


def keywords(action: argparse.Action) -> list[str]:
    """The literal words a positional's first word may be: its choices, else the lower-case
    words of its metavar (`show | set NAME VALUE`: show, set)."""
    if action.choices:
        return [str(c) for c in action.choices]
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    found: list[str] = []
    for word in re.findall(r"[A-Za-z][A-Za-z0-9_.-]*", metavar):
        if word.islower() and word not in found:
            found.append(word)
    return found


@dataclass
class Positional:
    keywords: list[str]
    kind: str | None
    repeats: bool  # nargs * or +: every word after it is one more
    optional_keyword: bool  # `[show] ...`: the first word is a keyword or already of its kind


@dataclass
class Scope:
    """What completes before the command (name "") or within one."""

    name: str
    names: tuple[str, ...]  # the command's name and aliases
    options: list[str]  # the option strings offered, in the parser's order (not hidden ones)
    values: dict[str, tuple[str | None, list[str]]]  # option string -> (kind, choices)
    positionals: list[Positional]


def _plain(word: str) -> str:
    if not _PLAIN.fullmatch(word):
        raise ValueError(f"{word!r}: not a word the completion script can hold")
    return word


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    arguments = getattr(parser, "arguments", None)
    if arguments is None:
        raise TypeError("a parser of ibtool.cli (RecordingParser) is needed")
    return list(arguments)


def _scope(name: str, names: tuple[str, ...], parser: argparse.ArgumentParser) -> Scope:
    scope = Scope(name, names, [], {}, [])
    for action in _arguments(parser):
        if not action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            scope.positionals.append(
                Positional(
                    [_plain(k) for k in keywords(action)],
                    kind_of(name, action),
                    action.nargs in ("*", "+", argparse.REMAINDER),
                    bool(re.search(r"\[[a-z]", action.metavar or "")),
                )
            )
            continue
        strings = [_plain(o) for o in action.option_strings]
        if action.help != argparse.SUPPRESS:
            scope.options += strings
        if action.nargs == 0:
            continue
        kind = kind_of(name, action)
        choices = [_plain(str(c)) for c in action.choices or ()] if kind == "choices" else []
        for o in strings:
            scope.values[o] = (kind, choices)
    return scope


def scopes(parser: argparse.ArgumentParser) -> list[Scope]:
    """ibtool's own options (scope ""), then every command's, by name."""
    found = [_scope("", (), parser)]
    sub = getattr(parser, "subcommands", None)
    if sub is None:
        return found
    names: dict[int, list[str]] = {}
    parsers: dict[int, argparse.ArgumentParser] = {}
    for n, p in sub.choices.items():
        names.setdefault(id(p), []).append(n)
        parsers[id(p)] = p
    for key, ns in names.items():
        # the first name argparse lists a parser under is the command's, the others aliases
        command, aliases = ns[0], sorted(ns[1:])
        found.append(_scope(command, (command, *aliases), parsers[key]))
    found[1:] = sorted(found[1:], key=lambda s: s.name)
    for s in found[1:]:
        _plain(s.name)
    return found


# -- the two scripts' shared part: data as `case` statements, the same in bash and zsh ---------


def _words(words: list[str]) -> str:
    return " ".join(words)


def _data(found: list[Scope]) -> list[str]:
    commands = [n for s in found[1:] for n in s.names]
    lines = [
        "# Generated from ibtool's argument parser by `ibtool completion`: do not edit.",
        "",
        "# The command names and aliases.",
        "_ibtool_commands() {",
        f"    _ibtool_r=({_words(commands)})",
        "}",
        "",
        "# A command's name or alias -> its name (empty when it is none).",
        "_ibtool_command() {",
        "    case $1 in",
    ]
    for s in found[1:]:
        lines.append(f"        {'|'.join(s.names)}) _ibtool_name={s.name} ;;")
    lines += [
        "        *) _ibtool_name= ;;",
        "    esac",
        "}",
        "",
        '# The options of a command ("": ibtool\'s own, before the command).',
        "_ibtool_options() {",
        "    case $1 in",
    ]
    for s in found:
        lines.append(f"        {s.name or chr(39) * 2}) _ibtool_r=({_words(s.options)}) ;;")
    lines += [
        "        *) _ibtool_r=() ;;",
        "    esac",
        "}",
        "",
        "# Whether option $2 of command $1 takes a value, and its kind and choices.",
        "_ibtool_value() {",
        "    _ibtool_kind= _ibtool_r=()",
        '    case "$1 $2" in',
    ]
    for s in found:
        by: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for o, (kind, choices) in s.values.items():
            by.setdefault((kind or "", tuple(choices)), []).append(o)
        for (kind, choices), options in by.items():
            pattern = "|".join(f"'{s.name} {o}'" for o in options)
            body = f"_ibtool_kind={kind or 'none'}"
            if choices:
                body += f" _ibtool_r=({_words(list(choices))})"
            lines.append(f"        {pattern}) {body} ;;")
    lines += [
        "        *) return 1 ;;",
        "    esac",
        "}",
        "",
        "# Positional word $2 (0: the first after the command) of command $1: its kind, and the",
        "# keywords it may be.",
        "_ibtool_positional() {",
        "    _ibtool_kind= _ibtool_r=()",
        "    case $1 in",
    ]
    for s in found[1:]:
        if not s.positionals:
            continue
        branches = []
        at = 0
        for p in s.positionals:
            body = f"_ibtool_kind={p.kind or 'none'}"
            first = body
            if p.keywords:
                first = f"_ibtool_kind={(p.kind if p.optional_keyword else None) or 'none'}"
                first += f" _ibtool_r=({_words(p.keywords)})"
            if p.repeats:
                branches.append(f"{at}) {first} ;;")
                branches.append(f"*) (( $2 > {at} )) && {body} ;;")
                break
            branches.append(f"{at}) {first} ;;")
            at += 1
        lines.append(f"        {s.name})")
        lines.append("            case $2 in")
        lines += [f"                {b}" for b in branches]
        lines.append("            esac ;;")
    lines += [
        "    esac",
        "}",
        "",
    ]
    return lines


# The walk over the words before the cursor, the same in both shells but for how words are
# numbered: sets _ibtool_cmd (the command's name), _ibtool_root (--root's DIR), _ibtool_n (the
# positional word the cursor is on), _ibtool_expect (the option whose value it is).
_WALK = """\
    local _ibtool_cmd= _ibtool_root=/ _ibtool_n=0 _ibtool_expect= _ibtool_dd= _ibtool_w
    local _ibtool_name _ibtool_kind _ibtool_block=
    local -a _ibtool_r
    for _ibtool_w in "${_ibtool_before[@]}"; do
        # -p no:NAME (a plugin blocked), which readline splits into -p, no, :, NAME
        case $_ibtool_block in
            p)
                _ibtool_block=
                [[ $_ibtool_w == no:* ]] && continue
                [[ $_ibtool_w == no ]] && _ibtool_block=colon && continue
                ;;
            colon)
                _ibtool_block=
                [[ $_ibtool_w == : ]] && _ibtool_block=name && continue
                ;;
            name) _ibtool_block= && continue ;;
        esac
        if [[ -n $_ibtool_expect ]]; then
            [[ $_ibtool_w == = ]] && continue
            [[ $_ibtool_expect == --root ]] && _ibtool_root=$_ibtool_w
            _ibtool_expect=
            continue
        fi
        if [[ -z $_ibtool_dd && $_ibtool_w == -?* ]]; then
            if [[ $_ibtool_w == -- ]]; then
                _ibtool_dd=1
            elif [[ $_ibtool_w == -p ]]; then
                _ibtool_block=p
            elif [[ $_ibtool_w == --*=* ]]; then
                [[ ${_ibtool_w%%=*} == --root ]] && _ibtool_root=${_ibtool_w#*=}
            elif _ibtool_value "$_ibtool_cmd" "$_ibtool_w"; then
                _ibtool_expect=$_ibtool_w
            fi
        elif [[ -z $_ibtool_cmd ]]; then
            _ibtool_command "$_ibtool_w"
            _ibtool_cmd=${_ibtool_name:-?}
        else
            (( _ibtool_n++ ))
        fi
    done
    [[ $_ibtool_root == '~'/* ]] && _ibtool_root=$HOME/${_ibtool_root#'~'/}
"""


def _bash(found: list[Scope]) -> str:
    head = [
        "# bash completion for ibtool(8): ibtool completion bash",
        "# Installed as /usr/share/bash-completion/completions/ibtool (or in",
        "# ~/.local/share/bash-completion/completions/ibtool). Device and port names are read",
        "# from DIR/sys/class/infiniband when Tab is pressed (DIR: --root's, else /).",
        "",
    ]
    body = """\
# Add each word of "$@" that begins with $_ibtool_cur to COMPREPLY, quoted for the line.
_ibtool_add() {
    local w q
    for w in "$@"; do
        [[ $w == "$_ibtool_cur"* ]] || continue
        printf -v q '%q' "$w"
        COMPREPLY+=("$_ibtool_pre$q")
    done
}

# The RDMA devices under $_ibtool_root, into _ibtool_r: names only, never evaluated.
_ibtool_devices() {
    local d
    _ibtool_r=()
    for d in "${_ibtool_root%/}"/sys/class/infiniband/*; do
        [[ -e $d || -L $d ]] && _ibtool_r+=("${d##*/}")
    done
}

# The port numbers of device $1 (of every device when $1 is empty), into _ibtool_r.
_ibtool_ports() {
    local d p seen=" "
    local -a devices
    if [[ -n $1 ]]; then devices=("$1"); else _ibtool_devices; devices=("${_ibtool_r[@]}"); fi
    _ibtool_r=()
    for d in "${devices[@]}"; do
        for p in "${_ibtool_root%/}/sys/class/infiniband/$d/ports"/*; do
            [[ -e $p ]] || continue
            p=${p##*/}
            [[ $seen == *" $p "* ]] && continue
            seen+="$p "
            _ibtool_r+=("$p")
        done
    done
}

# Complete a value of kind $1 (choices: the words in _ibtool_r).
_ibtool_complete() {
    local dev w
    local -a found
    case $1 in
        choices) _ibtool_add "${_ibtool_r[@]}" ;;
        file|dir)
            compopt -o filenames 2>/dev/null
            [[ $1 == file ]] && w=-f || w=-d
            while IFS= read -r dev; do
                COMPREPLY+=("$_ibtool_pre$dev")
            done < <(compgen "$w" -- "$_ibtool_cur")
            ;;
        host)
            while IFS= read -r w; do
                COMPREPLY+=("$_ibtool_pre$w")
            done < <(compgen -A hostname -- "$_ibtool_cur")
            ;;
        dev)
            _ibtool_devices
            _ibtool_add "${_ibtool_r[@]}"
            ;;
        devport)
            if [[ $_ibtool_cur == */* ]]; then
                dev=${_ibtool_cur%%/*}
                _ibtool_ports "$dev"
                for w in "${_ibtool_r[@]}"; do found+=("$dev/$w"); done
                _ibtool_add "${found[@]}"
            else
                _ibtool_devices
                _ibtool_add "${_ibtool_r[@]}"
            fi
            ;;
        port)
            _ibtool_ports ""
            _ibtool_add "${_ibtool_r[@]}"
            ;;
    esac
}

_ibtool() {
    COMPREPLY=()
    local _ibtool_cur=${COMP_WORDS[COMP_CWORD]} _ibtool_pre=
    local -a _ibtool_before=("${COMP_WORDS[@]:1:COMP_CWORD-1}")
@WALK@
    # --opt=VALUE, split at = by readline (COMP_WORDBREAKS) or not
    if [[ $_ibtool_cur == = && -z $_ibtool_expect ]] && (( COMP_CWORD > 1 )) &&
        _ibtool_value "$_ibtool_cmd" "${COMP_WORDS[COMP_CWORD-1]}"; then
        _ibtool_cur=
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -n $_ibtool_expect ]]; then
        [[ $_ibtool_cur == = ]] && _ibtool_cur=
        _ibtool_value "$_ibtool_cmd" "$_ibtool_expect"
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -z $_ibtool_dd && $_ibtool_cur == --*=* ]]; then
        _ibtool_value "$_ibtool_cmd" "${_ibtool_cur%%=*}" || return 0
        _ibtool_pre=${_ibtool_cur%%=*}=
        _ibtool_cur=${_ibtool_cur#*=}
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -z $_ibtool_dd && $_ibtool_cur == -* ]]; then
        _ibtool_options "$_ibtool_cmd"
        _ibtool_add "${_ibtool_r[@]}"
        return 0
    fi
    if [[ -z $_ibtool_cmd ]]; then
        _ibtool_commands
        _ibtool_add "${_ibtool_r[@]}"
        return 0
    fi
    _ibtool_positional "$_ibtool_cmd" "$_ibtool_n"
    local -a _ibtool_keywords=("${_ibtool_r[@]}")
    _ibtool_add "${_ibtool_keywords[@]}"
    _ibtool_complete "$_ibtool_kind"
    return 0
}

complete -F _ibtool ibtool
"""
    return "\n".join(head + _data(found)) + "\n" + body.replace("@WALK@\n", _WALK)


def _zsh(found: list[Scope]) -> str:
    head = [
        "#compdef ibtool",
        "# zsh completion for ibtool(8): ibtool completion zsh",
        "# Installed as _ibtool in a directory of $fpath (/usr/share/zsh/vendor-completions,",
        "# or ~/.zfunc with fpath+=(~/.zfunc) before compinit). Device and port names are read",
        "# from DIR/sys/class/infiniband when Tab is pressed (DIR: --root's, else /).",
        "",
    ]
    body = """\
# The RDMA devices under $_ibtool_root, into _ibtool_r: names only, never evaluated.
_ibtool_devices() {
    local d
    _ibtool_r=()
    for d in "${_ibtool_root%/}"/sys/class/infiniband/*(N); do
        _ibtool_r+=("${d:t}")
    done
}

# The port numbers of device $1 (of every device when $1 is empty), into _ibtool_r.
_ibtool_ports() {
    local d p
    local -a devices
    if [[ -n $1 ]]; then devices=("$1"); else _ibtool_devices; devices=("${_ibtool_r[@]}"); fi
    _ibtool_r=()
    for d in "${devices[@]}"; do
        for p in "${_ibtool_root%/}/sys/class/infiniband/$d/ports"/*(N); do
            _ibtool_r+=("${p:t}")
        done
    done
    _ibtool_r=("${(@u)_ibtool_r}")
}

# Complete a value of kind $1 (choices: the words in _ibtool_r).
_ibtool_complete() {
    local dev w
    local -a found
    case $1 in
        choices) compadd -a _ibtool_r ;;
        file) _files ;;
        dir) _files -/ ;;
        host) _hosts ;;
        dev)
            _ibtool_devices
            compadd -a _ibtool_r
            ;;
        devport)
            if [[ $PREFIX == */* ]]; then
                dev=${PREFIX%%/*}
                _ibtool_ports "$dev"
                for w in "${_ibtool_r[@]}"; do found+=("$dev/$w"); done
                compadd -a found
            else
                _ibtool_devices
                compadd -a _ibtool_r
            fi
            ;;
        port)
            _ibtool_ports ""
            compadd -a _ibtool_r
            ;;
    esac
}

_ibtool() {
    emulate -L zsh
    local -a _ibtool_before=("${(@Q)words[2,CURRENT-1]}")
@WALK@
    if [[ -n $_ibtool_expect ]]; then
        _ibtool_value "$_ibtool_cmd" "$_ibtool_expect"
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -z $_ibtool_dd && $PREFIX == --*=* ]]; then
        _ibtool_value "$_ibtool_cmd" "${PREFIX%%=*}" || return 0
        compset -P '*='
        _ibtool_complete "$_ibtool_kind"
        return 0
    fi
    if [[ -z $_ibtool_dd && $PREFIX == -* ]]; then
        _ibtool_options "$_ibtool_cmd"
        compadd -a _ibtool_r
        return 0
    fi
    if [[ -z $_ibtool_cmd ]]; then
        _ibtool_commands
        compadd -a _ibtool_r
        return 0
    fi
    _ibtool_positional "$_ibtool_cmd" "$_ibtool_n"
    (( ${#_ibtool_r} )) && compadd -a _ibtool_r
    _ibtool_complete "$_ibtool_kind"
    return 0
}

if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    _ibtool "$@"
else
    compdef _ibtool ibtool
fi
"""
    return "\n".join(head + _data(found)) + "\n" + body.replace("@WALK@\n", _WALK)


SHELLS: dict[str, Callable[[list[Scope]], str]] = {"bash": _bash, "zsh": _zsh}


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script of `shell` (bash or zsh) for every command of `parser`."""
    return SHELLS[shell](scopes(parser))


def configure(parser) -> None:
    parser.add_argument("shell", nargs="?", metavar="bash|zsh", help="the shell to complete in")


def run(inv: Invocation) -> None:
    shell = inv.args.shell
    hint = "ibtool completion bash, or ibtool completion zsh"
    if shell is None:
        raise UsageError("which shell? bash or zsh", hint)
    if shell not in SHELLS:
        raise UsageError(f"no completion for shell {shell!r}: bash and zsh have one", hint)
    parser = inv.whole_parser() if inv.whole_parser is not None else inv.parser
    if parser is None:
        raise UsageError("no parser to complete from")
    inv.out.write(script(shell, parser))


@hookimpl
def ibtool_register_commands(cli):
    cli.add(
        "completion",
        run,
        help="print the bash or zsh completion script for ibtool's commands and options",
        configure=configure,
    )

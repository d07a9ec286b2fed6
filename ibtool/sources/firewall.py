"""Netfilter rules on the input path that would drop or reject UDP to a port (RoCE v2: 4791),
from `nft -j list ruleset` (libnftables-json(5)) and `iptables-save` / `ip6tables-save`
(iptables-save(8), iptables-extensions(8)).

What counts, per tool:

- chains hooked at prerouting, input (families ip, ip6, inet) or ingress (netdev), and the
  chains they jump or go to;
- a rule with a drop or reject verdict whose matches can all hold for UDP to the port: a
  match on the destination port that includes it (a value, a range, an anonymous or named
  set), on the layer-4 protocol that includes UDP, or none of those (the rule matches all
  UDP, or everything). Other matches (source address, interface, ...) keep the rule: it is
  reported with its text, which says when it applies. `ct state invalid` alone rules it out
  (RoCE's UDP is new or established to conntrack);
- a hooked chain's drop policy, unless a rule of the chain accepts UDP to the port with no
  other condition;
- rules after an unconditional accept of UDP to the port in the same chain are shadowed and
  not reported.

A missing tool is no rule; a tool that fails (not root: listing needs CAP_NET_ADMIN) gives a
warning and no rule.
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

from ibtool.model.system import FilterRule

Warn = Callable[[str], None]
# run(argv) -> (exit status, stdout, stderr), or None when the tool is not installed.
Runner = Callable[[list], "tuple[int, bytes, bytes] | None"]

TIMEOUT = 5.0  # seconds per command
OUTPUT_LIMIT = 8 << 20  # bytes of a command's output: a ruleset of ~10^4 rules
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"  # where nft and iptables live, off a user's PATH

NFT_HOOKS = ("prerouting", "input", "ingress")
NFT_FAMILIES = ("ip", "ip6", "inet", "netdev")
UDP = 17
# iptables tables and the built-in chains of the input path.
IPT_CHAINS = {
    "raw": ("PREROUTING",),
    "mangle": ("PREROUTING", "INPUT"),
    "nat": (),
    "filter": ("INPUT",),
    "security": ("INPUT",),
}


class _Limit(Exception):
    pass


def run_command(argv: list) -> tuple[int, bytes, bytes] | None:
    """Run a tool for at most TIMEOUT seconds and OUTPUT_LIMIT bytes of output; None when it
    is not installed. A tool that overruns either is killed and reported as status -1."""
    path = shutil.which(argv[0], path=os.environ.get("PATH", "") + ":" + SBIN_PATH)
    if path is None:
        return None
    try:
        proc = subprocess.Popen(
            [path, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "LC_ALL": "C"},
        )
    except OSError:
        return None
    out = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    deadline = time.monotonic() + TIMEOUT
    try:
        with selectors.DefaultSelector() as sel:
            for f in out:
                sel.register(f, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Limit(f"no answer within {TIMEOUT:g} s")
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    out[key.fileobj] += chunk
                    if len(out[key.fileobj]) > OUTPUT_LIMIT:
                        raise _Limit(f"more than {OUTPUT_LIMIT} bytes of output")
        status = proc.wait(max(deadline - time.monotonic(), 0.1))
    except (_Limit, subprocess.TimeoutExpired) as e:
        proc.kill()
        proc.wait()
        return -1, b"", str(e).encode()
    finally:
        for f in out:
            f.close()
    return status, bytes(out[proc.stdout]), bytes(out[proc.stderr])


def udp_filters(port: int, warn: Warn, run: Runner = run_command) -> tuple[FilterRule, ...]:
    """The rules of nft, then of iptables-save and ip6tables-save, that drop or reject UDP to
    `port` on the input path."""
    found: list[FilterRule] = []
    text = _output(["nft", "-j", "list", "ruleset"], warn, run)
    if text is not None:
        try:
            found += nft_rules(json.loads(text), port)
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            warn(f"nft -j list ruleset: not the JSON of libnftables-json(5) ({e})")
    for tool in ("iptables", "ip6tables"):
        text = _output([f"{tool}-save"], warn, run)
        if text is not None:
            found += iptables_rules(text, port, tool)
    return tuple(found)


def _output(argv: list, warn: Warn, run: Runner) -> str | None:
    result = run(argv)
    if result is None:
        return None
    status, stdout, stderr = result
    if status != 0:
        said = stderr.decode("utf-8", "replace").strip().splitlines()
        why = said[0][:200] if said else f"exit status {status}"
        warn(f"{' '.join(argv)}: {why} (listing the rules needs CAP_NET_ADMIN)")
        return None
    return stdout.decode("utf-8", "replace")


# -- nft ----------------------------------------------------------------------------------------

_YES, _NO, _COND = "yes", "no", "condition"  # what one match says about UDP to the port


def nft_rules(doc: dict, port: int) -> list[FilterRule]:
    """The rules of an `nft -j list ruleset` document that drop or reject UDP to `port`."""
    chains: dict[tuple, dict] = {}
    rules: dict[tuple, list[dict]] = {}
    sets: dict[tuple, list] = {}
    for item in doc["nftables"]:
        if not isinstance(item, dict):
            continue
        if "chain" in item:
            c = item["chain"]
            chains[(c["family"], c["table"], c["name"])] = c
        elif "rule" in item:
            r = item["rule"]
            rules.setdefault((r["family"], r["table"], r["chain"]), []).append(r)
        elif "set" in item or "map" in item:
            s = item.get("set") or item.get("map")
            sets[(s["family"], s["table"], s["name"])] = s.get("elem") or []
    hooked = [
        key
        for key, c in chains.items()
        if c.get("hook") in NFT_HOOKS and c["family"] in NFT_FAMILIES and c.get("type") != "nat"
    ]
    found: list[FilterRule] = []
    seen: set[tuple] = set()
    queue = list(hooked)
    while queue:
        key = queue.pop(0)
        if key in seen:
            continue
        seen.add(key)
        family, table, name = key
        accepted = False
        for rule in rules.get(key, []):
            exprs = rule.get("expr") or []
            verdict = _nft_verdict(exprs)
            for target in _nft_jumps(exprs):
                queue.append((family, table, target))
            said = _nft_match(exprs, port, lambda n, f=family, t=table: sets.get((f, t, n)))
            if said == _NO:
                continue
            if verdict == "accept" and said == _YES:
                accepted = True
                break  # what follows in this chain never sees UDP to the port
            if verdict in ("drop", "reject"):
                found.append(
                    FilterRule(
                        "nft",
                        f"{family} {table}",
                        name,
                        rule.get("handle"),
                        None,
                        _nft_text(rule),
                        verdict,
                    )
                )
        c = chains[key]
        if key in hooked and c.get("policy") == "drop" and not accepted:
            found.append(
                FilterRule(
                    "nft",
                    f"{family} {table}",
                    name,
                    None,
                    None,
                    f"chain {name} {{ type {c.get('type')} hook {c.get('hook')} "
                    f"priority {c.get('prio')}; policy drop; }}",
                    "drop",
                )
            )
    return found


def _nft_verdict(exprs: list) -> str | None:
    for e in exprs:
        if isinstance(e, dict):
            for v in ("drop", "reject", "accept"):
                if v in e:
                    return v
    return None


def _nft_jumps(exprs: list) -> list[str]:
    return [
        e[k]["target"]
        for e in exprs
        if isinstance(e, dict)
        for k in ("jump", "goto")
        if k in e and isinstance(e[k], dict)
    ]


def _nft_match(exprs: list, port: int, named: Callable[[str], Any]) -> str:
    """_YES: every match holds for UDP to the port (or there is none); _COND: some match
    depends on something else (source, interface); _NO: some match rules it out."""
    said = _YES
    for e in exprs:
        if not isinstance(e, dict) or "match" not in e:
            if isinstance(e, dict) and "xt" in e:
                said = _COND  # an iptables-nft match nft cannot show: may hold
            continue
        m = e["match"]
        one = _nft_one(m.get("op", "=="), m.get("left"), m.get("right"), port, named)
        if one == _NO:
            return _NO
        if one == _COND:
            said = _COND
    return said


def _nft_one(op: str, left: Any, right: Any, port: int, named) -> str:
    if isinstance(left, dict) and "payload" in left:
        p = left["payload"]
        proto, field = p.get("protocol"), p.get("field")
        if proto in ("udp", "th") and field == "dport":
            return _holds(op, right, port, named)
        if (proto, field) in (("ip", "protocol"), ("ip6", "nexthdr")):
            return _holds(op, right, "udp", named)
        if proto in ("tcp", "sctp", "dccp", "icmp", "icmpv6", "udplite", "esp", "ah", "igmp"):
            return _NO
        return _COND
    if isinstance(left, dict) and "meta" in left:
        if left["meta"].get("key") == "l4proto":
            return _holds(op, right, "udp", named)
        return _COND
    if isinstance(left, dict) and "ct" in left and left["ct"].get("key") == "state":
        states = set(_values(right, named))
        if op in ("==", "in") and states and states <= {"invalid", "untracked"}:
            return _NO
        return _COND
    return _COND


def _values(right: Any, named) -> list:
    if isinstance(right, str) and right.startswith("@"):
        return _values({"set": named(right[1:]) or []}, named)
    if isinstance(right, dict) and "set" in right:
        out: list = []
        for e in right["set"] if isinstance(right["set"], list) else [right["set"]]:
            out += _values(e, named)
        return out
    if isinstance(right, dict) and "elem" in right:
        return _values(right["elem"].get("val"), named)
    if isinstance(right, list):  # flags (ct state) print as a list
        out = []
        for e in right:
            out += _values(e, named)
        return out
    return [right]


def _contains(value: Any, wanted: Any) -> bool | None:
    """Whether one element holds `wanted` (a port number, or "udp"); None: cannot tell."""
    if isinstance(value, dict) and "range" in value:
        lo, hi = value["range"]
        if isinstance(wanted, int) and isinstance(lo, int) and isinstance(hi, int):
            return lo <= wanted <= hi
        return None
    if wanted == "udp":
        return value in ("udp", UDP, str(UDP))
    if isinstance(value, int):
        return value == wanted
    if isinstance(value, str) and value.isdigit():
        return int(value) == wanted
    return None


def _holds(op: str, right: Any, wanted: Any, named) -> str:
    elems = _values(right, named)
    hits = [_contains(v, wanted) for v in elems]
    if any(h is None for h in hits) and not any(hits):
        return _COND  # a form not understood: kept, with its text
    inside = any(hits)
    if op in ("==", "in"):
        return _YES if inside else _NO
    if op == "!=":
        return _NO if inside else _YES
    if isinstance(wanted, int) and len(elems) == 1 and isinstance(elems[0], int):
        ops = {"<": wanted < elems[0], ">": wanted > elems[0], "<=": wanted <= elems[0]}
        ops[">="] = wanted >= elems[0]
        if op in ops:
            return _YES if ops[op] else _NO
    return _COND


def _nft_text(rule: dict) -> str:
    """The rule much as `nft list ruleset` prints it."""
    words = [_nft_expr(e) for e in rule.get("expr") or []]
    if rule.get("comment"):
        words.append(f'comment "{rule["comment"]}"')
    return " ".join(w for w in words if w)


def _nft_value(v: Any) -> str:
    if isinstance(v, dict):
        if "set" in v:
            items = v["set"] if isinstance(v["set"], list) else [v["set"]]
            return "{ " + ", ".join(_nft_value(x) for x in items) + " }"
        if "range" in v:
            return "-".join(_nft_value(x) for x in v["range"])
        if "prefix" in v:
            return f"{v['prefix'].get('addr')}/{v['prefix'].get('len')}"
        if "payload" in v:
            return f"{v['payload'].get('protocol')} {v['payload'].get('field')}"
        if "meta" in v:
            return f"meta {v['meta'].get('key')}"
        if "ct" in v:
            return f"ct {v['ct'].get('key')}"
        if "elem" in v:
            return _nft_value(v["elem"].get("val"))
    if isinstance(v, list):
        return "{ " + ", ".join(_nft_value(x) for x in v) + " }"
    if isinstance(v, (dict, bool)) or v is None:
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _nft_expr(e: Any) -> str:
    if not isinstance(e, dict) or not e:
        return ""
    if "match" in e:
        m = e["match"]
        op = m.get("op", "==")
        mid = "" if op in ("==", "in") else f" {op}"
        return f"{_nft_value(m.get('left'))}{mid} {_nft_value(m.get('right'))}"
    key, value = next(iter(e.items()))
    if key in ("jump", "goto") and isinstance(value, dict):
        return f"{key} {value.get('target')}"
    if key == "reject" and isinstance(value, dict) and value.get("type"):
        return f"reject with {value['type']} {value.get('expr', '')}".rstrip()
    if key in ("counter", "log", "accept", "drop", "reject", "return", "continue"):
        return key
    return key


# -- iptables-save ------------------------------------------------------------------------------


def iptables_rules(text: str, port: int, tool: str = "iptables") -> list[FilterRule]:
    """The rules of an iptables-save dump that drop or reject UDP to `port`."""
    table = None
    policies: dict[tuple[str, str], str] = {}
    rules: dict[tuple[str, str], list[tuple[int, str, list[str]]]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":") and table is not None:
            parts = line[1:].split()
            if len(parts) >= 2:
                policies[(table, parts[0])] = parts[1]
        elif line.startswith("-A ") and table is not None:
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            if len(words) >= 2:
                rules.setdefault((table, words[1]), []).append((number, line, words[2:]))
    found: list[FilterRule] = []
    hooked = [(t, c) for t, chains in IPT_CHAINS.items() for c in chains if (t, c) in policies]
    seen: set[tuple[str, str]] = set()
    queue = list(hooked)
    while queue:
        key = queue.pop(0)
        if key in seen:
            continue
        seen.add(key)
        accepted = False
        for number, line, words in rules.get(key, []):
            said, target = _ipt_match(words, port)
            if target not in (None, "DROP", "REJECT", "ACCEPT", "RETURN", "LOG", "MARK"):
                queue.append((key[0], target))
            if said == _NO:
                continue
            if target == "ACCEPT" and said == _YES:
                accepted = True
                break
            if target in ("DROP", "REJECT"):
                found.append(FilterRule(tool, key[0], key[1], None, number, line, target.lower()))
        if key in hooked and policies.get(key) == "DROP" and not accepted:
            found.append(FilterRule(tool, key[0], key[1], None, None, f":{key[1]} DROP", "drop"))
    return found


def _ports(spec: str) -> Iterable[tuple[int, int]]:
    for part in spec.split(","):
        lo, _, hi = part.partition(":")
        if lo.isdigit() and (not hi or hi.isdigit()):
            yield int(lo), int(hi) if hi else int(lo)
        else:
            yield -1, -1  # a service name: not understood


def _ipt_match(words: list[str], port: int) -> tuple[str, str | None]:
    """(what the rule's matches say of UDP to the port, its target)."""
    said, target = _YES, None
    negate = False
    i = 0
    while i < len(words):
        w = words[i]
        if w == "!":
            negate = True
            i += 1
            continue
        args = []
        j = i + 1
        while j < len(words) and words[j] != "!" and not words[j].startswith("-"):
            args.append(words[j])
            j += 1
        value = args[0] if args else ""
        one = _COND
        if w in ("-p", "--protocol"):
            udp = value.lower() in ("udp", str(UDP), "all", "0")
            one = _YES if udp != negate else _NO
        elif w in ("--dport", "--destination-port", "--dports", "--destination-ports"):
            ranges = list(_ports(value))
            if any(lo < 0 for lo, _ in ranges):
                one = _COND
            else:
                inside = any(lo <= port <= hi for lo, hi in ranges)
                one = _YES if inside != negate else _NO
        elif w in ("--ctstate", "--state"):
            states = set(value.upper().split(","))
            one = _NO if not negate and states <= {"INVALID", "UNTRACKED"} else _COND
        elif w in ("-j", "--jump", "-g", "--goto"):
            target = value
            one = _YES
        elif w in ("-m", "--match", "--reject-with", "-c", "--comment"):
            one = _YES
        if one == _NO:
            return _NO, target
        if one == _COND:
            said = _COND
        negate = False
        i = j
    return said, target

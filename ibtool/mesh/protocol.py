"""What the mesh's coordinator and its agents say to each other: one JSON object a line.

The coordinator starts `ibtool mesh --agent` on every node through the engine (ClusterShell's
ssh, srun, or a local process), which gives each agent one line on its standard input:

  join    the token (and the key) the agent proves itself with (channel.py)

The agent connects back to the coordinator over TCP, says its join there, and from then on
each side speaks over that connection. An agent says:

  hello   its endpoints (every RDMA port of its node: device, port, state, link layer, the
          address its ping server will listen on; an InfiniBand port's LID and its node's
          GUID, where it has them), and a random id the plan names it by
  ready   its ping servers listen; `problems`: endpoints it could not serve, and why
  result  round R's pairs it was the client of: [src, dst, state, sent, received, median,
          p90, p99, hw, error, extras]; extras (optional) what the pair measured beyond its
          pings: `full` [bytes, sent, answered] of the pings of the path MTU's full payload,
          `qps` [QPs, silent ones], `bw` Gb/s; `retrans`: each of its endpoints' RC
          retransmissions in the round (its port's counters before and after); `quiet`
          (round 0 only): [retransmissions, milliseconds] from its ready to the round,
          while no agent pinged (someone else's traffic: a job's)
  retried the pairs of a retry it was the client of, as a result's
  warn    a line for the operator (a server's refusal, a ladder that would not close)
  error   why it cannot take part (no RDMA device, no pyverbs, ...); it then exits (said
          on its standard output where it could not join)

and the coordinator, to each agent:

  plan    the endpoints it needs, each [index, agent id, its index there, address, up, and
          its server's TCP port where it is not the mesh's: a side address]: its own, the
          partners they ping and those that ping them, of `n` in the mesh; the schedule,
          the pings and the path (`path`: sl, tclass, pkey_index; `full`, `qps`, `bw`)
  round   run round R; `skip`: endpoints found dead since the plan
  retry   after the last round, probe `pairs` ([src, dst]) again: those that lost pings
  end     stop the servers and exit (EOF on stdin says the same)

An agent's lines come from another host and are untrusted: each is bounded (MAX_LINE), its
names are names, its numbers in range, and a node that breaks the protocol is dropped from
the mesh with the reason, never followed.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from ibtool.model.mesh import Endpoint, PairState
from ibtool.model.names import printable
from ibtool.rdma.wire import MODES

VERSION = 2  # 2: the agents join over TCP, each its own plan
MAX_LINE = 64 * 1024  # an agent's line: a hello of MAX_ENDPOINTS, a round's result
MAX_PLAN = 32 * 1024 * 1024  # the coordinator's plan: 8,192 endpoints is ~1 MiB
MAX_ENDPOINTS = 64  # RDMA ports of one node
MAX_MESH = 1 << 20  # endpoints of one mesh
MAX_ERROR = 200  # characters of an error an agent reports
MAX_QPS = 16  # QPs a pair's pings are spread over (--qps)
MAX_RETRIES = 1024  # pairs one retry names (the coordinator retries fewer)
# --bw: a pair's burst, RDMA WRITE WITH IMMEDIATE ping-pongs of BW_SIZE bytes, one in flight:
# each way one message's transfer, so 2 x BW_SIZE over the round trip is what the path
# carries (below a streaming benchmark's peak; compared across endpoints, never against it)
BW_SIZE = 1 << 20
BW_PINGS = 5  # the first is not counted: it warms the path (the ARP, the responder's caches)
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_ID = re.compile(r"[0-9a-f]{16,64}")
_GUID = re.compile(r"[0-9a-f]{4}(:[0-9a-f]{4}){3}")
LID_MAX = 0xBFFF  # the last unicast LID (IBTA vol. 1, 4.1.3: 0xC000 up are multicast)
_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER", "UNKNOWN")


class AgentError(ValueError):
    """An agent's line that breaks the protocol; the message says what, for the node's line."""


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n"


def _load(line: str | bytes, limit: int) -> dict[str, Any]:
    if len(line) > limit:
        raise AgentError(f"a line of {len(line)} bytes, over the {limit} a message may have")
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise AgentError(f"not a JSON message: {printable(str(e), 80)}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise AgentError("a message without its type")
    return msg


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise AgentError(f"{what}: not a number from {lo} to {hi}")
    return v


def _name(v: Any, what: str) -> str:
    if not isinstance(v, str) or not _NAME.fullmatch(v):
        raise AgentError(f"{what}: not a name ({printable(str(v), 40)})")
    return v


def _us(v: Any, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9:
        raise AgentError(f"{what}: not a round trip in microseconds")
    if math.isnan(v):
        raise AgentError(f"{what}: not a number")
    return float(v)


def _text(v: Any, what: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise AgentError(f"{what}: not text")
    return printable(v, MAX_ERROR)


_MTUS = (256, 512, 1024, 2048, 4096)  # what an IB MTU can be (ibv_mtu, IBA 7.7.8)


def _mtu(v: Any) -> int:
    if v not in _MTUS or isinstance(v, bool):
        raise AgentError("ready: an MTU that is not 256, 512, 1024, 2048 or 4096")
    return v


def _address(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 64:
        raise AgentError("address: not an IP address")
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise AgentError(f"address: not an IP address ({printable(v, 40)})") from None


def parse_agent(line: str | bytes) -> dict[str, Any]:
    """One line of an agent, checked: its type and fields as the module's docstring says."""
    msg = _load(line, MAX_LINE)
    kind = msg["t"]
    if kind == "hello":
        if msg.get("v") != VERSION:
            raise AgentError(f"protocol version {printable(str(msg.get('v')), 20)}, not {VERSION}")
        if not isinstance(msg.get("id"), str) or not _ID.fullmatch(msg["id"]):
            raise AgentError("hello: no agent id")
        eps = msg.get("endpoints")
        if not isinstance(eps, list) or len(eps) > MAX_ENDPOINTS:
            raise AgentError(f"hello: endpoints not a list of at most {MAX_ENDPOINTS}")
        msg["endpoints"] = [_hello_endpoint(e) for e in eps]
        msg["node"] = _name(msg.get("node"), "hello: node")
    elif kind == "ready":
        msg["problems"] = _by_endpoint(
            msg.get("problems", {}), "ready: problems", MAX_ENDPOINTS,
            lambda v: _text(v, "ready: problem") or "unusable",
        )  # fmt: skip
        msg["mtu"] = _by_endpoint(msg.get("mtu", {}), "ready: mtu", MAX_ENDPOINTS, _mtu)
    elif kind == "result":
        msg["r"] = _int(msg.get("r"), 0, 1 << 20, "result: round")
        pairs = msg.get("pairs")
        if not isinstance(pairs, list) or len(pairs) > MAX_ENDPOINTS:
            raise AgentError("result: pairs not a list")
        msg["pairs"] = [_pair(p) for p in pairs]
        msg["retrans"] = _by_endpoint(
            msg.get("retrans", {}), "result: retrans", _BIG,
            lambda v: _int(v, 0, _BIG, "result: retransmissions"),
        )  # fmt: skip
        msg["quiet"] = _by_endpoint(msg.get("quiet", {}), "result: quiet", _BIG, _quiet)
    elif kind == "retried":
        pairs = msg.get("pairs")
        if not isinstance(pairs, list) or len(pairs) > MAX_RETRIES:
            raise AgentError("retried: pairs not a list")
        msg["pairs"] = [_pair(p) for p in pairs]
    elif kind == "warn":
        msg["text"] = _text(msg.get("text"), "warn") or ""
    elif kind == "error":
        msg["message"] = _text(msg.get("message"), "error") or "no reason given"
        msg["hint"] = _text(msg.get("hint"), "error: hint")
    else:
        raise AgentError(f"unknown message {printable(kind, 20)!r}")
    return msg


def _hello_endpoint(e: Any) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise AgentError("hello: an endpoint not an object")
    state = e.get("state")
    if state not in _STATES:
        raise AgentError(f"hello: port state {printable(str(state), 20)}")
    link = e.get("link_layer")
    if link not in ("Ethernet", "InfiniBand", "Unknown"):
        raise AgentError("hello: link layer")
    gid = e.get("gid_index")
    return {
        "device": _name(e.get("device"), "hello: device"),
        "port": _int(e.get("port"), 1, 255, "hello: port"),
        "state": state,
        "link_layer": link,
        "address": _address(e.get("address")) if e.get("address") is not None else None,
        "gid_index": None if gid is None else _int(gid, 0, 255, "hello: gid index"),
        "hw": bool(e.get("hw")),
        "problem": _text(e.get("problem"), "hello: problem"),
        # optional (agents before them said neither): what the drift across a rail compares
        "rate": _short(e.get("rate"), "hello: rate"),
        "fw": _short(e.get("fw"), "hello: firmware"),
        "driver": _short(e.get("driver"), "hello: driver"),
        "kernel": _short(e.get("kernel"), "hello: kernel"),
        "pfc": _short(e.get("pfc"), "hello: pfc"),
        "trust": _short(e.get("trust"), "hello: trust"),
        # optional too: the prefix length of its address on its netdev (rails by subnet)
        "prefix": None if e.get("prefix") is None else _int(e["prefix"], 0, 128, "hello: prefix"),
        # an InfiniBand port without IPoIB: its address is the node's management one, its
        # server on the mesh's TCP port + this
        "side": None if e.get("side") is None else _int(e["side"], 1, MAX_ENDPOINTS, "hello: side"),
        # optional too (InfiniBand): the port's LID, its node's GUID (the cable analysis)
        "lid": None if e.get("lid") is None else _int(e["lid"], 1, LID_MAX, "hello: lid"),
        "guid": None if e.get("guid") is None else _guid(e["guid"]),
    }


def _guid(v: Any) -> int:
    if not isinstance(v, str) or not _GUID.fullmatch(v):
        raise AgentError("hello: guid not a GUID as sysfs writes it (0002:c903:0001:2345)")
    return int(v.replace(":", ""), 16)


def _short(v: Any, what: str) -> str | None:
    """A short fact of a port (its rate, its firmware): printable, at most 64 characters."""
    return None if v is None else printable(_text(v, what) or "", 64)


_PAIR_STATES = {int(PairState.PROBED): PairState.PROBED, int(PairState.SKIPPED): PairState.SKIPPED}
_BIG = 1 << 31


def _pair(p: Any) -> tuple:
    """One pair of a result. Checked inline: a 1,024 x 8 mesh has 8.4 million of them."""
    if type(p) is not list or not 10 <= len(p) <= 11:
        raise AgentError("result: a pair not a list of 10 or 11")
    src, dst, state, sent, received, med, p90, p99, hw, err = p[:10]
    if not (
        type(src) is int
        and type(dst) is int
        and type(sent) is int
        and type(received) is int
        and 0 <= src < _BIG
        and 0 <= dst < _BIG
        and 0 <= received <= sent <= _BIG
        and type(state) is int
        and state in _PAIR_STATES
        and type(hw) is bool
    ):
        raise AgentError(f"result: a pair out of range ({printable(str(p), 80)})")
    for x in (med, p90, p99):
        # NaN fails the comparison; so does infinity, and a bool is no round trip
        if x is not None and not (type(x) in (int, float) and 0 <= x < 1e9):
            raise AgentError("result: a round trip out of range")
    if err is not None:
        if type(err) is not str:
            raise AgentError("result: error not text")
        err = printable(err, MAX_ERROR)
    extra = _extra(p[10]) if len(p) == 11 else None
    return (src, dst, _PAIR_STATES[state], sent, received, med, p90, p99, hw, err, extra)


def _by_endpoint(m: Any, what: str, bound: int, value: Any) -> dict[int, Any]:
    """A mapping of at most MAX_ENDPOINTS endpoint indices ("3": the JSON key, below
    `bound`) to what `value` makes of each."""
    if not isinstance(m, dict) or len(m) > MAX_ENDPOINTS:
        raise AgentError(f"{what} not a mapping")
    return {
        _int(int(k) if isinstance(k, str) and k.isdigit() else -1, 0, bound - 1,
             f"{what}: endpoint"): value(v)
        for k, v in m.items()
    }  # fmt: skip


def _quiet(v: Any) -> list[int]:
    if type(v) is not list or len(v) != 2:
        raise AgentError("result: quiet not [retransmissions, milliseconds]")
    return [_int(x, 0, _BIG, "result: quiet") for x in v]


def _counts(v: Any, what: str, first_max: int) -> list[int]:
    if type(v) is not list or len(v) not in (2, 3) or any(type(x) is not int for x in v):
        raise AgentError(f"result: {what} not a list of counts")
    if not (0 <= v[0] <= first_max and 0 <= v[-1] <= v[-2] <= _BIG):
        raise AgentError(f"result: {what} out of range")
    return list(v)


def _extra(x: Any) -> dict | None:
    """A pair's measures beyond its pings: `full` [bytes, sent, answered] (the pings of the
    path MTU's full payload), `qps` [QPs, of them silent], `bw` (Gb/s of an RDMA WRITE
    burst)."""
    if x is None:
        return None
    if type(x) is not dict or len(x) > 3:
        raise AgentError("result: a pair's extras not a mapping")
    out: dict[str, Any] = {}
    for key, v in x.items():
        if key == "full":
            full = _counts(v, "full", 1 << 20)
            if len(full) != 3 or full[0] not in _MTUS:
                raise AgentError("result: full not [MTU bytes, sent, answered]")
            out[key] = full
        elif key == "qps":
            qps = _counts(v, "qps", 64)
            if len(qps) != 2:
                raise AgentError("result: qps not [QPs, silent]")
            out[key] = qps
        elif key == "bw":
            if type(v) not in (int, float) or not 0 <= v < 1e5:  # NaN fails too
                raise AgentError("result: bw not Gb/s")
            out[key] = float(v)
        else:
            raise AgentError(f"result: unknown pair extra {printable(str(key), 20)!r}")
    return out or None


# -- the plan, as the agent reads it ----------------------------------------------------------


def plan_message(
    endpoints: list[Endpoint],
    ids: list[tuple[str, int]],
    schedule,
    settings,
    qp_timeout: int = 14,
    abandon: int = 3,
    needed: Iterable[int] | None = None,
    encoded: dict[int, str] | None = None,
) -> str:
    """One agent's plan: the endpoints `needed` (default: all), `ids[i]` endpoint i's (agent
    id, index in its hello); `schedule` (a Schedule, or its wire form: the agent's groups);
    `settings` says the pings and the path (mesh.Settings).
    `encoded`: a cache of the endpoints' JSON, kept across the agents' plans."""
    cache = {} if encoded is None else encoded

    def entry(i: int) -> str:
        text = cache.get(i)
        if text is None:
            (aid, k), e = ids[i], endpoints[i]
            text = cache[i] = json.dumps(
                [i, aid, k, e.address or "", e.up, *([e.tcp_port] if e.tcp_port else [])],
                separators=(",", ":"),
            )
        return text

    rest = dumps(
        {
            "t": "plan",
            "v": VERSION,
            "n": len(endpoints),
            "schedule": schedule if isinstance(schedule, dict) else schedule.to_wire(),
            "count": settings.count,
            "size": settings.size,
            "mode": settings.mode,
            "rate": settings.rate,
            "timeout": settings.timeout,
            "tcp_port": settings.tcp_port,
            "qp_timeout": qp_timeout,
            "abandon": abandon,
            "path": {
                "sl": settings.sl,
                "tclass": settings.tclass,
                "pkey_index": settings.pkey_index,
            },
            "full": settings.full_payload,
            "qps": settings.qps,
            "bw": settings.bw,
        }  # fmt: skip
    )
    wanted = range(len(endpoints)) if needed is None else sorted(needed)
    return '{"endpoints":[' + ",".join(entry(i) for i in wanted) + "]," + rest[1:]


def parse_coordinator(line: str | bytes) -> dict[str, Any]:
    """A line from the coordinator (who started this agent: bounded and checked all the same,
    a wrong one ends the agent with its reason)."""
    msg = _load(line, MAX_PLAN)
    kind = msg["t"]
    if kind == "plan":
        if msg.get("v") != VERSION:
            raise AgentError(f"plan of protocol version {msg.get('v')!r}, not {VERSION}")
        n = _int(msg.get("n"), 0, MAX_MESH, "plan: endpoints in the mesh")
        eps = msg.get("endpoints")
        if not isinstance(eps, list) or len(eps) > n:
            raise AgentError("plan: no endpoints")
        seen: set[int] = set()
        for e in eps:
            if not (isinstance(e, list) and len(e) in (5, 6) and isinstance(e[1], str)):
                raise AgentError("plan: an endpoint not [i, id, index, address, up(, port)]")
            i = _int(e[0], 0, n - 1, "plan: endpoint")
            if i in seen:
                raise AgentError("plan: an endpoint twice")
            seen.add(i)
            _int(e[2], 0, MAX_ENDPOINTS - 1, "plan: index")
            if len(e) == 6:
                _int(e[5], 1, 65535, "plan: endpoint's port")
            if e[3]:
                _address(e[3])
        sched = msg.get("schedule")
        if not isinstance(sched, dict):
            raise AgentError("plan: no schedule")
        groups, shifts = sched.get("groups"), sched.get("shifts")
        if not isinstance(groups, dict) or not isinstance(shifts, dict):
            raise AgentError("plan: schedule without groups and shifts")
        for name, members in groups.items():
            if not isinstance(members, list) or name not in shifts:
                raise AgentError("plan: a group without its shifts")
            for m in members:
                _int(m, 0, n - 1, "plan: group member")
            for s in shifts[name]:
                _int(s, 1, max(1, len(members) - 1), "plan: shift")
        _int(msg.get("count"), 1, 1 << 20, "plan: count")
        _int(msg.get("size"), 1, 1 << 20, "plan: size")
        _int(msg.get("tcp_port"), 1, 65535, "plan: tcp port")
        msg["qp_timeout"] = _int(msg.get("qp_timeout", 14), 0, 31, "plan: qp timeout")
        msg["abandon"] = _int(msg.get("abandon", 3), 1, 1 << 20, "plan: abandon")
        path = msg.get("path", {})
        if not isinstance(path, dict):
            raise AgentError("plan: path")
        msg["path"] = {
            "sl": _int(path.get("sl", 0), 0, 15, "plan: sl"),
            "tclass": _int(path.get("tclass", 0), 0, 255, "plan: tclass"),
            "pkey_index": _int(path.get("pkey_index", 0), 0, 0xFFFF, "plan: pkey index"),
        }
        msg["full"] = _int(msg.get("full", 0), 0, 1000, "plan: full")
        msg["qps"] = _int(msg.get("qps", 1), 1, MAX_QPS, "plan: qps")
        if not isinstance(msg.get("bw", False), bool):
            raise AgentError("plan: bw")
        if msg.get("mode") not in MODES:
            raise AgentError("plan: mode")
        for key in ("rate", "timeout"):
            v = msg.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6:
                raise AgentError(f"plan: {key}")
    elif kind == "round":
        _int(msg.get("r"), 0, 1 << 20, "round")
        skip = msg.get("skip", [])
        if not isinstance(skip, list):
            raise AgentError("round: skip")
        for s in skip:
            _int(s, 0, 1 << 24, "round: skip")
    elif kind == "retry":
        pairs = msg.get("pairs")
        if not isinstance(pairs, list) or len(pairs) > MAX_RETRIES:
            raise AgentError("retry: pairs not a list")
        for p in pairs:
            if not (isinstance(p, list) and len(p) == 2):
                raise AgentError("retry: a pair not [src, dst]")
            for x in p:
                _int(x, 0, 1 << 24, "retry: endpoint")
    elif kind != "end":
        raise AgentError(f"unknown message {printable(kind, 20)!r}")
    return msg

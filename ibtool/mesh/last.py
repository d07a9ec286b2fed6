"""The last mesh that ran from this node, for `ibtool tui`: a bounded summary in one JSON file.

Not the pairs (8.4 million of them in a 1,024 x 8 mesh): the settings, the endpoints (at most
MAX_ENDPOINTS), the verdicts (at most MAX_VERDICTS), the baselines, the unreachable nodes, when
and how long, and the heat map folded to at most MAP_CELLS x MAP_CELLS cells (the worst health
of each cell, as glyphs, with the fold's labels).

The file is written by temporary file and rename (a reader never sees half of one; a symlink
planted at the path is replaced, never written through) and read as untrusted: at most
MAX_BYTES, a regular file (a FIFO planted there does not hang the dashboard), every field's
type and size checked, every name printable, anything else a DataError of one line. A symlink
at the path is followed when reading: the file it names is read under the same bounds and
checks, so an administrator may link it elsewhere, and what a link can show is only what
passes as a mesh summary (the error says the file is malformed, never quotes it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from typing import Any

from ibtool.errors import DataError
from ibtool.model.deferred import dataclass
from ibtool.model.mesh import (
    CODE,
    Baseline,
    Culprit,
    Endpoint,
    Fold,
    Level,
    MeshResult,
    Settings,
    Verdict,
    fold,
    nodes_of,
)
from ibtool.model.names import printable
from ibtool.views import mesh as view

FORMAT = "ibtool-mesh-last"
VERSION = 1
MAX_BYTES = 4 << 20
MAX_ENDPOINTS = 8192
MAX_VERDICTS = 1000
MAX_UNREACHABLE = 8192
MAX_BASELINES = 1024
MAP_CELLS = 64
MAX_NAME = 256  # a node, device, group or label
MAX_TEXT = 2000  # a verdict's why, a next command
MAX_NEXT = 8  # next commands a verdict


def default_path(env=os.environ) -> str:
    """/var/lib/ibtool/mesh.json for root; $XDG_STATE_HOME/ibtool/mesh.json (or
    ~/.local/state/...) for anyone else, as the health state's."""
    if os.geteuid() == 0:
        return "/var/lib/ibtool/mesh.json"
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ibtool", "mesh.json")


@dataclass(frozen=True)
class LastMesh:
    """What the file said, checked."""

    path: str
    started: float  # wall clock, time.time()
    elapsed: float
    settings: Settings
    endpoints: tuple[Endpoint, ...]  # the first MAX_ENDPOINTS
    endpoints_total: int
    nodes: int
    rounds: int
    pairs: int  # ordered pairs scheduled
    probed: int
    baselines: tuple[Baseline, ...]
    verdicts: tuple[Verdict, ...]  # worst first, the first MAX_VERDICTS
    verdicts_total: int
    unreachable: tuple[tuple[str, str], ...]  # (node, why)
    map: Fold

    @property
    def worst(self) -> Level | None:
        return max((v.level for v in self.verdicts), default=None)


# -- saving ------------------------------------------------------------------------------------


def _t(text: str, limit: int = MAX_TEXT) -> str:
    return printable(text, limit)


def summary(result: MeshResult) -> dict[str, Any]:
    """The file's content for `result`: bounded whatever the mesh's size."""
    eps = result.endpoints
    f = fold(result, MAP_CELLS)
    scheduled, probed, _, _ = view.counts(result)
    verdicts = view.worst_first(result.verdicts)
    return {
        "format": FORMAT,
        "version": VERSION,
        "started": float(result.started),
        "elapsed": float(result.elapsed),
        "settings": view.settings_json(result),
        "endpoints": [
            {
                "node": _t(e.node, MAX_NAME),
                "device": _t(e.device, MAX_NAME),
                "port": e.port,
                "rail": e.rail,
                "address": _t(e.address, MAX_NAME),
                "state": _t(e.state, MAX_NAME),
                "link_layer": _t(e.link_layer, MAX_NAME),
                "hw_timestamps": bool(e.hw_timestamps),
                "problem": None if e.problem is None else _t(e.problem),
            }
            for e in eps[:MAX_ENDPOINTS]
        ],
        "endpoints_total": len(eps),
        "nodes": len(nodes_of(result)),
        "rounds": result.rounds,
        "pairs": scheduled,
        "probed": probed,
        "baselines": [
            {
                "group": _t(b.group, MAX_NAME),
                "pairs": b.pairs,
                "median_us": _finite(b.median_us),
                "p90_us": _finite(b.p90_us),
            }
            for b in result.baselines[:MAX_BASELINES]
        ],
        "verdicts": [
            {
                "culprit": v.culprit.value,
                "level": v.level.name,
                "subject": _t(v.subject),
                "why": _t(v.why),
                "rail": v.rail,
                "next": [_t(c) for c in v.next[:MAX_NEXT]],
            }
            for v in verdicts[:MAX_VERDICTS]
        ],
        "verdicts_total": len(verdicts),
        "unreachable": [[_t(n, MAX_NAME), _t(w)] for n, w in sorted(result.unreachable.items())][
            :MAX_UNREACHABLE
        ],
        "map": {
            "unit": f.unit,
            "per_cell": f.per_cell,
            "total": f.total,
            "labels": [_t(s, MAX_NAME) for s in f.labels],
            "rows": f.rows(),
        },
    }


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 3)


def save(result: MeshResult, path: str) -> None:
    """The summary of `result` at `path`, atomically: a temporary file in the same directory
    (created 0755 if need be), mode 0644, renamed over the old one. OSError as it comes."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    data = json.dumps(summary(result), separators=(",", ":"), allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=".mesh.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- loading -----------------------------------------------------------------------------------


class _Bad(Exception):
    """A field that is not what a mesh summary holds: where, and what is wrong."""


def load(path: str) -> LastMesh:
    """The last mesh at `path`. FileNotFoundError when there is none (no mesh ran here yet);
    DataError (exit 7) for a file that is not a mesh summary; PermissionError and other
    OSErrors as DataError too, with the reason."""
    raw = _read(path)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DataError(f"last mesh {path}: not JSON ({type(e).__name__})", _HINT) from None
    try:
        return _parse(path, data)
    except _Bad as e:
        raise DataError(f"last mesh {path}: malformed: {e}", _HINT) from None
    except RecursionError:
        raise DataError(f"last mesh {path}: malformed: nested too deep", _HINT) from None


_HINT = "run ibtool mesh again to replace it"


def _read(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise DataError(f"last mesh {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataError(f"last mesh {path}: not a regular file", _HINT)
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise DataError(f"last mesh {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise DataError(f"last mesh {path}: larger than {MAX_BYTES >> 20} MiB", _HINT)
    return b"".join(chunks)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number")


def _obj(x, where: str) -> dict:
    if not isinstance(x, dict):
        raise _Bad(f"{where}: not an object")
    return x


def _list(x, where: str, most: int) -> list:
    if not isinstance(x, list):
        raise _Bad(f"{where}: not a list")
    if len(x) > most:
        raise _Bad(f"{where}: more than {most}")
    return x


def _int(x, where: str, low: int = 0, high: int = 1 << 40) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not low <= x <= high:
        raise _Bad(f"{where}: not an integer from {low} to {high}")
    return x


def _num(x, where: str, low: float = 0.0, high: float = 1e15) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not low <= x <= high:
        raise _Bad(f"{where}: not a number from {low:g} to {high:g}")
    return float(x)


def _opt_num(x, where: str) -> float | None:
    return None if x is None else _num(x, where)


def _str(x, where: str, most: int = MAX_NAME, empty: bool = False) -> str:
    if not isinstance(x, str):
        raise _Bad(f"{where}: not a string")
    if len(x) > most or (not x and not empty):
        raise _Bad(f"{where}: {'empty' if not x else f'longer than {most}'}")
    if printable(x, most) != x:
        raise _Bad(f"{where}: holds control characters")
    return x


def _opt_str(x, where: str, most: int = MAX_TEXT) -> str | None:
    return None if x is None else _str(x, where, most, empty=True)


def _bool(x, where: str) -> bool:
    if not isinstance(x, bool):
        raise _Bad(f"{where}: not true or false")
    return x


def _parse(path: str, data) -> LastMesh:
    d = _obj(data, "the file")
    if d.get("format") != FORMAT:
        raise _Bad("not an ibtool mesh summary")
    if d.get("version") != VERSION:
        raise _Bad(f"format version is not {VERSION}")
    s = _obj(d.get("settings"), "settings")
    settings = Settings(
        count=_int(s.get("count"), "settings.count", 0, 1 << 31),
        size=_int(s.get("size"), "settings.size", 0, 1 << 31),
        mode=_str(s.get("mode"), "settings.mode", 32),
        rate=_num(s.get("rate"), "settings.rate"),
        timeout=_num(s.get("timeout"), "settings.timeout"),
        all_rails=_bool(s.get("all_rails"), "settings.all_rails"),
        slow_factor=_num(s.get("slow_factor"), "settings.slow_factor"),
        tcp_port=_int(s.get("tcp_port"), "settings.tcp_port", 0, 65535),
        engine=_str(s.get("engine"), "settings.engine", 64),
        # the path's, kept since they were (a summary before them is of the defaults)
        sl=_int(s.get("sl", 0), "settings.sl", 0, 15),
        tclass=_int(s.get("tclass", 0), "settings.tclass", 0, 255),
        pkey_index=_int(s.get("pkey_index", 0), "settings.pkey_index", 0, 0xFFFF),
        gid_index=None
        if s.get("gid_index") is None
        else _int(s.get("gid_index"), "settings.gid_index", 0, 255),
        full_payload=_int(s.get("full_payload", 0), "settings.full_payload", 0, 1000),
        qps=_int(s.get("qps", 1), "settings.qps", 1, 64),
        bw=_bool(s.get("bw", False), "settings.bw"),
        rails=_str(s.get("rails", "rank"), "settings.rails", 16),
    )
    endpoints = []
    for k, e in enumerate(_list(d.get("endpoints"), "endpoints", MAX_ENDPOINTS)):
        w = f"endpoints[{k}]"
        e = _obj(e, w)
        endpoints.append(
            Endpoint(
                node=_str(e.get("node"), f"{w}.node"),
                device=_str(e.get("device"), f"{w}.device"),
                port=_int(e.get("port"), f"{w}.port", 0, 255),
                rail=_int(e.get("rail"), f"{w}.rail", 0, 1 << 16),
                address=_str(e.get("address"), f"{w}.address", empty=True),
                state=_str(e.get("state"), f"{w}.state", 32),
                link_layer=_str(e.get("link_layer"), f"{w}.link_layer", 32),
                hw_timestamps=_bool(e.get("hw_timestamps"), f"{w}.hw_timestamps"),
                problem=_opt_str(e.get("problem"), f"{w}.problem"),
            )
        )
    total = _int(d.get("endpoints_total"), "endpoints_total")
    if total < len(endpoints):
        raise _Bad("endpoints_total: fewer than the endpoints listed")
    baselines = []
    for k, b in enumerate(_list(d.get("baselines"), "baselines", MAX_BASELINES)):
        w = f"baselines[{k}]"
        b = _obj(b, w)
        baselines.append(
            Baseline(
                _str(b.get("group"), f"{w}.group"),
                _int(b.get("pairs"), f"{w}.pairs"),
                _opt_num(b.get("median_us"), f"{w}.median_us"),
                _opt_num(b.get("p90_us"), f"{w}.p90_us"),
            )
        )
    verdicts = []
    culprits = {c.value: c for c in Culprit}
    levels = {lv.name: lv for lv in Level}
    for k, v in enumerate(_list(d.get("verdicts"), "verdicts", MAX_VERDICTS)):
        w = f"verdicts[{k}]"
        v = _obj(v, w)
        if v.get("culprit") not in culprits:
            raise _Bad(f"{w}.culprit: not one of {', '.join(culprits)}")
        if v.get("level") not in levels:
            raise _Bad(f"{w}.level: not WARN or FAIL")
        rail = v.get("rail")
        verdicts.append(
            Verdict(
                culprits[v["culprit"]],
                levels[v["level"]],
                _str(v.get("subject"), f"{w}.subject", MAX_TEXT),
                _str(v.get("why"), f"{w}.why", MAX_TEXT, empty=True),
                (),  # the subject names them
                None if rail is None else _int(rail, f"{w}.rail", 0, 1 << 16),
                tuple(
                    _str(c, f"{w}.next[{j}]", MAX_TEXT)
                    for j, c in enumerate(_list(v.get("next"), f"{w}.next", MAX_NEXT))
                ),
            )
        )
    verdicts_total = _int(d.get("verdicts_total"), "verdicts_total")
    if verdicts_total < len(verdicts):
        raise _Bad("verdicts_total: fewer than the verdicts listed")
    unreachable = []
    for k, u in enumerate(_list(d.get("unreachable"), "unreachable", MAX_UNREACHABLE)):
        u = _list(u, f"unreachable[{k}]", 2)
        if len(u) != 2:
            raise _Bad(f"unreachable[{k}]: not [node, why]")
        unreachable.append(
            (_str(u[0], f"unreachable[{k}][0]"), _str(u[1], f"unreachable[{k}][1]", MAX_TEXT, True))
        )
    return LastMesh(
        path=path,
        started=_num(d.get("started"), "started", 0.0, 1e11),
        elapsed=_num(d.get("elapsed"), "elapsed", 0.0, 1e9),
        settings=settings,
        endpoints=tuple(endpoints),
        endpoints_total=total,
        nodes=_int(d.get("nodes"), "nodes"),
        rounds=_int(d.get("rounds"), "rounds"),
        pairs=_int(d.get("pairs"), "pairs"),
        probed=_int(d.get("probed"), "probed"),
        baselines=tuple(baselines),
        verdicts=tuple(verdicts),
        verdicts_total=verdicts_total,
        unreachable=tuple(unreachable),
        map=_map(_obj(d.get("map"), "map")),
    )


def _map(m: dict) -> Fold:
    unit = m.get("unit")
    if unit not in ("endpoint", "node", "nodes", "endpoints"):
        raise _Bad("map.unit: not endpoint, node or nodes")
    labels = [
        _str(s, f"map.labels[{k}]")
        for k, s in enumerate(_list(m.get("labels"), "map.labels", MAP_CELLS))
    ]
    rows = _list(m.get("rows"), "map.rows", MAP_CELLS)
    if len(rows) != len(labels):
        raise _Bad("map.rows: not one a label")
    cells = []
    for k, row in enumerate(rows):
        if not isinstance(row, str) or len(row) != len(labels):
            raise _Bad(f"map.rows[{k}]: not a string of one glyph a label")
        try:
            cells.append(tuple(CODE[ch] for ch in row))
        except KeyError:
            raise _Bad(f"map.rows[{k}]: a glyph that is not a health") from None
    return Fold(
        unit,
        _int(m.get("per_cell"), "map.per_cell", 1, 1 << 31),
        tuple(labels),
        tuple(cells),
        _int(m.get("total"), "map.total"),
    )

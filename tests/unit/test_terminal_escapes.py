"""Nothing a capture, a tree or the kernel names reaches a terminal raw.

A device, netdev, process or kernel-object name is whatever the kernel was told (an RDMA
device may be renamed to anything without '/', a netdev to anything without '/', ':' or white
space) or whatever a forged capture holds. In text, every command writes such a name with its
control and format characters escaped (\\x1b, \\n, \\u202e): it can neither drive the terminal
(colours, the title, the cursor), nor forge an output line, nor reverse what follows it. JSON
escapes them itself."""

from __future__ import annotations

import gzip
import json
import random
import unicodedata
from pathlib import Path

import pytest

from tests.fixtures import captured_kernel
from tests.fixtures.sysfs_trees import require_capture

CAPTURED = captured_kernel.CAPTURED / "snapshot" / "host.json.gz"
HOSTILE = "\x1b[31mX\x07\r\x08\u202e"
# what a terminal obeys or a reader misreads: controls, formats (bidi), line separators
UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
READ_ONLY = (
    ["dev"],
    ["dev", "-d"],
    ["port"],
    ["-d", "port"],
    ["gids"],
    ["counters"],
    ["counters", "--errors"],
    ["res"],
    *(["res", kind] for kind in ("qp", "cq", "mr", "pd", "cm_id", "ctx", "srq")),
    ["-d", "res", "qp"],
    ["system"],
    ["link"],
    ["health"],
)


def _raw(text: str) -> list[str]:
    """The characters of `text` a terminal would obey, a newline ending a line apart."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in UNPRINTABLE]


def _load() -> dict:
    with gzip.open(require_capture(CAPTURED)) as f:
        return json.load(f)


def _poison(node, names: frozenset[str], value):
    """Every string under `node` whose key is in `names`, with `value(string)` instead."""
    if isinstance(node, dict):
        return {
            k: value(v) if isinstance(v, str) and k in names else _poison(v, names, value)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_poison(v, names, value) for v in node]
    return node


def _renamed(data: dict, old: str, new: str) -> dict:
    """The capture with device `old` called `new` everywhere: its sysfs paths and links, its
    netlink and verbs answers."""
    text = json.dumps(data)
    return json.loads(text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))


NAMES = frozenset(
    (
        "RDMA_NLDEV_ATTR_NDEV_NAME",
        "RDMA_NLDEV_ATTR_RES_KERN_NAME",
        "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME",
        "RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_NAME",
        "message",
        "hint",
    )
)


@pytest.fixture(scope="module")
def captured() -> dict:
    return _load()


def _write(tmp_path: Path, data: dict, name: str = "s.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_names_from_a_capture_are_escaped_in_every_command(cli, captured, tmp_path):
    data = _poison(captured, NAMES, lambda v: v + HOSTILE)
    data["comm"] = {pid: comm + HOSTILE for pid, comm in data["comm"].items()}
    snapshot = _write(tmp_path, data)
    for argv in READ_ONLY:
        r = cli("--snapshot", snapshot, *argv)
        assert not _raw(r.out + r.err), (argv, r.out + r.err)
    qp = cli("--snapshot", snapshot, "res", "qp")
    assert "\\x1b[31mX\\x07\\r\\x08\\u202e" in qp.out  # shown, escaped, not dropped
    assert qp.code == 0


def test_a_snapshot_diff_escapes_both_sides(cli, captured, tmp_path):
    before = _write(tmp_path, captured, "a.json")
    data = _poison(captured, NAMES, lambda v: v + HOSTILE)
    data["comm"] = {pid: comm + HOSTILE for pid, comm in data["comm"].items()}
    r = cli("snapshot", "diff", before, _write(tmp_path, data, "b.json"))
    assert r.code == 0 and not _raw(r.out + r.err), r.out
    assert "\\u202e" in r.out


@pytest.mark.parametrize("name", ["rxe\x1b]0;owned\x07", "rxe0\nrxe9: state ACTIVE", "rxe\u202e0"])
def test_a_device_name_can_neither_drive_the_terminal_nor_forge_a_line(
    cli, captured, tmp_path, name
):
    snapshot = _write(tmp_path, _renamed(captured, "rxe0", name))
    shown = json.dumps(name, ensure_ascii=False)[1:-1].replace("\\u001b", "\\x1b")
    shown = shown.replace("\\u0007", "\\x07").replace("\u202e", "\\u202e")
    for argv in (["dev"], ["port"], ["gids"], ["counters"], ["res", "qp"], ["health"]):
        r = cli("--snapshot", snapshot, *argv)
        assert not _raw(r.out + r.err), (argv, r.out + r.err)
        assert "ValueError" not in r.out + r.err
    port = cli("--snapshot", snapshot, "port")
    lines = port.out.splitlines()
    assert len(lines) == 2 and any(line.startswith(f"{shown}/1: state ") for line in lines)
    health = cli("--snapshot", snapshot, "health")
    assert f"port {shown}/1: " in health.out
    # a program reads the name as it is
    assert name in [d["ifname"] for d in cli("--snapshot", snapshot, "-j", "dev").json]


def test_a_device_name_in_a_root_tree_is_escaped(cli, mlx5_roce):
    root = mlx5_roce.root / "sys" / "class" / "infiniband"
    (link,) = root.iterdir()
    link.rename(root / "mlx5\x1b[2J_0")
    for argv in (["dev"], ["port"], ["gids"], ["counters", "--errors"], ["health"]):
        r = mlx5_roce(*argv)
        assert not _raw(r.out + r.err), (argv, r.out + r.err)
        assert "ValueError" not in r.out + r.err
    assert mlx5_roce("dev").out.startswith("mlx5\\x1b[2J_0: node_type ca")


def test_a_warning_is_one_line_whatever_a_name_holds(cli, captured, tmp_path):
    # a malformed value is warned about, naming the device
    data = _renamed(captured, "rxe1", "rxe1\nibtool: error: forged")
    for entry in data["sysfs"]:
        if entry["path"].endswith("/ports/1/state"):
            entry["text"] = "garbage\x1b[31m\n"
    r = cli("--snapshot", _write(tmp_path, data), "port")
    assert not _raw(r.out + r.err)
    assert "ibtool: warning: rxe1\\nibtool: error: forged/ports/1/state: " in r.err
    assert not any(line.startswith("ibtool: error: forged") for line in r.err.splitlines())


# -- the property: random control, format and separator characters in every name ------------

# C0 and C1 controls, DEL, bidi overrides and isolates, zero-width, line and paragraph
# separators: everything a terminal obeys or a reader misreads
ALPHABET = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
ALPHABET += list("\u200b\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
ALPHABET += ["\u2028", "\u2029", "\ufeff"]


def _noise(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        chars.insert(rng.randint(0, len(chars)), rng.choice(ALPHABET))
    return "".join(chars).replace("\x00", "\x01").replace("/", "\x02")


@pytest.mark.parametrize("seed", range(6))
def test_no_command_writes_a_raw_control_character_from_any_name(cli, captured, tmp_path, seed):
    rng = random.Random(seed)
    device = _noise(rng, "rxe0")
    data = _renamed(captured, "rxe0", device)
    data = _poison(data, NAMES, lambda v: _noise(rng, v))
    data["comm"] = {pid: _noise(rng, comm) for pid, comm in data["comm"].items()}
    for key in ("host", "kernel"):
        data[key] = _noise(rng, data[key])
    snapshot = _write(tmp_path, data)
    for argv in READ_ONLY:
        r = cli("--snapshot", snapshot, *argv)
        assert not _raw(r.out + r.err), (seed, argv, r.out + r.err)
    for argv in (["snapshot", "show", snapshot], ["snapshot", "diff", snapshot, snapshot]):
        r = cli(*argv)
        assert not _raw(r.out + r.err), (seed, argv, r.out + r.err)

"""One bad entry never takes down the rest (issue #8, class 2), as a property of the fixture trees.

Any single file of a tree (an attribute, a link, a failing read's stand-in) replaced by arbitrary
bytes, an empty file, a directory or a dangling link: every read-only command, as text and as
JSON, exits with a documented status (0; `gids --best` also 1, no GID), prints no traceback and
no internal error, names the file in at most one warning, and shows every other device exactly
as before. Where the bad file changes what is shown, and it is no value a driver may legitimately
leave empty, a warning names it.

The trees hold several devices each, so that "the others" exist: an InfiniBand HCA with two iWARP
adapters, a RoCE NIC with an Omni-Path HFI, and the rxe device captured from a real kernel with
an iWARP adapter. Hypothesis draws the file (a kind of file first,
so that the few attributes are not drowned by the many GID slots and counters) and what replaces
it; the run is derandomized and bounded, the same examples every time, a few seconds in all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibtool import cli
from ibtool.errors import ExitCode
from ibtool.plugin import manager as plugins
from tests.fixtures import sysfs_trees
from tests.unit.conftest import Result, run_cli

ROOTS = {
    # root: (builders, the netdev `gids --best` is asked about)
    "ib_and_iwarp": (("mlx5_ib_hca", "cxgb4_iwarp", "i40iw_iwarp"), "enp5s0f4"),
    "roce_and_opa": (("mlx5_roce", "hfi1_opa"), "enp3s0f0"),
    # rxe: the tree captured from the testbed's kernel (a virtual device, its parent netdev)
    "rxe_and_iwarp": (("rxe", "i40iw_iwarp"), "veth0"),
}
READ_ONLY = (
    "dev",
    "-d dev",
    "port",
    "-d port",
    "gids",
    "gids --best",
    "counters",
    "counters --errors",
)
COMMANDS = [(*c.split(), *j) for c in READ_ONLY for j in ((), ("-j",))]
# Exit statuses documented for these commands on a tree with one bad file (ibtool(8)).
ALLOWED = {"gids --best": {ExitCode.OK, ExitCode.FAILED}}
# Attributes a driver may leave empty (rxe's fw_ver is an empty line): empty is no error there.
MAY_BE_EMPTY = {"fw_ver", "hca_type", "board_id", "hw_rev", "node_desc"}
# Only the first slots of the long tables: the rest are alike.
TABLE_SLOT = re.compile(r"/(gids|gid_attrs/types|gid_attrs/ndevs|pkeys)/(\d+)$")
MAX_SLOT = {"gids": 11, "gid_attrs/types": 11, "gid_attrs/ndevs": 11, "pkeys": 1}


@dataclass
class Tree:
    root: Path
    best: str  # the netdev of `gids --best`
    owners: dict[str, tuple[str, ...]]  # file (relative to root) -> the devices it belongs to
    kinds: dict[str, list[str]]  # kind of file -> files
    devices: tuple[str, ...]
    baseline: dict[tuple[str, ...], Result]


def _files(root: Path) -> set[str]:
    """Every file, link and empty directory (a failing read's stand-in) under root."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or os.path.isfile(path) or not os.listdir(path):
                found.add(os.path.relpath(path, root))
    return found


# Files no command reads (PCI ids, netdev attributes but dev_port, P_Keys, driver extras, the
# class/net and bus links): one kind among the others, not dozens.
UNREAD = re.compile(
    r"sys/class/net/.*|sys/bus/.*|.*/(vendor|device|numa_node)"
    r"|.*/net/[^/]+/(address|type|operstate|mtu)|.*/pkeys/\d+"
    r"|.*/infiniband/[^/]+/(fw_pages|reg_pages|boardversion|nctxts|nfreectxts|serial)"
)


def _kind(rel: str) -> str:
    """What a file is, whatever its device, port or slot: what Hypothesis draws first."""
    if UNREAD.fullmatch(rel) and not rel.endswith("/device"):
        return "unread"
    kind = re.sub(r"\d+", "N", rel.split("/infiniband/", 1)[-1])
    for group in ("/counters/", "/hw_counters/"):
        if group in kind:
            return kind.split(group)[0] + group + "*"
    return kind


def _aliases(root: Path, rel: str, devices: tuple[str, ...]) -> list[str]:
    """How warnings name a file: relative to class/infiniband, through the device it belongs to
    (or that device's bus device), or by its path outside the devices' trees."""
    class_ib = root / "sys" / "class" / "infiniband"
    # the file's own name is kept: it may be a link, which warnings name, not its target
    full = os.path.join(os.path.realpath(os.path.dirname(root / rel)), os.path.basename(rel))
    names = []
    for dev in devices:
        if rel == f"sys/class/infiniband/{dev}":
            names.append(dev)
        for base, prefix in ((class_ib / dev, dev), (class_ib / dev / "device", f"{dev}/device")):
            real = os.path.realpath(base)
            if full.startswith(real + os.sep):
                names.append(f"{prefix}/{os.path.relpath(full, real)}")
    return names or [str(root / rel)]


def _build(root: Path, builders: tuple[str, ...]) -> tuple[dict, tuple[str, ...]]:
    owners: dict[str, tuple[str, ...]] = {}
    class_ib = root / "sys" / "class" / "infiniband"
    for builder in builders:
        before_devices = set(os.listdir(class_ib)) if class_ib.is_dir() else set()
        before = _files(root)
        if builder == "rxe":
            shutil.copytree(sysfs_trees.CAPTURED_RXE, root, symlinks=True, dirs_exist_ok=True)
        else:
            sysfs_trees.build(builder, root)
        devices = tuple(sorted(set(os.listdir(class_ib)) - before_devices))
        for rel in _files(root) - before:
            owners[rel] = devices
    return owners, tuple(sorted(os.listdir(class_ib)))


@pytest.fixture(scope="module", autouse=True)
def _plugins_once():
    """Plugins loaded once for the module, parsers built once: not what is tested here. Each
    run still registers the commands, parses its arguments and maps errors to exit statuses
    as cli.main does."""
    loaded = plugins.build_plugins(warn=lambda message: None)
    parsers: dict[tuple[str, ...], object] = {}

    def build_parser(registry, out=None, err=None, *, only=None):
        key = (*sorted(registry.commands), only)
        if key not in parsers:
            parsers[key] = real_build_parser(registry, out, err, only=only)
        return parsers[key]

    real_build_parser = cli.build_parser
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plugins, "build_plugins", lambda **kw: loaded)
        mp.setattr(cli, "build_parser", build_parser)
        yield


def _run(tree: Tree, argv: tuple[str, ...]) -> Result:
    words = list(argv)
    if "--best" in words:
        words.insert(words.index("--best") + 1, tree.best)
    return run_cli(["--root", str(tree.root), *words])


@pytest.fixture(scope="module")
def trees(tmp_path_factory, _plugins_once) -> dict[str, Tree]:
    built = {}
    for name, (builders, best) in ROOTS.items():
        root = tmp_path_factory.mktemp(name)
        owners, devices = _build(root, builders)
        kinds: dict[str, list[str]] = {}
        for rel in sorted(owners):
            m = TABLE_SLOT.search(rel)
            if m and int(m.group(2)) > MAX_SLOT[m.group(1)]:
                continue
            kinds.setdefault(_kind(rel), []).append(rel)
        tree = Tree(root, best, owners, kinds, devices, {})
        tree.baseline = {argv: _run(tree, argv) for argv in COMMANDS}
        built[name] = tree
    return built


def test_the_trees_are_sound_before_anything_is_replaced(trees):
    for tree in trees.values():
        for argv, r in tree.baseline.items():
            assert r.code in _allowed(argv), (argv, r.err)
            assert "Traceback" not in r.err and "internal error" not in r.err
            assert _unshown(argv, r.warnings) == [], argv
        assert {d["ifname"] for d in tree.baseline[("dev", "-j")].json} == set(tree.devices)


# -- replacing one file ---------------------------------------------------------------------------

REPLACEMENTS = st.one_of(
    st.tuples(st.just("bytes"), st.binary(min_size=1, max_size=48)),
    # numbers in the forms sysfs prints (%d, %u, 0x%x), at any size and sign
    st.tuples(
        st.just("bytes"),
        st.one_of(st.integers().map(str), st.integers(min_value=0).map(hex)).map(
            lambda text: text.encode() + b"\n"
        ),
    ),
    # the file's own content with a few bytes changed: a GID with a non-hex digit, ...
    st.tuples(st.just("corrupted"), st.binary(min_size=1, max_size=3)),
    st.tuples(st.sampled_from(["empty", "directory", "dangling link"]), st.just(b"")),
)


@contextlib.contextmanager
def replaced(path: Path, kind: str, data: bytes):
    """path replaced for the duration, then put back as it was."""
    if path.is_symlink():
        saved = ("link", os.readlink(path))
        path.unlink()
    elif path.is_dir():
        saved = ("dir", None)
        path.rmdir()
    else:
        saved = ("file", path.read_bytes())
        path.unlink()
    try:
        if kind == "directory":
            path.mkdir()
        elif kind == "dangling link":
            os.symlink(f"gone-{path.name}", path)
        elif kind == "corrupted" and saved[0] == "file" and saved[1]:
            # data[0] picks the place, the rest (or data[0] itself) goes there
            original = saved[1]
            at = data[0] % len(original)
            path.write_bytes(original[:at] + (data[1:] or data) + original[at + 1 :])
        else:
            path.write_bytes(data)
        yield
    finally:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
        if saved[0] == "link":
            os.symlink(saved[1], path)
        elif saved[0] == "dir":
            path.mkdir()
        else:
            path.write_bytes(saved[1])


# What each command does not show, so never warns about (files relative to the device).
_PORT = r"ports/\d+/"
_VALUES = _PORT + r"(rate|lid|sm_lid|lid_mask_count|sm_sl|phys_state)"
_STATE = _PORT + "state"
_CAP_MASK = _PORT + "cap_mask"
_DEVICE = r"(fw_ver|node_guid|sys_image_guid|hca_type|board_id)"
_DEVICE_DETAILS = r"(node_desc|hw_rev)"
_GIDS = _PORT + r"(gids/\d+|gid_attrs/types/\d+|gid_attrs/ndevs/[1-9]\d*)"
_COUNTERS = r"(ports/\d+/)?(counters|hw_counters)/.*"
_NOT_GIDS = (_VALUES, _CAP_MASK, _DEVICE, _DEVICE_DETAILS, _COUNTERS)
_PORT_NETDEV = ("parent", "device/net/.*")  # --best matches ports by netdev (IPoIB: "use LIDs")
NOT_SHOWN = {
    "dev": (_VALUES, _STATE, _CAP_MASK, _DEVICE_DETAILS, _GIDS, _COUNTERS),
    "-d dev": (_VALUES, _STATE, _CAP_MASK, _GIDS, _COUNTERS),
    "port": (_CAP_MASK, "node_type", _DEVICE, _DEVICE_DETAILS, _GIDS, _COUNTERS),
    "-d port": ("node_type", _DEVICE, _DEVICE_DETAILS, _GIDS, _COUNTERS),
    "gids": (_STATE, *_NOT_GIDS, *_PORT_NETDEV),
    "gids --best": _NOT_GIDS,
    "counters": (_VALUES, _STATE, _CAP_MASK, _DEVICE, _DEVICE_DETAILS, _GIDS, "node_type"),
}
NOT_SHOWN["counters --errors"] = NOT_SHOWN["counters"]


def _unshown(argv: tuple[str, ...], warnings: list[str]) -> list[str]:
    """The warnings about files the command does not show."""
    command = " ".join(w for w in argv if w != "-j")
    pattern = re.compile("|".join(NOT_SHOWN[command]))
    unshown = []
    for w in warnings:
        name = w.removeprefix("ibtool: warning: ").split(": ", 1)[0]
        if "/" in name and pattern.fullmatch(name.split("/", 1)[1]):
            unshown.append(w)
    return unshown


def _allowed(argv: tuple[str, ...]) -> set[int]:
    command = " ".join(w for w in argv if w not in ("-j", "-d"))
    return ALLOWED.get(command, {ExitCode.OK})


def _names(warning: str, aliases: list[str], rel: str) -> bool:
    """Whether a warning names the file: 'ALIAS: ...', or, for a counter, the counters summary
    of its port naming the counter."""
    message = warning.removeprefix("ibtool: warning: ")
    if any(message.startswith(alias + ":") for alias in aliases):
        return True
    counter = re.search(r"/(counters|hw_counters)/([^/]+)$", rel)
    return counter is not None and bool(re.search(rf"\b{re.escape(counter.group(2))}\b", message))


def _by_device(argv: tuple[str, ...], r: Result) -> dict[str, list]:
    """What a command showed, per device: JSON records, or text lines split into words (table
    columns move with the widest value of any row)."""
    shown: dict[str, list] = {}
    if r.code != 0:
        return shown
    if "-j" in argv:
        records = r.json if isinstance(r.json, list) else [r.json]
        for record in records:
            shown.setdefault(record["ifname"], []).append(record)
        return shown
    lines = r.out.splitlines()
    if "--best" in argv:
        return {"": lines}
    for line in lines:
        words = line.split()
        if not words or words[0] == "DEV":
            continue
        device = re.split(r"[:/]", words[0])[0]
        shown.setdefault(device, []).append(words)
    return shown


def _best_device(tree: Tree) -> str | None:
    r = tree.baseline[("gids", "--best", "-j")]
    return r.json["ifname"] if r.code == 0 else None


@settings(
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data(), replacement=REPLACEMENTS)
def test_one_bad_file_is_one_warning_and_the_rest_is_shown(trees, data, replacement):
    tree = trees[data.draw(st.sampled_from(sorted(trees)), label="tree")]
    kind = data.draw(st.sampled_from(sorted(tree.kinds)), label="kind")
    rel = data.draw(st.sampled_from(tree.kinds[kind]), label="file")
    how, content = replacement
    owners = tree.owners[rel]
    aliases = _aliases(tree.root, rel, owners)
    with replaced(tree.root / rel, how, content):
        results = {argv: _run(tree, argv) for argv in COMMANDS}
    for argv, r in results.items():
        what = f"{' '.join(argv)} with {rel} replaced by {how} {content!r}"
        assert r.code in _allowed(argv), f"{what}: exit {r.code}: {r.err}"
        assert "Traceback" not in r.err and "internal error" not in r.err, f"{what}: {r.err}"
        diagnostics = ("ibtool: warning: ", "ibtool: error: ")
        assert all(line.startswith(diagnostics) for line in r.err.splitlines()), what
        assert _unshown(argv, r.warnings) == [], what
        naming = [w for w in r.warnings if _names(w, aliases, rel)]
        assert len(naming) <= 1, f"{what}: {naming}"
        if r.code == 0 and "-j" in argv:
            json.loads(r.out)
        before, after = _by_device(argv, tree.baseline[argv]), _by_device(argv, r)
        if "--best" in argv:
            if _best_device(tree) not in owners:
                assert (r.code, r.out) == (tree.baseline[argv].code, tree.baseline[argv].out), what
            continue
        for device in tree.devices:
            if device not in owners:
                assert after.get(device) == before.get(device), f"{what}: {device} changed"
        class_link = rel in {f"sys/class/infiniband/{d}" for d in owners}
        if argv[-1] in ("dev", "port") or argv[-2:] in (("dev", "-j"), ("port", "-j")):
            for device in owners:  # shown, unless what was replaced is the device itself
                assert (device in after) != class_link, f"{what}: {device}"
        changed = any(after.get(d) != before.get(d) for d in owners)
        silent_ok = how in ("bytes", "corrupted") or (
            how == "empty" and os.path.basename(rel) in MAY_BE_EMPTY
        )
        if changed and not silent_ok:
            assert naming, f"{what}: the output changed without a warning naming it: {r.err}"

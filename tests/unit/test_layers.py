"""The house's layers, as a contract the tests hold: a new upward import, an import cycle, a
private name used across modules or a plugin reaching past the Host fails here.

Upper rows may import lower rows, never the reverse (the folders' docstrings say the same):

    ibtool.cli                 argument parsing, exit codes
    ibtool.api                 the one surface plugins import
    ibtool.tui                 the dashboard (Textual)
    ibtool.live                the engine and its faces' pollers
    ibtool.health              checks' runs, config, state, Slurm
    ibtool.plugin              hookspecs, the manager, the commands' registry
    ibtool.snapshot            save, the replayed tree, diff
    ibtool.rdma                the data path
    ibtool.host                the one gateway to the sources
    ibtool.sources             sysfs, netlink, verbs, kernel links
    ibtool.views               rendering, res tables, Prometheus exposition
    ibtool.web                 the HTTP server and its web config
    ibtool.model               records, counter meanings, rates, the GID rule, events, findings
    ibtool.errors, .argtypes   the bottom: errors and argument types

Every import counts, the ones inside functions and under TYPE_CHECKING too. The package
``ibtool`` itself (``__version__``, the ``hookimpl`` face) may be imported from anywhere.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
LAYERS = [
    ("ibtool.cli", "ibtool.__main__"),
    ("ibtool.api",),
    ("ibtool.tui",),
    ("ibtool.live",),
    ("ibtool.health",),
    ("ibtool.plugin",),
    ("ibtool.snapshot",),
    ("ibtool.mesh",),
    ("ibtool.doctor",),
    ("ibtool.rdma",),
    ("ibtool.host",),
    ("ibtool.sources",),
    ("ibtool.views",),
    ("ibtool.web",),
    ("ibtool.model",),
    ("ibtool.errors", "ibtool.argtypes", "ibtool.data", "ibtool._version"),
]


def _name(path: Path) -> str:
    parts = list(path.relative_to(CHECKOUT).with_suffix("").parts)
    if parts[0] == "plugins":
        parts[0] = "ibtool_plugins"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    files = [*(CHECKOUT / "ibtool").rglob("*.py"), *(CHECKOUT / "plugins").rglob("*.py")]
    return {_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(files)}


SOURCES = _sources()


def _absolute(module: str, node: ast.ImportFrom, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _ours(name: str) -> bool:
    return name.split(".")[0] in ("ibtool", "ibtool_plugins")


def _imports(module: str) -> list[tuple[int, str, str | None]]:
    """(line, imported module, name taken from it or None) of every import in `module`."""
    path, tree = SOURCES[module]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if _ours(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node, path)
            if not _ours(base):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                # `from ibtool.views import render` imports the module ibtool.views.render
                found.append(
                    (node.lineno, sub, None) if sub in SOURCES else (node.lineno, base, a.name)
                )
    return found


def _layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_every_core_module_has_a_layer():
    core = [m for m in SOURCES if m.startswith("ibtool.")]
    assert [m for m in core if _layer(m) is None] == []


def test_no_core_module_imports_a_layer_above_it():
    upward = []
    for module in SOURCES:
        mine = _layer(module)
        if mine is None:
            continue
        for line, imported, _ in _imports(module):
            theirs = _layer(imported)
            if theirs is not None and theirs < mine:
                upward.append(f"{SOURCES[module][0].relative_to(CHECKOUT)}:{line} -> {imported}")
    assert upward == []


def test_the_core_never_imports_a_plugin_nor_the_api():
    found = [
        f"{module}:{line} -> {imported}"
        for module in SOURCES
        if module.startswith("ibtool.") and module != "ibtool.cli"
        for line, imported, _ in _imports(module)
        if imported.startswith("ibtool_plugins") or imported == "ibtool.api"
    ]
    assert found == []


def _cycles() -> list[list[str]]:
    graph = {m: {i for _, i, _ in _imports(m) if i in SOURCES and i != m} for m in SOURCES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(graph[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return cycles


def test_no_import_cycle():
    assert _cycles() == []


def _module_names(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> the ibtool module it is bound to by an import in `tree`."""
    bound = {}
    path = SOURCES[module][0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name) and a.asname:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node, path)
            for a in node.names:
                if f"{base}.{a.name}" in SOURCES:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
    return bound


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_crosses_a_module():
    crossing = []
    for module, (path, tree) in SOURCES.items():
        where = path.relative_to(CHECKOUT)
        for line, imported, name in _imports(module):
            if name is not None and _private(name):
                crossing.append(f"{where}:{line} imports {imported}.{name}")
        modules = _module_names(tree, module)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and _private(node.attr)
            ):
                crossing.append(f"{where}:{node.lineno} reads {modules[node.value.id]}.{node.attr}")
    assert crossing == []


PLUGINS = sorted(m for m in SOURCES if m.startswith("ibtool_plugins."))


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_plugin_imports_no_other_plugin_and_reads_the_kernel_only_through_the_host(plugin):
    own = ".".join(plugin.split(".")[:2])
    path, tree = SOURCES[plugin]
    wrong = [
        f"{line} -> {imported}"
        for line, imported, _ in _imports(plugin)
        if imported.startswith("ibtool.sources")
        or (imported.startswith("ibtool_plugins.") and not imported.startswith(own))
    ]
    wrong += [
        f"{node.lineno} reads .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("sysfs", "netlink_session")
    ]
    assert wrong == []


FOLDERS = sorted(
    p.parent for p in (CHECKOUT / "ibtool").rglob("__init__.py") if "__pycache__" not in p.parts
)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(CHECKOUT)))
def test_every_folder_says_what_it_holds_and_what_it_may_import(folder):
    doc = ast.get_docstring(SOURCES[_name(folder / "__init__.py")][1]) or ""
    said = re.search(r"may import|imports? only", doc, re.IGNORECASE)
    assert said, f"{folder}/__init__.py: say what it may import"


def _defined_here(tree: ast.Module) -> set[str]:
    """The names a module defines or assigns as attributes (self._x = ..., def _x)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def test_no_object_s_private_attribute_is_read_where_it_is_not_defined():
    """`host._sysfs` outside host.py, a library's `Enum._value2member_map_`: what is private
    to another module's class, or to a library, is not this module's to read."""
    allowed = {"_exit"}  # os._exit: documented, for a child that must not run atexit handlers
    found = []
    for _module, (path, tree) in SOURCES.items():
        mine = _defined_here(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and node.attr not in mine | allowed
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(CHECKOUT)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """What a module defines at its top (None when a module __getattr__ answers any name)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            inner = ast.Module(body=list(ast.iter_child_nodes(node)), type_ignores=[])
            names |= _top_level_names(inner) or set()
    return names


def test_every_name_read_from_an_ibtool_module_is_there():
    """After a move, `module.name` naming what went elsewhere fails only when that line runs
    (a dashboard's loopback did, in the testbed): every such read is checked here."""
    missing = []
    for module, (path, tree) in SOURCES.items():
        modules = _module_names(tree, module)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            target = modules.get(node.value.id)
            if target is None or target not in SOURCES:
                continue
            defined = _top_level_names(SOURCES[target][1])
            if defined is None or node.attr in defined or f"{target}.{node.attr}" in SOURCES:
                continue
            missing.append(f"{path.relative_to(CHECKOUT)}:{node.lineno} {target}.{node.attr}")
    assert missing == []

"""The house's layers, as a contract the tests hold: the graph of which folder may import
which, no import cycle, no private name used across modules, no plugin reaching past the Host.

What each folder may import (the folders' docstrings say the same, and a test holds them to
it); the bottom (ibtool.errors, .argtypes, .data, ._version, and the package ``ibtool``
itself: ``__version__``, the ``hookimpl`` face) any of them may:

    ibtool.cli       plugin, snapshot, views, model              argument parsing, exit codes
    ibtool.api       all but sources and cli                     the surface plugins import
    ibtool.tui       live, mesh, views, model                    the dashboard: never the data
                                                                 path, a source or the Host
    ibtool.live      health, plugin, snapshot, host, web, views, model
                                                                 the engine and its faces
    ibtool.health    plugin, snapshot, host, views, model        checks' runs, config, state
    ibtool.doctor    rdma, host, views, model                    two hosts: never mesh
    ibtool.mesh      rdma, host, views, model                    many hosts: never doctor
    ibtool.plugin    snapshot, host, views, model                hookspecs, manager, commands
    ibtool.snapshot  host, sources, model                        a Host of its own: it saves
                                                                 and replays the sources
    ibtool.rdma      sources, model                              the data path (verbs)
    ibtool.host      sources, model                              the one gateway to sources
    ibtool.sources   model                                       sysfs, netlink, verbs, ...
    ibtool.views     model                                       rendering, exposition
    ibtool.web       model                                       the HTTP server
    ibtool.model     (the bottom only)                           records, pure functions

So above the Host, only the Host reaches the sources (snapshot, which is one, excepted);
sibling features stand apart; views and web are leaves beside sources, not below them. Every
import counts, the ones inside functions and under TYPE_CHECKING too, and an ibtool module is
never imported by a name computed at run time (importlib, sys.modules) outside the plugin
manager. What still goes around the Host is listed below by module, with why; the list may
only shrink (a listed edge that is gone fails too, so the list stays true).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
BOTTOM = ("ibtool.errors", "ibtool.argtypes", "ibtool.data", "ibtool._version")
FOLDERS_OF = {  # a layer -> the modules (prefixes) it is
    "cli": ("ibtool.cli", "ibtool.__main__"),
    "api": ("ibtool.api",),
    "tui": ("ibtool.tui",),
    "live": ("ibtool.live",),
    "health": ("ibtool.health",),
    "doctor": ("ibtool.doctor",),
    "mesh": ("ibtool.mesh",),
    "plugin": ("ibtool.plugin",),
    "snapshot": ("ibtool.snapshot",),
    "rdma": ("ibtool.rdma",),
    "host": ("ibtool.host",),
    "sources": ("ibtool.sources",),
    "views": ("ibtool.views",),
    "web": ("ibtool.web",),
    "model": ("ibtool.model",),
    "bottom": BOTTOM,
}
MAY_IMPORT = {
    "cli": {"plugin", "snapshot", "views", "model"},
    "api": {
        "tui",
        "live",
        "health",
        "doctor",
        "mesh",
        "plugin",
        "snapshot",
        "rdma",
        "host",
        "views",
        "web",
        "model",
    },  # fmt: skip
    "tui": {"live", "mesh", "views", "model"},
    "live": {"health", "plugin", "snapshot", "host", "web", "views", "model"},
    "health": {"plugin", "snapshot", "host", "views", "model"},
    "doctor": {"rdma", "host", "views", "model"},
    "mesh": {"rdma", "host", "views", "model"},
    "plugin": {"snapshot", "host", "views", "model"},
    "snapshot": {"host", "sources", "model"},
    "rdma": {"sources", "model"},
    "host": {"sources", "model"},
    "sources": {"model"},
    "views": {"model"},
    "web": {"model"},
    "model": set(),
    "bottom": set(),
}
# Edges the graph forbids that are still there, each with why.
AROUND_THE_HOST = {
    ("ibtool.cli", "ibtool.sources.versions"): "--version reads what runs beneath from files, "
    "before there is a Host and without importing it (start-up)",
}
# ibtool modules looked up by name at run time: only the plugin manager loads by name (the
# plugins are what it loads).
BY_NAME: dict[str, str] = {}


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


def _folder(module: str) -> str | None:
    for folder, prefixes in FOLDERS_OF.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return folder
    return None


def _forbidden(module: str, imported: str) -> str | None:
    """Why `module` may not import `imported` (None: it may)."""
    mine, theirs = _folder(module), _folder(imported)
    if mine is None or theirs is None or imported == "ibtool" or theirs in ("bottom", mine):
        return None
    if theirs in MAY_IMPORT[mine]:
        return None
    return f"{mine} may not import {theirs}"


def test_every_core_module_has_a_folder():
    core = [m for m in SOURCES if m.startswith("ibtool.")]
    assert [m for m in core if _folder(m) is None] == []


def _edges() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for module in SOURCES:
        for line, imported, _ in _imports(module):
            why = _forbidden(module, imported)
            if why is not None:
                where = f"{SOURCES[module][0].relative_to(CHECKOUT)}:{line}"
                found.setdefault((module, imported), f"{where} -> {imported}: {why}")
    return found


def test_no_module_imports_what_its_folder_may_not():
    found = _edges()
    assert [v for k, v in sorted(found.items()) if k not in AROUND_THE_HOST] == []


def test_the_edges_around_the_host_that_are_left_are_still_there():
    """A listed edge that went is taken off the list: it says what is left, no more."""
    assert sorted(set(AROUND_THE_HOST) - set(_edges())) == []


@pytest.mark.parametrize(
    "module, imported",
    [
        ("ibtool.sources.sysfs.device", "ibtool.views.render"),
        ("ibtool.views.prometheus", "ibtool.web.server"),
        ("ibtool.health.run", "ibtool.rdma.ladder"),
        ("ibtool.tui.app", "ibtool.rdma.loopback"),
        ("ibtool.tui.app", "ibtool.sources.verbs"),
        ("ibtool.tui.app", "ibtool.host"),
        ("ibtool.live.watch", "ibtool.sources.netlink.monitor"),
        ("ibtool.doctor.run", "ibtool.mesh.agent"),
        ("ibtool.mesh.run", "ibtool.doctor.checks"),
        ("ibtool.model.records", "ibtool.host"),
        ("ibtool.rdma.ladder", "ibtool.host"),
        ("ibtool.web.server", "ibtool.views.prometheus"),
    ],
)
def test_the_graph_forbids_the_edges_it_is_for(module, imported):
    assert _forbidden(module, imported) is not None


@pytest.mark.parametrize(
    "module, imported",
    [
        ("ibtool.tui.app", "ibtool.live.feed"),
        ("ibtool.snapshot.save", "ibtool.sources.sysfs.rooted"),
        ("ibtool.doctor.run", "ibtool.rdma.ladder"),
        ("ibtool.sources.sysfs.values", "ibtool.model.names"),
        ("ibtool.host", "ibtool.errors"),
        ("ibtool.web.server", "ibtool"),
    ],
)
def test_the_graph_lets_through_what_it_allows(module, imported):
    assert _forbidden(module, imported) is None


def _by_name(tree: ast.Module) -> list[tuple[int, str]]:
    """Imports of an ibtool module by a name computed at run time: importlib.import_module,
    __import__, sys.modules[...] or sys.modules.get(...) with a name that starts ibtool."""
    found = []
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call):
            f = node.func
            name = ast.unparse(f)
            if name in ("importlib.import_module", "__import__", "sys.modules.get") and node.args:
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
            arg = node.slice
        if arg is None:
            continue
        text = ast.unparse(arg)
        if re.match(r"""^f?['"]ibtool[._'"]""", text):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_source_is_handed_the_host():
    """A source is given what it needs (a root, a warn, a session), never the Host to call
    back into: the Host calls the sources, not the reverse (`rdma link` went to links.add
    with the Host once, and came back to it for its session and kernel)."""
    found = []
    for module, (path, tree) in SOURCES.items():
        if _folder(module) != "sources":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in (*node.args.posonlyargs, *node.args.args,
                                         *node.args.kwonlyargs)]  # fmt: skip
                if "host" in names:
                    found.append(f"{path.relative_to(CHECKOUT)}:{node.lineno} {node.name}")
    assert found == []


def test_no_ibtool_module_is_imported_by_a_name_computed_at_run_time():
    found = {}
    for module, (path, tree) in SOURCES.items():
        if module == "ibtool.plugin.manager":
            continue  # loading plugins by name is what it is for
        for line, said in _by_name(tree):
            found.setdefault(module, []).append(f"{path.relative_to(CHECKOUT)}:{line} {said}")
    assert sorted(set(found) - set(BY_NAME)) == [], found
    assert sorted(set(BY_NAME) - set(found)) == []  # the list says what is left, no more


def test_a_name_computed_at_run_time_is_seen():
    tree = ast.parse(
        "import importlib, sys\n"
        "importlib.import_module('ibtool.rdma.ladder')\n"
        "sys.modules.get('ibtool.snapshot.save')\n"
        "sys.modules['ibtool.host']\n"
        "importlib.import_module(f'ibtool.sources.{x}')\n"
        "importlib.import_module('pyverbs.device')\n"
    )
    assert [line for line, _ in _by_name(tree)] == [2, 3, 4, 5]


def test_the_core_never_imports_a_plugin_nor_the_api():
    found = [
        f"{module}:{line} -> {imported}"
        for module in SOURCES
        if module.startswith("ibtool.") and module != "ibtool.cli" and _folder(module) != "api"
        for line, imported, _ in _imports(module)
        if imported.startswith("ibtool_plugins") or _folder(imported) == "api"
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


# Tests still reading a private name of ibtool, by file, with why; the list may only shrink.
PRIVATE_IN_TESTS: dict[str, str] = {}


def _private_reads(tree: ast.Module) -> list[str]:
    """Private names of ibtool modules that `tree` imports or reads as module attributes."""
    bound: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _ours(node.module):
            for a in node.names:
                whole = f"{node.module}.{a.name}"
                if _private(a.name) and whole not in SOURCES:
                    found.append(f"{node.lineno} {whole}")
                elif whole in SOURCES or node.module in SOURCES:
                    bound[a.asname or a.name] = whole
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name):
                    bound[a.asname or a.name.split(".")[0]] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _private(node.attr)
        ):
            found.append(f"{node.lineno} {bound[node.value.id]}.{node.attr}")
        elif (  # monkeypatch.setattr(module, "_name", ...): a private seam replaced
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("setattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in bound
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.append(f"{node.lineno} {bound[node.args[0].id]}.{node.args[1].value}")
    return sorted(found)


TESTS = sorted(
    p for p in (CHECKOUT / "tests").rglob("*.py") if "__pycache__" not in p.parts
)  # fmt: skip


def test_the_tests_go_through_public_names():
    """A test that reads a private name pins the inside of a module, not what it does: it
    breaks on a refactor that changes no behaviour, and passes on one that breaks it."""
    found = {
        str(p.relative_to(CHECKOUT)): reads
        for p in TESTS
        if (reads := _private_reads(ast.parse(p.read_text(), str(p))))
    }
    assert {f: r for f, r in found.items() if f not in PRIVATE_IN_TESTS} == {}
    assert sorted(set(PRIVATE_IN_TESTS) - set(found)) == []  # the list says what is left


def test_the_private_reads_of_a_test_are_seen():
    tree = ast.parse(
        "from ibtool.snapshot.save import _write, load\n"
        "from ibtool.sources import verbs\n"
        "import ibtool.cli as cli\n"
        "from ibtool import _version\n"
        "verbs._unavailable(); cli._plugins_command; verbs.unavailable(); _version.__version__\n"
        "monkeypatch.setattr(verbs, '_seam', None); monkeypatch.setattr(verbs, 'seam', None)\n"
    )
    assert _private_reads(tree) == [
        "1 ibtool.snapshot.save._write",
        "5 ibtool.cli._plugins_command",
        "5 ibtool.sources.verbs._unavailable",
        "6 ibtool.sources.verbs._seam",
    ]


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


# Plugins whose imports still go past ibtool.api, each with why; the list may only shrink.
PAST_THE_API: dict[str, str] = {}


def _past_the_api(plugin: str) -> list[str]:
    """The imports of `plugin` from ibtool that are not ibtool.api's (its own package's are
    its own business)."""
    return [
        f"{SOURCES[plugin][0].relative_to(CHECKOUT)}:{line} -> {imported}"
        + (f".{name}" if name else "")
        for line, imported, name in _imports(plugin)
        if imported.startswith("ibtool") and not imported.startswith("ibtool_plugins")
        and _folder(imported) != "api"
    ]  # fmt: skip


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_plugin_imports_ibtool_only_through_the_api(plugin):
    """ibtool.api is the plugins' surface (ibtool-plugins(8)): the built-in plugins are held
    to it as a third party's would be, so what they need is in it and the core may move
    beneath it. hookimpl too is taken from ibtool.api, not from the package ibtool."""
    if plugin in PAST_THE_API:
        assert _past_the_api(plugin) != [], f"{plugin} is past the api no more: unlist it"
    else:
        assert _past_the_api(plugin) == []


def test_the_api_check_sees_a_plugin_going_past_it():
    SOURCES["ibtool_plugins.probe_only"] = (
        CHECKOUT / "plugins" / "probe_only.py",
        ast.parse("from ibtool.api import Host\nfrom ibtool.mesh.run import mesh\n"
                  "from ibtool import hookimpl\n"),
    )  # fmt: skip
    try:
        assert _past_the_api("ibtool_plugins.probe_only") == [
            "plugins/probe_only.py:2 -> ibtool.mesh.run.mesh",
            "plugins/probe_only.py:3 -> ibtool.hookimpl",
        ]
    finally:
        del SOURCES["ibtool_plugins.probe_only"]


FOLDERS = sorted(
    p.parent for p in (CHECKOUT / "ibtool").rglob("__init__.py") if "__pycache__" not in p.parts
)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(CHECKOUT)))
def test_every_folder_says_what_it_holds_and_what_it_may_import(folder):
    doc = ast.get_docstring(SOURCES[_name(folder / "__init__.py")][1]) or ""
    said = re.search(r"may import|imports? only", doc, re.IGNORECASE)
    assert said, f"{folder}/__init__.py: say what it may import"


LAYER_FOLDERS = [f for f in FOLDERS if f.parent == CHECKOUT / "ibtool"]


@pytest.mark.parametrize("folder", LAYER_FOLDERS, ids=lambda p: p.name)
def test_every_layer_folder_says_what_it_may_import_as_the_graph_has_it(folder):
    """Its docstring's "May import ...;" names exactly the folders MAY_IMPORT gives it (the
    bottom may be named or not), and "never ..." none of them."""
    doc = ast.get_docstring(SOURCES[_name(folder / "__init__.py")][1]) or ""
    flat = " ".join(doc.split())
    said = re.search(r"May import (.*?)(?:; never (.*?))?\.(?:\s|$)", flat)
    assert said, f"{folder}/__init__.py: say what it may import (May import ...; never ...)"
    layer = _folder(_name(folder / "__init__.py"))
    named = {_folder(m) for m in re.findall(r"ibtool\.\w+", said.group(1))} - {"bottom"}
    assert named == MAY_IMPORT[layer], f"{folder}: says {sorted(named)}"
    never = {_folder(m) for m in re.findall(r"ibtool\.\w+", said.group(2) or "")}
    assert not never & MAY_IMPORT[layer], f"{folder}: never {sorted(never)}"


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

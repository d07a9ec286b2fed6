"""Start-up's machinery (issue 43): the plugins' cache, the parser built for the command run,
and records made on first use. What each costs is bench/bench_startup.py's; what is proven
here is that each says and does what the slow way did."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import sys
import threading

import pytest

from ibtool.cli import build_parser, invoked, main
from ibtool.model import deferred
from ibtool.plugin import found

# -- the plugins' cache ---------------------------------------------------------------------------


def dist(where, name: str, entry_points: dict[str, str]) -> None:
    info = where / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "".join(f"{ep} = {module}\n" for ep, module in entry_points.items())
    (info / "entry_points.txt").write_text(f"[ibtool]\n{lines}")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory of distributions first on sys.path, and a cache directory of this test's."""
    where = tmp_path / "site"
    where.mkdir()
    monkeypatch.syspath_prepend(str(where))
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    return where, environ


def offered(f: found.Found) -> list[tuple[str, str, str, str | None]]:
    return [(o.name, o.value, o.distribution, o.version) for o in f.offered]


def test_the_cache_answers_as_the_scan_does_and_is_used_on_the_next_start(site, monkeypatch):
    where, environ = site
    dist(where, "acme-ibtool", {"acme": "acme_mod:plugin"})
    first = found.find(environ)
    assert ("acme", "acme_mod:plugin", "acme-ibtool", "1.0") in offered(first)
    assert offered(first) == offered(found.scan())
    monkeypatch.setattr(found, "scan", lambda: pytest.fail("scanned although nothing changed"))
    again = found.find(environ)
    assert offered(again) == offered(first) and again.own == first.own


def test_a_new_install_and_an_uninstall_are_noticed(site):
    where, environ = site
    found.find(environ)
    dist(where, "zeta-ibtool", {"zeta": "zeta_mod"})
    assert ("zeta", "zeta_mod", "zeta-ibtool", "1.0") in offered(found.find(environ))
    (where / "zeta_ibtool-1.0.dist-info" / "entry_points.txt").unlink()
    (where / "zeta_ibtool-1.0.dist-info" / "METADATA").unlink()
    (where / "zeta_ibtool-1.0.dist-info").rmdir()
    assert "zeta" not in [o.name for o in found.find(environ).offered]


def test_a_reinstall_of_the_same_version_is_noticed(site):
    where, environ = site
    dist(where, "acme-ibtool", {"acme": "acme_mod"})
    found.find(environ)
    info = where / "acme_ibtool-1.0.dist-info"
    (info / "entry_points.txt").write_text("[ibtool]\nacme = acme_new\n")
    # pip makes the directory anew: the listing is the same, the directory's time is not
    os.utime(where, ns=(1, os.stat(where).st_mtime_ns + 10**9))
    assert ("acme", "acme_new", "acme-ibtool", "1.0") in offered(found.find(environ))


def planted(environ: dict) -> str:
    path = found.cache_path(environ)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    return path


@pytest.mark.parametrize(
    "damage",
    ["garbage", "nested", "too_big", "wrong_shape", "other_key", "group_writable", "a_link"],
)
def test_a_cache_that_is_not_trusted_or_not_sound_is_a_scan(site, damage, tmp_path):
    where, environ = site
    dist(where, "acme-ibtool", {"acme": "acme_mod"})
    truth = offered(found.find(environ))
    path = planted(environ)
    good = json.load(open(path))
    evil = {**good, "plugins": [["evil", "os:system", "evil", "6.6.6"]]}
    if damage == "garbage":
        open(path, "wb").write(b"\x00\xff{not json")
    elif damage == "nested":
        open(path, "w").write("[" * 100000 + "]" * 100000)
    elif damage == "too_big":
        open(path, "w").write(json.dumps(good) + " " * found.CACHE_LIMIT)
    elif damage == "wrong_shape":
        open(path, "w").write(json.dumps({**good, "plugins": [["evil", 1, None, None]]}))
    elif damage == "other_key":
        open(path, "w").write(json.dumps({**evil, "key": [["/elsewhere", None, []]]}))
    elif damage == "group_writable":
        open(path, "w").write(json.dumps(evil))
        os.chmod(path, 0o664)
    elif damage == "a_link":
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps(evil))
        os.unlink(path)
        os.symlink(target, path)
    assert offered(found.find(environ)) == truth


def test_a_cache_in_a_directory_others_may_write_is_neither_read_nor_written(site):
    where, environ = site
    path = planted(environ)
    os.chmod(os.path.dirname(path), 0o777)
    try:
        found.find(environ)
        assert not os.path.exists(path)
    finally:
        os.chmod(os.path.dirname(path), 0o700)


def test_no_home_and_a_read_only_home_still_find_the_plugins(site, tmp_path):
    where, _ = site
    dist(where, "acme-ibtool", {"acme": "acme_mod"})
    assert "acme" in [o.name for o in found.find({}).offered]
    home = tmp_path / "ro"
    home.mkdir()
    os.chmod(home, 0o500)
    try:
        if os.access(home, os.W_OK):
            pytest.skip("root writes anywhere: a read-only home cannot be made here")
        assert "acme" in [o.name for o in found.find({"HOME": str(home)}).offered]
    finally:
        os.chmod(home, 0o700)


def test_the_cache_keeps_a_bounded_number_of_files(tmp_path, monkeypatch):
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    for i in range(found.KEEP + 5):
        monkeypatch.setattr(sys, "path", [str(tmp_path / f"cwd{i}"), *sys.path[1:]])
        found.find(environ)
    assert len(os.listdir(tmp_path / "cache" / "ibtool")) <= found.KEEP


def test_an_entry_point_loads_as_importlib_metadata_loads_it(site):
    where, _ = site
    (where / "pkg_mod.py").write_text("class A:\n    class B:\n        x = 1\n")
    assert found.Offered("p", "pkg_mod:A.B [extra]", "d", None).load().x == 1
    assert found.Offered("p", "pkg_mod", "d", None).load().__name__ == "pkg_mod"
    assert found.Offered("p", " pkg_mod : A ", "d", None).module == "pkg_mod"


# -- the parser built for the command run ---------------------------------------------------------

NAMES = ("port", "link", "gids", "gid", "dev", "counters", "stats", "plugins")


@pytest.mark.parametrize(
    "argv, command",
    [
        (["port"], "port"),
        (["-j", "link", "mlx5_0"], "link"),
        (["--root", "port", "gids"], "gids"),  # --root's value is not the command
        (["--root=/x", "dev"], "dev"),
        (["--ro", "/x", "dev"], "dev"),  # a unique prefix takes a value too
        (["--sn", "f", "dev"], None),  # ambiguous (--snapshot, --snapshot-limit): argparse says
        (["--snapshot-limit", "size=1", "dev"], "dev"),
        (["-h", "port"], None),  # the whole parser's help
        (["--he", "port"], None),
        (["-jh", "port"], None),
        (["nosuch"], None),
        (["--", "port"], None),
        ([], None),
        (["-d"], None),
    ],
)
def test_the_command_word_is_found_where_argparse_finds_it(argv, command):
    assert invoked(argv, NAMES) == command


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdout=out, stderr=err, environ={"IBTOOL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-h"],
        ["port", "--help"],
        ["--root", "/", "gids", "-h"],
        ["-j", "nosuch"],
        ["port", "--no-such-option"],
        ["--bogus", "port"],
        ["--snap", "x", "port"],
        [],
    ],
)
def test_what_the_parser_says_is_what_the_whole_parser_says(argv, monkeypatch):
    ours = run(argv)
    import ibtool.cli as cli

    whole = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda r, o=None, e=None, **kw: whole(r, o, e))
    assert run(argv) == ours


def test_completion_is_written_from_the_whole_parser(monkeypatch):
    code, script, _ = run(["completion", "bash"])
    assert code == 0
    for command in ("counters", "doctor", "exporter", "mesh", "ping", "tui"):
        assert command in script
    assert "--fabric-interval" in script  # an option of a command other than completion


def test_build_parser_holds_the_one_command_with_its_options():
    from ibtool.cli import register_commands
    from ibtool.plugin.commands import CommandRegistry
    from ibtool.plugin.manager import build_plugins

    registry = CommandRegistry()
    register_commands(
        build_plugins(environ={"IBTOOL_DISABLE_PLUGIN_AUTOLOAD": "1"}), registry, print
    )
    only = build_parser(registry, only="stats")
    assert set(only.subcommands.choices) == {"counters", "stats"}
    assert only.parse_args(["stats", "--errors"]).errors is True


# -- records made on first use --------------------------------------------------------------------


@deferred.dataclass(frozen=True)
class Base:
    x: int
    y: str = "a"


@deferred.dataclass(frozen=True)
class Child(Base):
    z: list = dataclasses.field(default_factory=list)


class Plain(Child):
    pass


@dataclasses.dataclass(frozen=True)
class Std:
    x: int
    y: str = "a"


@deferred.dataclass
class Mutable:
    v: int


def test_a_deferred_record_is_what_the_standard_decorator_makes():
    assert dataclasses.is_dataclass(Base)
    assert [f.name for f in dataclasses.fields(Child)] == ["x", "y", "z"]
    c = Plain(1, "b", [2])
    assert repr(c) == "Plain(x=1, y='b', z=[2])"
    assert c == Plain(1, "b", [2]) and hash(Base(1)) == hash(Base(1))
    assert dataclasses.replace(c, x=3).x == 3 and dataclasses.asdict(Child(1)) == {
        "x": 1,
        "y": "a",
        "z": [],
    }
    assert pickle.loads(pickle.dumps(Child(5))) == Child(5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Base(1).x = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        Base(1).other = 2  # not a field: frozen all the same
    assert Base.__doc__.replace("Base", "Std") == Std.__doc__
    with pytest.raises(TypeError):
        Base()  # its __init__'s own error


def test_a_deferred_record_is_made_once_even_when_threads_make_the_first_together():
    @deferred.dataclass(frozen=True)
    class Raced:
        a: int
        b: int = 2

    barrier = threading.Barrier(8)
    made, failed = [], []

    def first():
        barrier.wait()
        try:
            made.append(Raced(1))
        except Exception as e:  # a moment without __init__ would be a TypeError here
            failed.append(e)

    threads = [threading.Thread(target=first) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failed == [] and made == [Raced(1)] * 8
    assert "__eq__" in Raced.__dict__


def test_a_record_is_not_made_until_it_is_used():
    @deferred.dataclass
    class Unused:
        v: int

    assert "__eq__" not in Unused.__dict__ and "__repr__" not in Unused.__dict__
    assert Mutable(1) == Mutable(1)
    assert "__eq__" in Mutable.__dict__


def test_a_write_killed_half_way_leaves_nothing_for_long(site):
    where, environ = site
    path = planted(environ)
    stale, fresh = f"{path}.4242", f"{path}.4343"
    for name in (stale, fresh):
        open(name, "w").write("{")
    os.utime(stale, (0, 0))
    dist(where, "acme-ibtool", {"acme": "acme_mod"})  # a new install: the cache is written
    found.find(environ)
    assert not os.path.exists(stale)  # a minute old: a write killed half way
    assert os.path.exists(fresh)  # perhaps another start writing now
    assert os.path.exists(path)

"""ibtool's ctypes view of rdma-core's MAD libraries against the C headers themselves: every
structure's size and every field's offset, and every field number of enum MAD_FIELDS it uses,
compiled from the headers installed (libibmad-dev, libibnetdisc-dev, libibumad-dev), so each
release the suite runs on (rdma-core 33 on Debian 11 to sid's) checks its own."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest

from ibtool.sources import mad

HEADERS = ("infiniband/mad.h", "infiniband/ibnetdisc.h", "infiniband/umad.h")


def _compiled(tmp_path) -> dict[str, int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    have = cc and all(os.path.exists(f"/usr/include/{h}") for h in HEADERS)
    if not have:
        why = "no C compiler or rdma-core's MAD headers (libibmad-dev, libibnetdisc-dev)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    lines = [f"#include <{h}>" for h in HEADERS]
    lines += ["#include <stdio.h>", "#include <stddef.h>", "int main(void) {"]
    for cname, ctype in {**mad.structs(), **mad.PARTIAL}.items():
        if cname in mad.structs():
            lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for name, *_ in ctype._fields_:
            lines.append(f'printf("{cname}.{name} %zu\\n", offsetof({cname}, {name}));')
    for name in mad.FIELDS:
        lines.append(f'printf("{name} %d\\n", (int){name});')
    lines += ["return 0;", "}"]
    (tmp_path / "abi.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-o", str(tmp_path / "abi"), str(tmp_path / "abi.c")], check=True)
    out = subprocess.run([str(tmp_path / "abi")], capture_output=True, text=True, check=True)
    return {k: int(v) for k, v in (line.split() for line in out.stdout.splitlines())}


def _ours() -> dict[str, int]:
    found = {}
    for cname, ctype in {**mad.structs(), **mad.PARTIAL}.items():
        if cname in mad.structs():
            found[cname] = ctypes.sizeof(ctype)
        for name, *_ in ctype._fields_:
            found[f"{cname}.{name}"] = getattr(ctype, name).offset
    return {**found, **mad.FIELDS}


def test_the_structures_and_field_numbers_are_the_headers(tmp_path):
    assert _ours() == _compiled(tmp_path)


def test_a_layout_that_differs_is_seen(tmp_path, monkeypatch):
    theirs = _compiled(tmp_path)
    monkeypatch.setitem(mad.FIELDS, "IB_NODE_GUID_F", mad.FIELDS["IB_NODE_GUID_F"] + 1)
    assert _ours() != theirs


def test_the_node_layout_is_the_libraries_release(tmp_path):
    """rdma-core 43 gave ibnd_node_t's description its NUL (one byte, eight with padding):
    the release is read from the loaded file's name, and its layout picked."""
    maps = tmp_path / "maps"
    lib = "/usr/lib/x86_64-linux-gnu/libibnetdisc.so.5"
    for release, size in ((33, 408), (42, 408), (43, 416), (65, 416)):
        maps.write_text(f"7f00-7f01 r-xp 0 08:01 1 {lib}.0.{release}.2\n")
        version = mad.rdma_core_version("libibnetdisc.so.5", str(maps))
        assert version == release
        assert ctypes.sizeof(mad.node_struct(version)) == size
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib64/libibnetdisc.so.5\n")
    assert mad.rdma_core_version("libibnetdisc.so.5", str(maps)) is None
    assert ctypes.sizeof(mad.node_struct(None)) == 416

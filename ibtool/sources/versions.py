"""What runs beneath ibtool, for `ibtool --version`: Python, pyverbs, the rdma-core it belongs
to, and the kernel. Read from files, never by importing pyverbs: loading libibverbs is what
`--version` must not cost (and must not need: a broken pyverbs is one of the things an operator
asks `--version` about).

- pyverbs' own version: rdma-core writes pyverbs/__version__.py ("__version__ = "65.0"") in its
  newer releases; older ones (33, 44) ship none, and then rdma-core's version is the answer.
- rdma-core's version: libibverbs is installed as libibverbs.so.1.<ABI>.<rdma-core version>
  (rdma-core libibverbs/CMakeLists.txt: `rdma_library(ibverbs ... 1 1.14.${PACKAGE_VERSION})`,
  the ABI minor moving with the library's symbols), so the file name says which rdma-core the
  system's libibverbs, the one pyverbs links to, comes from.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import sys
import sysconfig
from importlib.util import find_spec

_LIBIBVERBS = re.compile(r"libibverbs\.so\.1\.\d+\.(\d+\.\d+)$")


def library_dirs() -> list[str]:
    """Where the dynamic loader looks for libibverbs, in its usual order; Python's own LIBDIR
    (Debian: /usr/lib/x86_64-linux-gnu, RHEL: /usr/lib64) first."""
    dirs = [sysconfig.get_config_var("LIBDIR") or ""]
    arch = sysconfig.get_config_var("MULTIARCH")
    if arch:
        dirs += [f"/usr/lib/{arch}", f"/lib/{arch}"]
    dirs += ["/usr/lib64", "/lib64", "/usr/lib", "/lib", "/usr/local/lib"]
    seen: list[str] = []
    for d in dirs:
        if d and d not in seen:
            seen.append(d)
    return seen


def rdma_core() -> tuple[str, str] | None:
    """(rdma-core's version, the libibverbs file it was read from), or None without one."""
    for d in library_dirs():
        for path in sorted(glob.glob(os.path.join(glob.escape(d), "libibverbs.so.1.*"))):
            m = _LIBIBVERBS.search(os.path.basename(path))
            if m:
                return m.group(1), path
    return None


def pyverbs() -> tuple[str | None, str] | None:
    """(pyverbs' own version or None, where it is), or None when this Python has no pyverbs."""
    try:
        spec = find_spec("pyverbs")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    where = list(spec.submodule_search_locations)[0]
    try:
        with open(os.path.join(where, "__version__.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read(4096))
    except (OSError, SyntaxError, ValueError):
        return None, where
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and node.value.value.isprintable()
        ):
            return node.value.value[:32], where
    return None, where


# Where distributions install python3-pyverbs: Debian and Ubuntu for their python3 alone
# (dist-packages, version-neutral), Fedora and RHEL per interpreter (lib64 for the extension).
DISTRIBUTION_SITES = (
    "/usr/lib/python3/dist-packages",
    "/usr/lib64/python3.*/site-packages",
    "/usr/lib/python3.*/site-packages",
)


def _venv_includes_system_site() -> bool | None:
    """The venv's include-system-site-packages (venv's pyvenv.cfg), None outside a venv or
    where the file cannot say."""
    if sys.prefix == sys.base_prefix:
        return None
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg"), encoding="utf-8") as f:
            text = f.read(65536)
    except (OSError, UnicodeDecodeError):
        return None
    m = re.search(r"^\s*include-system-site-packages\s*=\s*(\w+)", text, re.MULTILINE)
    return None if m is None else m.group(1).lower() == "true"


def _installed_elsewhere() -> str | None:
    """A distribution's pyverbs that this Python does not see, by where it lies."""
    for pattern in DISTRIBUTION_SITES:
        for site in sorted(glob.glob(pattern)):
            if os.path.isdir(os.path.join(site, "pyverbs")) and site not in sys.path:
                return site
    return None


def why_no_pyverbs() -> str | None:
    """Why this Python has no pyverbs, as the fix: python3-pyverbs is built for the
    distribution's own python3, so a venv sees it only when made from that interpreter with
    --system-site-packages. None when nothing points further than "install it"."""
    system_site = _venv_includes_system_site()
    elsewhere = _installed_elsewhere()
    if system_site is False:
        return (
            f"this venv ({sys.prefix}) was made without --system-site-packages: make it again "
            "with the distribution's python3 -m venv --system-site-packages"
        )
    if elsewhere is not None:
        base = "this venv's base Python" if system_site else "this Python"
        return (
            f"{base}, {sys.version.split()[0]} in {sys.base_prefix}, is not the distribution's "
            f"python3, whose pyverbs is in {elsewhere}: run ibtool with that python3, or in a "
            "venv made from it with --system-site-packages"
        )
    if system_site and sys.base_prefix != "/usr":
        return (
            f"this venv's base Python, {sys.version.split()[0]} in {sys.base_prefix}, is not "
            "the distribution's (/usr), which python3-pyverbs is built for: install that, and "
            "make the venv from /usr/bin/python3"
        )
    return None


def report(ibtool_version: str) -> list[str]:
    """The lines `ibtool --version` prints: ibtool's first (`ibtool X`, as before)."""
    lines = [f"ibtool {ibtool_version}", f"Python {sys.version.split()[0]} ({sys.executable})"]
    verbs = pyverbs()
    core = rdma_core()
    if verbs is None:
        why = why_no_pyverbs() or "in a venv: --system-site-packages"
        lines.append(
            "pyverbs not found: the data path (loopback, ping, doctor, mesh) needs the "
            f"distribution's python3-pyverbs ({why})"
        )
    else:
        version, where = verbs
        lines.append(f"pyverbs {version} ({where})" if version else f"pyverbs ({where})")
    if core is None:
        lines.append("rdma-core not found: no libibverbs.so.1 (install rdma-core, libibverbs1)")
    else:
        lines.append(f"rdma-core {core[0]} ({os.path.basename(core[1])})")
    lines.append(f"kernel {os.uname().release}")
    return lines

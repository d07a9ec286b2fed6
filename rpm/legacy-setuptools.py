#!/usr/bin/python3
"""For EL9's python3-setuptools 53 (%prep of rpm/ibtool.spec, `%if %{with legacy_setuptools}`).

setuptools 53 reads no [project] table (PEP 621 came in 61) and no SPDX `license` string (PEP
639, 77), and EL9 has no setuptools-scm 8 (its 6.0 knows no `version_file`). So this writes the
same metadata as setup.cfg, which setuptools 53 reads, from pyproject.toml itself (nothing is
copied by hand, so nothing drifts), with the version given (the sdist's: it has no .git), and
ibtool/_version.py with it; then it leaves pyproject.toml with only a [build-system] of
setuptools>=53 and wheel, and the tool tables that are not setuptools' or setuptools-scm's.

Usage: legacy-setuptools.py VERSION   (in the unpacked source tree)
"""

import re
import sys
from pathlib import Path

try:  # Python 3.11
    import tomllib as toml_reader
except ImportError:
    try:  # EL9: python3-tomli (CRB/EPEL)
        import tomli as toml_reader
    except ImportError:  # EL9: python3-toml (AppStream, setuptools_scm 6's own)
        toml_reader = None
        import toml


def load(path: Path) -> dict:
    if toml_reader is not None:
        with path.open("rb") as f:
            return toml_reader.load(f)
    return toml.loads(path.read_text(encoding="utf-8"))


def listing(key: str, values) -> list:
    return [f"{key} ="] + [f"    {v}" for v in values]


def setup_cfg(project: dict, tool: dict, version: str) -> str:
    license = project.get("license")
    if isinstance(license, dict):
        license = license.get("text", "")
    lines = [
        "# Written by rpm/legacy-setuptools.py from pyproject.toml for setuptools 53 (EL9)",
        "[metadata]",
        f"name = {project['name']}",
        f"version = {version}",
        f"description = {project['description']}",
        f"license = {license}",
    ]
    if "readme" in project:
        lines += [
            f"long_description = file: {project['readme']}",
            "long_description_content_type = text/markdown",
        ]
    lines += ["", "[options]", f"python_requires = {project['requires-python']}"]
    lines += listing("install_requires", project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    if extras:
        lines += ["", "[options.extras_require]"]
        for name, reqs in extras.items():
            lines += listing(name, reqs)
    scripts = project.get("scripts", {})
    if scripts:
        lines += ["", "[options.entry_points]"]
        lines += listing("console_scripts", [f"{k} = {v}" for k, v in scripts.items()])
    package_data = tool.get("setuptools", {}).get("package-data", {})
    if package_data:
        lines += ["", "[options.package_data]"]
        for pkg, globs in package_data.items():
            lines.append(f"{pkg} = {', '.join(globs)}")
    return "\n".join(lines) + "\n"


def strip_tables(text: str) -> str:
    """pyproject.toml without [project*], [tool.setuptools*] (setuptools-scm's included), and
    with [build-system] for setuptools 53; other tables (pytest's, ruff's) kept as they are."""
    out, keep = [], True
    for line in text.splitlines():
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$", line)
        if header:
            name = header.group(1).strip('"')
            keep = not (
                name == "project"
                or name.startswith("project.")
                or name.startswith("tool.setuptools")
                or name == "build-system"
            )
            if name == "build-system":
                out += [
                    "[build-system]",
                    'requires = ["setuptools>=53", "wheel"]',
                    'build-backend = "setuptools.build_meta"',
                    "",
                ]
            if keep:
                out.append(line)
            continue
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    version = sys.argv[1]
    pyproject = Path("pyproject.toml")
    data = load(pyproject)
    project, tool = data["project"], data.get("tool", {})
    Path("setup.cfg").write_text(setup_cfg(project, tool, version), encoding="utf-8")
    version_file = tool.get("setuptools_scm", {}).get("version_file")
    if version_file:
        Path(version_file).write_text(
            "# Written by rpm/legacy-setuptools.py (EL9: no setuptools-scm 8).\n"
            f'__version__ = "{version}"\n',
            encoding="utf-8",
        )
    pyproject.write_text(strip_tables(pyproject.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

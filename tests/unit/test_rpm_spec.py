"""rpm/ibtool.spec stays in step with the project, read as text (no rpm needed): every man page
and unit is installed, the Requires cover pyproject.toml's dependencies with their floors and
their Python-version bounds, the License is pyproject's; rpm/legacy-setuptools.py (EL9's %prep)
turns the current pyproject.toml into a setup.cfg with the same metadata; and, where rpmlint is
installed, `rpm/check.sh --lint-only` passes (rpm/check.sh itself builds the RPMs: make rpm).
"""

from __future__ import annotations

import configparser
import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "rpm" / "ibtool.spec"
LEGACY = REPO / "rpm" / "legacy-setuptools.py"
PYPROJECT = REPO / "pyproject.toml"
# the macros of the paths %files uses, as Fedora defines them
MACROS = {
    "_bindir": "/usr/bin",
    "_mandir": "/usr/share/man",
    "_unitdir": "/usr/lib/systemd/system",
    "_sysconfdir": "/etc",
    "_datadir": "/usr/share",
    "bash_completions_dir": "/usr/share/bash-completion/completions",
    "zsh_completions_dir": "/usr/share/zsh/site-functions",
}


def spec_text() -> str:
    return SPEC.read_text(encoding="utf-8")


def expand(text: str) -> str:
    return re.sub(r"%\{(\w+)\}", lambda m: MACROS.get(m.group(1), m.group(0)), text)


def section(name: str) -> list[str]:
    """The lines of one section (%files, %install, ...) up to the next one."""
    out, inside = [], False
    for line in spec_text().splitlines():
        if re.match(
            r"^%(prep|generate_buildrequires|build|install|check|post|preun|postun|"
            r"files|changelog|description|package)\b",
            line,
        ):
            inside = line.split()[0] == name
            continue
        if inside:
            out.append(line)
    assert out, f"no {name} section"
    return out


def files() -> list[str]:
    """%files' paths, expanded, without %doc/%config() attributes."""
    paths = []
    for line in section("%files"):
        line = re.sub(r"^%(config\([^)]*\)|doc|license|dir)\s+", "", line.strip())
        if line.startswith("/") or line.startswith("%{"):
            paths.append(expand(line))
    return paths


def packaged(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in files())


def preamble_requires() -> list[tuple[str, str, str, str, tuple[str, ...]]]:
    """(tag, name, op, version, enclosing %if conditions) of the preamble's dependencies."""
    preamble = spec_text().split("\n%description", 1)[0]
    stack: list[str] = []
    out = []
    for line in preamble.splitlines():
        if line.startswith("%if"):
            stack.append(line[3:].strip())
        elif line.startswith("%else"):
            stack[-1] = f"!({stack[-1]})"
        elif line.startswith("%endif"):
            stack.pop()
        m = re.match(
            r"^(Requires|Recommends|Suggests):\s*python3dist\(([^)]+)\)\s*(\S+)?\s*(\S+)?", line
        )
        if m:
            out.append((m.group(1), m.group(2), m.group(3) or "", m.group(4) or "", tuple(stack)))
    assert not stack, "unbalanced %if in the preamble"
    return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject() -> dict:
    with PYPROJECT.open("rb") as f:
        return tomllib.load(f)


def dependencies() -> list[tuple[str, list[tuple[str, str]], str]]:
    """(name, [(op, version)], marker) of pyproject.toml's runtime dependencies."""
    out = []
    for dep in pyproject()["project"]["dependencies"]:
        req, _, marker = dep.partition(";")
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(.*)", req)
        specs = re.findall(r"(>=|<=|==|!=|~=|<|>)\s*([^,\s]+)", m.group(2))
        out.append((normalize(m.group(1)), specs, marker.strip()))
    return out


def test_spec_parses_and_sections_exist():
    text = spec_text()
    for tag in ("Name:", "Version:", "Release:", "License:", "BuildArch:"):
        assert re.search(rf"^{tag}", text, re.M), tag
    assert re.search(r"^BuildArch:\s+noarch$", text, re.M)
    for macro in (
        "%pyproject_buildrequires",
        "%pyproject_wheel",
        "%pyproject_install",
        "%pyproject_save_files",
        "%pyproject_check_import",
        "%{?systemd_requires}",
    ):
        assert macro in text, macro
    assert "SETUPTOOLS_SCM_PRETEND_VERSION=%{upstream_version}" in "\n".join(section("%build"))


def test_every_man_page_is_in_files():
    pages = sorted(p.name for p in (REPO / "man").glob("*.8"))
    assert pages, "no man/*.8"
    missing = [p for p in pages if not packaged(f"/usr/share/man/man8/{p}.gz")]
    assert not missing, f"man pages not in %files: {missing}"


def test_completions_are_in_files():
    assert (REPO / "completion").is_dir() or pytest.skip("completion/ not there yet")
    assert packaged("/usr/share/bash-completion/completions/ibtool")
    assert packaged("/usr/share/zsh/site-functions/_ibtool")
    install = "\n".join(section("%install"))
    assert "completions/ibtool.bash" in install  # setup.py's data_files name, renamed


def unit_files() -> list[Path]:
    units = sorted(p for p in (REPO / "systemd").glob("*") if p.suffix in (".service", ".timer"))
    if not units:
        pytest.skip("systemd/ not there yet")
    return units


def test_every_unit_is_installed_and_in_scriptlets():
    install = "\n".join(section("%install"))
    for unit in unit_files():
        assert re.search(
            rf"install -Dpm 0644 systemd/{re.escape(unit.name)} "
            rf"%{{buildroot}}%{{_unitdir}}/{re.escape(unit.name)}\b",
            install,
        ), unit
        assert packaged(f"/usr/lib/systemd/system/{unit.name}"), f"{unit.name} not in %files"
        for scriptlet in ("%post", "%preun", "%postun"):
            assert unit.name in "\n".join(section(scriptlet)), f"{unit.name} not in {scriptlet}"


def test_defaults_file_is_config_where_the_unit_reads_it():
    default = REPO / "systemd" / "ibtool-exporter.default"
    if not default.exists():
        pytest.skip("systemd/ not there yet")
    exporter = (REPO / "systemd" / "ibtool-exporter.service").read_text(encoding="utf-8")
    m = re.search(r"^EnvironmentFile=-?(\S+)$", exporter, re.M)
    assert m, "the exporter unit reads no EnvironmentFile"
    path = m.group(1)
    assert re.search(
        rf"^%config\(noreplace\) {re.escape('%{_sysconfdir}')}"
        rf"{re.escape(path.removeprefix('/etc'))}$",
        "\n".join(section("%files")),
        re.M,
    ), f"%config(noreplace) {path}"
    assert (
        f"systemd/ibtool-exporter.default %{{buildroot}}%{{_sysconfdir}}"
        f"{path.removeprefix('/etc')}" in "\n".join(section("%install"))
    )


def test_license_is_pyproject_license():
    license = pyproject()["project"]["license"]
    if isinstance(license, dict):
        license = license.get("text")
    m = re.search(r"^License:\s+(.+?)\s*$", spec_text(), re.M)
    assert m and m.group(1) == license


def python_condition(marker: str) -> str | None:
    """pyproject's `python_version < 'A.B'` as the spec's %if on python3_version_nodots."""
    if not marker:
        return None
    m = re.fullmatch(r"python_version\s*<\s*['\"](\d+)\.(\d+)['\"]", marker)
    assert m, f"a marker this test does not know: {marker!r}"
    return f"0%{{?python3_version_nodots}} < {m.group(1)}{m.group(2)}"


def test_requires_cover_pyproject_dependencies():
    requires = preamble_requires()
    for name, specs, marker in dependencies():
        wanted = python_condition(marker)
        found = [r for r in requires if r[0] == "Requires" and normalize(r[1]) == name]
        assert found, f"{name}: no Requires: python3dist({name})"
        if wanted:
            found = [r for r in found if wanted in r[4]]
            assert found, f"{name}: no Requires under %if {wanted}"
        for op, version in specs or [("", "")]:
            assert any(r[2] == op and r[3] == version for r in found), (
                f"{name}: no Requires python3dist({name}) {op} {version}".rstrip()
            )


def test_textual_is_only_recommended_without_textual():
    # `--without textual` (EL9: no python3-textual): Recommends the same floor
    requires = preamble_requires()
    floors = {(op, v) for n, specs, _ in dependencies() if n == "textual" for op, v in specs}
    rec = [r for r in requires if r[0] == "Recommends" and r[1] == "textual"]
    assert rec and all(r[4] == ("!(%{with textual})",) for r in rec)
    assert {(r[2], r[3]) for r in rec} == floors
    prep = "\n".join(section("%prep"))
    assert '/^ *"textual>=/d' in prep
    text = PYPROJECT.read_text(encoding="utf-8")
    # the sed removes exactly the runtime textual line, not the test extra's pin
    assert len(re.findall(r'^ *"textual>=', text, re.M)) == 1


def test_legacy_setuptools_translation(tmp_path):
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "ibtool").mkdir()
    proc = subprocess.run(
        [sys.executable, str(LEGACY), "1.2.3.dev4"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(tmp_path / "setup.cfg")
    project = pyproject()["project"]
    assert cfg["metadata"]["name"] == project["name"]
    assert cfg["metadata"]["version"] == "1.2.3.dev4"
    assert cfg["metadata"]["license"] == project["license"]
    assert cfg["options"]["python_requires"] == project["requires-python"]
    install_requires = [x for x in cfg["options"]["install_requires"].splitlines() if x]
    assert install_requires == project["dependencies"]
    for extra, reqs in project["optional-dependencies"].items():
        assert [x for x in cfg["options.extras_require"][extra].splitlines() if x] == reqs
    assert "ibtool = ibtool.cli:main" in cfg["options.entry_points"]["console_scripts"]
    assert '__version__ = "1.2.3.dev4"' in (tmp_path / "ibtool" / "_version.py").read_text()
    left = tomllib.loads((tmp_path / "pyproject.toml").read_text(encoding="utf-8"))
    assert "project" not in left
    assert "setuptools" not in left.get("tool", {})
    assert "setuptools_scm" not in left.get("tool", {})
    assert left["build-system"]["requires"] == ["setuptools>=53", "wheel"]
    assert left["tool"]["pytest"] == pyproject()["tool"]["pytest"]  # the rest kept


def test_check_script_syntax():
    subprocess.run(["bash", "-n", str(REPO / "rpm" / "check.sh")], check=True)


@pytest.mark.skipif(shutil.which("rpmlint") is None, reason="rpmlint not installed (apt: rpmlint)")
def test_rpmlint_clean_of_errors():
    proc = subprocess.run(
        ["bash", str(REPO / "rpm" / "check.sh"), "--lint-only"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 errors" in proc.stdout

#!/usr/bin/env bash
# Checks rpm/ibtool.spec as far as a Debian host can (make rpm):
#   1. rpmlint on the spec: fails on any error (warnings are listed, and justified in the spec).
#   2. with rpmbuild: the sdist (the one given, or `python3 -m build --sdist` of this checkout,
#      in a temporary venv), the spec expanded by rpmspec -P, and a binary RPM built by
#      rpmbuild -bb with rpm/standin.macros in place of Fedora's python/pyproject/systemd
#      macros, which Debian has not: its payload is listed (rpm -qlp) and checked against
#      man/*.8, systemd/ and the completions, its dependencies printed, and rpmlint run on it.
#      The payload is unpacked and debian/tests/smoke runs on it (the captured sysfs trees),
#      with ibtool's runtime dependencies from PyPI in the venv.
#   3. the EL9 path of the spec: the same build with --define "rhel 9" --without textual, the
#      wheel built by setuptools 53.0.0 (RHEL 9's python3-setuptools) without build isolation
#      after %prep's rpm/legacy-setuptools.py: the wheel's metadata must keep ibtool's version,
#      console script and every dependency but textual.
# What this cannot prove: a build in a real Fedora/EL9 buildroot (mock, the real macros, the
# generated BuildRequires, Python 3.9, EPEL), nor that the package installs there.
#
# Usage: rpm/check.sh [--lint-only] [SDIST]
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
spec=rpm/ibtool.spec
lint_only=0
if [ "${1:-}" = "--lint-only" ]; then lint_only=1; shift; fi
sdist=${1:-}

fail() { echo "rpm check: FAILED: $*" >&2; exit 1; }

# rpmlint exits non-zero on errors only; warnings are printed.
lint() {
    local out rc=0
    out=$(rpmlint -c rpm/rpmlint.toml "$@" 2>&1) || rc=$?
    echo "$out"
    [ "$rc" -eq 0 ] || fail "rpmlint $*: exit $rc"
    ! grep -q ' E: ' <<<"$out" || fail "rpmlint $*: errors"
}

if command -v rpmlint >/dev/null; then
    echo "== rpmlint $spec"
    lint "$spec"
else
    echo "rpm check: SKIPPED rpmlint: not installed (Debian: apt-get install rpmlint)"
fi
[ "$lint_only" -eq 1 ] && exit 0

if ! command -v rpmbuild >/dev/null || ! command -v rpmspec >/dev/null; then
    echo "rpm check: SKIPPED rpmspec/rpmbuild: not installed (Debian: apt-get install rpm)"
    exit 0
fi

tmp=$(mktemp -d)
[ -n "${RPM_CHECK_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
echo "work directory: $tmp"
python3 -m venv "$tmp/venv"
py=$tmp/venv/bin/python
"$py" -m pip install -q --disable-pip-version-check build

if [ -z "$sdist" ]; then
    echo "== sdist: python3 -m build --sdist"
    "$py" -m build --sdist --outdir "$tmp/dist" . >"$tmp/sdist.log" 2>&1 \
        || { cat "$tmp/sdist.log"; fail "python3 -m build --sdist"; }
    sdist=$(ls "$tmp"/dist/ibtool-*.tar.gz)
fi
[ -f "$sdist" ] || fail "no sdist at $sdist"
base=$(basename "$sdist" .tar.gz)
version=${base#ibtool-}
echo "sdist: $sdist (version $version)"
for f in systemd/ibtool-exporter.service systemd/ibtool-health.service \
    systemd/ibtool-health.timer systemd/ibtool-exporter.default \
    completion/ibtool.bash completion/_ibtool; do
    tar -tzf "$sdist" "$base/$f" >/dev/null 2>&1 || fail "$f is not in the sdist (not in git?)"
done

top=$tmp/rpmbuild
mkdir -p "$top/SOURCES"
cp "$sdist" rpm/legacy-setuptools.py "$top/SOURCES/"
common=(--load "$here/rpm/standin.macros" --define "_topdir $top"
    --define "upstream_version $version")

echo "== rpmspec -P (stand-in macros)"
rpmspec -P "${common[@]}" --define "python3 $py" "$spec" >"$tmp/expanded.spec"
if grep -nE '%(pyproject|systemd|python3|_unitdir|bash_completions|zsh_completions)' \
    "$tmp/expanded.spec"; then
    fail "macros left unexpanded"
fi

# build NAME PYTHON ARGS...: one binary RPM into $top/RPMS/NAME
build() {
    local name=$1 python=$2
    shift 2
    rm -rf "${top:?}/BUILD" "${top:?}/BUILDROOT" "${top:?}/RPMS"
    if ! rpmbuild -bb --nodeps "${common[@]}" --define "python3 $python" "$@" "$spec" \
        >"$tmp/$name.log" 2>&1; then
        tail -40 "$tmp/$name.log"
        fail "rpmbuild ($name)"
    fi
    mkdir -p "$tmp/rpms/$name"
    find "$top/RPMS" -name '*.rpm' -exec mv {} "$tmp/rpms/$name/" \;
    ls "$tmp/rpms/$name"/*.rpm
}

# payload RPM: what %files must hold, from the tree the spec was written for
payload() {
    local rpm=$1 list f
    list=$(rpm -qlp "$rpm")
    for f in /usr/bin/ibtool \
        /usr/lib/systemd/system/ibtool-exporter.service \
        /usr/lib/systemd/system/ibtool-health.service \
        /usr/lib/systemd/system/ibtool-health.timer \
        /etc/default/ibtool-exporter \
        /usr/share/bash-completion/completions/ibtool \
        /usr/share/zsh/site-functions/_ibtool; do
        grep -qxF "$f" <<<"$list" || fail "$f not in $rpm"
    done
    for f in man/*.8; do
        grep -qE "^/usr/share/man/man8/$(basename "$f")(\.gz)?$" <<<"$list" \
            || fail "$f not in $rpm"
    done
    grep -qE '/site-packages/ibtool/cli\.py$' <<<"$list" || fail "ibtool/cli.py not in $rpm"
    grep -qE '/site-packages/ibtool_plugins/' <<<"$list" || fail "ibtool_plugins not in $rpm"
    rpm -qp --configfiles "$rpm" | grep -qxF /etc/default/ibtool-exporter \
        || fail "/etc/default/ibtool-exporter is not %config in $rpm"
}

# smoke RPM: its payload unpacked (rpm2cpio) runs debian/tests/smoke on the captured sysfs
# trees, with ibtool's runtime dependencies from PyPI in the venv (not Fedora's packages): the
# packaged modules, package data, entry point and plugins work together
smoke() {
    local rpm=$1 dir site where
    dir=$tmp/payload-$(basename "$(dirname "$rpm")")
    mkdir -p "$dir"
    (cd "$dir" && rpm2cpio "$rpm" | cpio -idm --quiet)
    site=$(echo "$dir"/usr/lib/python3.*/site-packages)
    # from a directory without the checkout's ibtool/ (python -m puts the current one first),
    # with the captured trees at the relative path the smoke uses
    rm -rf "$tmp/smoke" && mkdir -p "$tmp/smoke" && ln -s "$here/tests" "$tmp/smoke/tests"
    (
        cd "$tmp/smoke"
        where=$(PYTHONPATH=$site "$py" -c 'import ibtool; print(ibtool.__file__)')
        [ "$where" = "$site/ibtool/__init__.py" ] || fail "ibtool imported from $where"
        for f in ibtool/tui/app.tcss ibtool/data/ibtool.nhc; do
            [ -f "$site/$f" ] || fail "$f (package data) not in $rpm"
        done
        sh "$here/debian/tests/smoke" "$py" "$site" || fail "smoke on the payload of $rpm"
        # /usr/bin/ibtool as packaged (run by the venv's python, not its #!/usr/bin/python3)
        PYTHONPATH=$site "$py" "$dir/usr/bin/ibtool" --version | tee "$tmp/version.txt"
        grep -qF "ibtool $version" "$tmp/version.txt" || fail "packaged --version is not $version"
    )
}

echo "== rpmbuild -bb (stand-in macros; Fedora's path: pyproject.toml as it is)"
build fedora "$py"
rpm=$(ls "$tmp"/rpms/fedora/*.rpm)
rpm -qlp "$rpm" | grep -v '/site-packages/ibtool\(_plugins\)\?/'
echo "   ... and $(rpm -qlp "$rpm" | grep -c '/site-packages/ibtool') files under site-packages"
echo "-- requires/recommends/suggests"
rpm -qp --requires "$rpm" | grep -v '^rpmlib('
rpm -qp --recommends --suggests "$rpm"
payload "$rpm"
rpm -qp --requires "$rpm" | grep -qF 'python3dist(textual) >= 8' || fail "textual not required"
if command -v rpmlint >/dev/null; then
    echo "== rpmlint $(basename "$rpm")"
    lint "$rpm"
fi

echo "== the Fedora RPM's payload runs: debian/tests/smoke on the captured sysfs trees"
"$py" -m pip install -q --disable-pip-version-check pluggy pyroute2 prometheus_client textual
smoke "$rpm"

echo "== rpmbuild -bb --define 'rhel 9' --without textual: setuptools 53.0.0, no build isolation"
python3 -m venv "$tmp/venv53"
"$tmp/venv53/bin/pip" install -q --disable-pip-version-check "setuptools==53.0.0" "wheel<0.41"
# python3_version_nodots 39: the Requires of EL9's Python 3.9 (the stand-in's own
# interpreter builds the wheel)
build el9 "$tmp/venv53/bin/python" --define "rhel 9" --without textual \
    --define "standin_wheel_args --no-build-isolation" --define "python3_version_nodots 39"
grep -q 'legacy-setuptools.py' "$tmp/el9.log" || fail "the EL9 %prep did not run"
rpm=$(ls "$tmp"/rpms/el9/*.rpm)
payload "$rpm"
echo "-- requires/recommends"
rpm -qp --requires --recommends "$rpm" | grep -E 'python3dist|pyverbs|rdma|ibverbs'
for r in 'python3dist(pluggy) < 1.7' 'python3dist(tomli) >= 1.1' 'python3dist(pyroute2) >= 0.7'; do
    rpm -qp --requires "$rpm" | grep -qxF "$r" || fail "EL9 RPM: no Requires $r"
done
if command -v rpmlint >/dev/null; then
    echo "== rpmlint $(basename "$rpm") (EL9 path)"
    lint "$rpm"
fi
rpm -qp --requires "$rpm" | grep -qF 'python3dist(textual)' && fail "textual required (--without textual)"
rpm -qp --recommends "$rpm" | grep -qF 'python3dist(textual) >= 8' || fail "textual not recommended"
echo "== the EL9 RPM's payload runs: debian/tests/smoke"
smoke "$rpm"
# the wheel setuptools 53 made: ibtool's metadata, textual left out
whl=$(ls "$top"/BUILD/standin-pyproject-wheeldir/*.whl)
"$py" - "$whl" "$version" <<'EOF'
import re, sys, zipfile
whl, version = sys.argv[1:]
z = zipfile.ZipFile(whl)
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
text = z.read(meta).decode()
eps = z.read(meta.replace("METADATA", "entry_points.txt")).decode()
print(f"{whl.rsplit('/', 1)[-1]}: {meta}")
assert re.search(rf"^Version: {re.escape(version)}$", text, re.M), "version"
assert "ibtool = ibtool.cli:main" in eps, "console script"
# the runtime ones: not an extra's (textual==8.2.8 is the test extra's pin)
reqs = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)(?![^\n]*extra ==)", text, re.M)
print("  Requires-Dist (no extra):", sorted(set(reqs)))
for name in ("pluggy", "pyroute2", "prometheus-client", "tomli"):
    assert any(r.lower().replace("_", "-") == name.lower() for r in reqs), name
assert not any(r == "textual" for r in reqs), "textual in the --without textual wheel"
assert "ibtool/_version.py" in z.namelist(), "_version.py"
assert version in z.read("ibtool/_version.py").decode(), "_version.py's version"
print("  ok: version, console script, dependencies (no textual), _version.py")
EOF
echo "rpm check: passed (rpmlint; rpmspec -P and rpmbuild -bb with the stand-in macros)"

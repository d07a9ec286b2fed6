# The two set-up commands the README documents: `make demo` and `make test`.
# Both install what they need on a fresh Debian 12 machine (as root).
#
#   make test         deps, venv, unit tests on the host, the integration suite in the testbed VM,
#                     then the floor and the ceiling of the release matrix (ends)
#   make demo         ibtool's overview: on this host if it has RDMA devices, else in the testbed
#   make unit         unit tests only (host; integration tests deselected)
#   make integration  boot the SoftRoCE testbed once and run tests/integration inside it
#   make ends         the oldest and newest release (bullseye: Python 3.9, rdma-core 33, kernel
#                     5.10; sid): the unit suite under each one's Python, chrooted, and the smoke
#                     of every command and the data path booted on each one's kernel and root
#                     (installed as each is: sid the Debian package, built and linted there;
#                     bullseye the wheel), then sid booted with systemd as init: the units
#   make matrix       the smoke on every release (bullseye bookworm trixie sid) and its table
#   make capture      refresh tests/fixtures/captured from the testbed (sysfs tree, netlink)
#   make pair         two testbed guests on one link (runner and peer, each its own kernel):
#                     the two-host tests, `pytest -m pair tests/integration`, in the runner
#   make pair-ends    the same with bullseye's kernel and root against sid's
#                     (not in `make test`: CI time; see tests/testbed/README.md)
#   make mesh         four testbed guests on one shared Ethernet segment (node1..node4, ssh
#                     between all, one Slurm cluster): `pytest -m mesh tests/integration` in
#                     node1 (not in `make test`: CI time; see tests/testbed/README.md)
#   make dist         the sdist and the wheel (python -m build) in dist/py, checked with twine
#   make deb          the Debian package, built and linted (lintian) in sid's root: dist/deb/sid
#                     (`tests/testbed/testbed --release trixie deb` for trixie's)
#   make rpm          rpm/ibtool.spec: rpmlint, and binary RPMs built with stand-in macros for
#                     Fedora's (Debian has none), checked and smoke-run (rpm/check.sh; SDIST=path)
#   make completion   write completion/ibtool.bash and completion/_ibtool from the parser
#   make deps / venv  the Debian packages / .venv (re-made when pyproject.toml changes)

PYTHON := /usr/bin/python3
VENV := .venv
STAMP := $(VENV)/.installed
TESTBED := tests/testbed/testbed

OLDEST := bullseye
NEWEST := sid

.PHONY: demo test unit integration ends matrix deps venv capture bench lint pair pair-ends mesh \
	dist deb rpm completion
.NOTPARALLEL:

test: deps venv unit integration ends

demo: venv
	@if [ -n "$$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then \
		bash tests/testbed/demo.sh; \
	else \
		echo "no RDMA device on this host: running the overview in the SoftRoCE testbed VM" >&2; \
		$(TESTBED) demo; \
	fi

unit: venv
	$(VENV)/bin/python -m pytest -m 'not integration' tests

integration: venv
	$(TESTBED) suite

ends: deps
	$(TESTBED) --release $(OLDEST) unit
	$(TESTBED) --release $(NEWEST) unit
	$(TESTBED) matrix $(OLDEST) $(NEWEST)
	$(TESTBED) --release $(NEWEST) units

matrix: deps
	$(TESTBED) matrix

deps:
	$(TESTBED) deps

venv: $(STAMP)

# pyverbs comes from Debian's python3-pyverbs for /usr/bin/python3: the venv must see it.
$(STAMP): pyproject.toml | deps
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

capture: venv
	$(TESTBED) capture

pair: venv
	$(TESTBED) pair-suite

pair-ends: deps
	$(TESTBED) --release $(OLDEST) pair-suite --peer-release $(NEWEST)

mesh: venv
	$(TESTBED) mesh-suite

dist: deps
	$(TESTBED) dist

deb: deps
	$(TESTBED) --release $(NEWEST) deb

rpm: deps
	bash rpm/check.sh $(SDIST)

# Only ibtool's own plugins in the committed scripts (a third-party one installed here would
# add its commands).
completion: venv
	IBTOOL_DISABLE_PLUGIN_AUTOLOAD=1 $(VENV)/bin/ibtool completion bash > completion/ibtool.bash
	IBTOOL_DISABLE_PLUGIN_AUTOLOAD=1 $(VENV)/bin/ibtool completion zsh > completion/_ibtool

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: venv
	$(VENV)/bin/python bench/bench_sysfs.py

"""ibtool: RDMA management and diagnostics toolkit.

Folders by kind, from the top; each may import only the folders its docstring names, a graph
rather than a ladder (tests/unit/test_layers.py holds the house to it):

    cli.py     argument parsing, global options, exit codes (the only place that exits)
    api.py     the one surface plugins import
    tui/       the dashboard (Textual), imported by `ibtool tui` only
    live/      the one engine and its faces' loops: dashboard feed, exporter, monitor
    health/    the checks' runs, config, state, textfile, Slurm
    doctor/    two hosts: both ends' facts, the checklist, the probe
    mesh/      many hosts: the schedule, the agents and their channel, the analysis
    plugin/    hookspecs, the plugin manager, the commands' registry
    snapshot/  save, the replayed tree, diff
    rdma/      the data path: ladder, completions, wire, cm, loopback/, ping/
    host.py    THE gateway: one Host merges the sources per fact, with provenance
    sources/   sysfs, netlink, verbs, kernel links, /proc, rtnetlink
    views/     rendering, the res tables, Prometheus exposition
    web/       the exporter's HTTP server and web config
    model/     records, counter meanings, rates, the GID rule, events, findings
    errors.py, argtypes.py

ibtool's own plugins are the package ibtool_plugins (plugins/ in a clone). This package may
import only ibtool.plugin.hookspecs, lazily, for `from ibtool import hookimpl`.
"""

try:
    # ibtool/_version.py is written by setuptools-scm from the git tag when ibtool is built or
    # installed (pyproject.toml, [tool.setuptools_scm]).
    from ibtool._version import __version__
except ImportError:  # a source tree that was never built nor installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    # `from ibtool import hookimpl` for plugins, without importing pluggy for `--version`.
    if name in ("hookimpl", "hookspec"):
        from ibtool.plugin import hookspecs

        return getattr(hookspecs, name)
    raise AttributeError(name)

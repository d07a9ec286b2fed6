"""The ibtool plugin API. Every user-visible feature is a plugin implementing these hooks.

A plugin is a module (or object) with functions named like the hooks below, decorated with
``ibtool.hookimpl``, registered under the ``ibtool`` entry-point group::

    [project.entry-points.ibtool]
    myplugin = "mypackage.ibtool_plugin"

Rules every plugin follows:

* import heavy libraries (pyroute2, pyverbs, textual) inside the functions that need them, never
  at module import time: ``ibtool --version`` and the sysfs commands must stay fast;
* raise ``ibtool.errors.IbtoolError`` subclasses with a hint for anything the user must fix;
  never call ``sys.exit`` — the CLI owns exit codes;
* never import another plugin; share code through the ``ibtool`` core.

A plugin that fails to import or to register is reported as one warning on stderr and the rest
of ibtool keeps working.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("ibtool")
hookimpl = pluggy.HookimplMarker("ibtool")


@hookspec
def ibtool_register_commands(cli):
    """Add subcommands.

    ``cli`` is an :class:`ibtool.commands.CommandRegistry`; call
    ``cli.add(name, run, help=..., configure=..., aliases=...)`` once per subcommand, where
    ``configure(parser)`` adds the command's arguments to an ``argparse`` parser and
    ``run(inv)`` receives an :class:`ibtool.commands.Invocation` (parsed arguments, output
    options, the host facade, stdout) and returns an exit code or None for success.
    """


@hookspec
def ibtool_health_checks(register):
    """Contribute health checks for ``ibtool health``.

    Call ``register(name, check)`` where ``check(host)`` returns a list of results, each a
    status (OK, WARNING, CRITICAL, UNKNOWN: the Nagios plugin convention) with a one-line
    summary. Checks must not change kernel state and must finish within a few seconds.
    """


@hookspec
def ibtool_tui_panels(register):
    """Contribute a panel to the ``ibtool tui`` dashboard.

    Call ``register(name, factory)`` where ``factory()`` returns a Textual widget. Import
    textual inside the factory: this hook is only called by ``ibtool tui``.
    """


@hookspec
def ibtool_metrics(register):
    """Contribute Prometheus metric families.

    Call ``register(name, collect)`` where ``collect(host)`` yields
    ``(metric_name, type, help, labels, value)`` tuples computed from the plugin's records.
    Metric names follow Prometheus conventions (``ibtool_port_..._bytes_total``).
    """

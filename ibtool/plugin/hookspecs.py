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

The health check, panel and metric hooks each get a ``register(name, function)``; the types
those functions take and return are in ``ibtool.api``, which is cheap to import at a plugin's
top. A hook implementation that raises (SystemExit included), or registers something not
callable, is one warning, and nothing it registered through that hook is kept. A name already
taken (a command, an alias, a check, a collector, a metric family) stays with ibtool's own
plugin, else with the plugin loaded first: the newcomer's is left out with one warning naming
it, and the rest of what it registered is kept (ibtool-plugins(8), "Name clashes and failures").
``ibtool.plugin.hooks`` calls these hooks and runs what they register.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("ibtool")
hookimpl = pluggy.HookimplMarker("ibtool")


@hookspec
def ibtool_register_commands(cli):
    """Add subcommands.

    ``cli`` is an :class:`ibtool.plugin.commands.CommandRegistry`; call
    ``cli.add(name, run, help=..., configure=..., aliases=...)`` once per subcommand, where
    ``configure(parser)`` adds the command's arguments to an ``argparse`` parser and
    ``run(inv)`` receives an :class:`ibtool.plugin.commands.Invocation` (parsed arguments, output
    options, the host facade, stdout) and returns an exit code or None for success.
    """


@hookspec
def ibtool_health_checks(register):
    """Contribute health checks for ``ibtool health``.

    Call ``register(name, check)`` once per check (``name``: a str without spaces, unique
    among all plugins' checks). ``check(ctx)`` receives an :class:`ibtool.api.CheckContext`:
    ``ctx.host`` (the :class:`ibtool.host.Host` facade), ``ctx.config`` (the parsed
    ``health.toml``) and ``ctx.options`` (its ``[checks.NAME]`` table), ``ctx.previous`` (what
    the check passed to ``ctx.keep(value)`` at its last run, kept in the state file with the
    boot id: ``ctx.same_boot``, ``ctx.interval``), and ``ctx.datapath``/``ctx.deadline`` for
    checks that move data (run only with ``--datapath``). It returns a list (or yields)
    :class:`ibtool.api.HealthResult` objects: a :class:`ibtool.api.Status` (OK, WARNING,
    CRITICAL, UNKNOWN: the Nagios plugin return codes), the subject (``mlx5_0/1``, or '' for
    the host), a one-line summary (control characters in either stored escaped), optional
    :class:`ibtool.api.Perfdata` items and a ``kind`` (snake_case, e.g. ``link_degraded``:
    what a program acts on, never the summary's words).
    No result means nothing to report. The core fills in each result's ``check`` with
    ``name``; a check that raises, or returns anything else, is reported as one UNKNOWN result
    (:func:`ibtool.plugin.hooks.run_health_checks`). Checks must not change kernel state and,
    without ``--datapath``, must finish within a second: cron runs them every minute on every
    node.
    """


@hookspec
def ibtool_tui_panels(register):
    """Contribute a panel to the ``ibtool tui`` dashboard.

    Call ``register(name, factory)`` once per panel. ``factory(feed)`` receives the
    dashboard's one :class:`ibtool.live.feed.Feed`, the same for every panel (its last frame is
    ``feed.latest``), and returns a ``textual.widget.Widget``; after each poll the widget
    receives an ``ibtool.tui.messages.Polled`` message whose ``frame`` is the new
    :class:`ibtool.live.feed.Frame`. One poller serves every panel: a panel never reads the kernel
    itself. Import textual inside the factory: this hook is called by ``ibtool tui`` only, and
    the core only collects the factories (:func:`ibtool.plugin.hooks.panel_factories`).
    """


@hookspec
def ibtool_metrics(register):
    """Contribute Prometheus metric families.

    Call ``register(name, collect)`` once per collector. ``collect(host)`` receives the
    :class:`ibtool.host.Host` facade and returns a list (or yields)
    :class:`ibtool.api.MetricFamily` objects: ``MetricFamily(name, documentation, type,
    unit="")`` with type ``"counter"`` or ``"gauge"``, filled with ``family.add(labels,
    value)``, where labels is a dict of str to str. Names follow the Prometheus conventions
    (``ibtool_port_rcv_bytes``); a counter is named without ``_total``, which the exposition
    adds. :func:`ibtool.api.exposition` writes the text format. A collector that raises or
    returns anything else is one warning and contributes nothing; a family whose name an earlier
    family has is one warning and left out.
    """

"""The plugin machinery: the hookspecs (the plugin API's documentation), the manager that
registers ibtool's own plugins by name and others by entry point, the registry of commands and
the Invocation a command gets, the hooks' calls and the types of what they register.

    hookspecs  the hooks a plugin implements (their docstrings are the plugin docs)
    manager    build the plugin manager: built-ins, entry points, -p no:NAME, IBTOOL_PLUGINS
    commands   the commands' registry and the Invocation (the run's host, output, options)
    hooks      collect what the plugins register: checks, metric collectors, panels
    context    what a check is given (CheckContext) and the registered functions' types

May import ibtool.snapshot, ibtool.host, ibtool.views, ibtool.model, ibtool.errors and
ibtool.argtypes; never ibtool.health, ibtool.live, ibtool.tui, ibtool.api or a plugin.
"""

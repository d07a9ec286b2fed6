"""ibtool's own plugins and their commands, registered as cli.main registers them, for the tests
that read the real parser (the man pages, the completion, the systemd units' command lines).

Third-party plugins are not loaded (IBTOOL_DISABLE_PLUGIN_AUTOLOAD): their pages and commands
belong to their own distributions. A plugin that fails to load or register fails the test,
rather than leaving its command out of every check.
"""

from __future__ import annotations

from ibtool.cli import plugins_command, register_commands
from ibtool.plugin.commands import CommandRegistry
from ibtool.plugin.manager import ENV_DISABLE_AUTOLOAD, build_plugins


def own_commands():
    """(the plugin manager, the CommandRegistry) of ibtool's own plugins."""
    warnings: list[str] = []
    plugins = build_plugins(environ={ENV_DISABLE_AUTOLOAD: "1"}, warn=warnings.append)
    registry = CommandRegistry()
    register_commands(plugins, registry, warnings.append)
    plugins_command(registry, plugins)
    assert warnings == []
    return plugins, registry

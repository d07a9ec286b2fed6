"""First-party ibtool plugins, installed as the package `ibtool_plugins`: one module per concern."""

"""ibtool: RDMA management and diagnostics toolkit."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `from ibtool import hookimpl` for plugins, without importing pluggy for `--version`.
    if name in ("hookimpl", "hookspec"):
        from ibtool.plugin import hookspecs

        return getattr(hookspecs, name)
    raise AttributeError(name)

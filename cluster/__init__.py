"""The cluster: supervisor, worker bootstrap, ZeroMQ mesh between routers, stats, config, CLI."""

__version__ = "0.1.0"  # the one source of the version: pyproject.toml reads it

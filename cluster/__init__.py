"""The cluster: supervisor, worker bootstrap, ZeroMQ mesh between routers, stats, config, CLI."""

__version__ = "0.1.0"

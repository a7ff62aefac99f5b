"""`brokerd` command line: run the broker, or one of its tools (stats, log, keygen)."""

from __future__ import annotations

import logging
import sys

from .config import ConfigError, load


def _setup_logging(level: str, node: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format=f"%(asctime)s %(levelname)s [{node}] %(name)s: %(message)s",
        stream=sys.stderr,
    )


SUBCOMMANDS = ("stats", "log", "keygen", "health")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"brokerd: error: {exc}", file=sys.stderr)
        return 2
    _setup_logging(config.log_level, config.node_id)
    from .supervisor import Supervisor

    return Supervisor(config).run()


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "stats":
        from .stats_cli import main as stats_main

        return stats_main(argv)
    if name == "log":
        from .log_cli import main as log_main

        return log_main(argv)
    if name == "health":  # cluster/health.py: exit 0 when the broker answers CONNECT with CONNACK 0
        from .health import main as health_main

        return health_main(argv)
    from .keys import main as keygen_main

    return keygen_main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""`brokerd` command line: run the broker, or one of its tools (stats, log, keygen)."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys

from .config import ConfigError, load


def _setup_logging(level: str, node: str, log_file: str | None = None) -> None:
    """stderr, and with ``--log-file`` that file too, in every process of the broker.

    The file is a ``WatchedFileHandler`` (opened for appending): each process (supervisor, workers,
    stats process; forked with the handler) checks before a write whether the path still names the
    file it has open, and reopens it if not. So logrotate's usual way, rename then SIGHUP, works, and
    so does its ``create`` without a signal; ``copytruncate`` works too (appends go to the new end).
    Raises ``ConfigError`` when the file cannot be opened."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        try:
            handlers.append(logging.handlers.WatchedFileHandler(log_file, encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--log-file: cannot open {log_file}: {exc.strerror}") from None
    # What each record would gather that the format never shows: the caller's frame (the logging
    # module's own advice at ``_srcfile``), thread and process names; a fifth of a line's cost.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format=f"%(asctime)s %(levelname)s [{node}] %(name)s: %(message)s",
        handlers=handlers,
    )


SUBCOMMANDS = ("stats", "log", "keygen", "health", "passwd")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        try:
            return _subcommand(argv[0], argv[1:])
        except BrokenPipeError:  # `brokerd stats --json | head`: the reader has what it wanted
            _quiet_stdout()
            return 0
    try:
        config = load(argv)
        from .auth_setup import check_auth

        check_auth(config)  # a password or ACL file that cannot be used: exit 2
        _setup_logging(config.log_level, config.node_id, config.log_file)
    except ConfigError as exc:
        print(f"brokerd: error: {exc}", file=sys.stderr)
        return 2
    from .supervisor import Supervisor

    return Supervisor(config).run()


def _quiet_stdout() -> None:
    """stdout's reader is gone: point it at /dev/null, so that the flush at exit says nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


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
    if name == "passwd":  # cluster/auth_setup.py: a user in a Mosquitto-format password file
        from .auth_setup import passwd_main

        return passwd_main(argv)
    from .keys import main as keygen_main

    return keygen_main(argv)


if __name__ == "__main__":
    sys.exit(main())

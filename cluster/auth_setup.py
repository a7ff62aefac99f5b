"""The broker's side of ``router.auth``: build a router's ``Auth`` from the options, check it at
start (a bad file is an error naming it), reload it on SIGHUP, and ``brokerd passwd``.

SIGHUP reaches the supervisor only (``cluster.process.child_signals``); it sends SIGUSR1 to each
worker, which reads the files again on its loop: connected clients stay, and the new rules apply
to what they do from then on. A file that no longer reads keeps the old configuration (logged).
An auth plugin's answers, which the router keeps per user, client and topic, are forgotten at the
same reload (with or without files), so a grant the plugin revoked applies from then on.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import inspect
import logging
import os
import signal
import sys
from typing import Any

from brokerd.router.auth import Auth, AuthFileError, read_acl_file, read_password_file, set_password

from .config import Config, ConfigError

log = logging.getLogger(__name__)


def anonymous_allowed(config: Config) -> bool:
    """``--allow-anonymous`` as given, else off once clients are authenticated at all (a password
    file, an auth plugin, or TLS identities as user names), else on."""
    if config.allow_anonymous is not None:
        return bool(config.allow_anonymous)
    return not (config.password_file or config.auth_plugin or getattr(config, "use_identity_as_username", False))


def plugin_options(config: Config) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in config.auth_plugin_opt:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--auth-plugin-opt: expected KEY=VALUE, got {item!r}")
        options[key.strip()] = value.strip()
    return options


def load_plugin(config: Config) -> Any:
    """The object ``--auth-plugin MODULE:ATTR`` names; a class (or a factory without
    ``authenticate``) is called with the ``--auth-plugin-opt`` options as a dict."""
    spec = config.auth_plugin
    module_name, sep, attr = (spec or "").partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--auth-plugin: expected MODULE:ATTR, got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--auth-plugin: cannot load {spec}: {exc}") from None
    if inspect.isclass(obj) or (callable(obj) and not hasattr(obj, "authenticate")):
        try:
            obj = obj(plugin_options(config))
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - the operator's plugin: say what it said
            raise ConfigError(f"--auth-plugin: {spec} refused its options: {exc}") from None
    if not callable(getattr(obj, "authenticate", None)):
        raise ConfigError(f"--auth-plugin: {spec} has no authenticate(client_id, username, password, peer)")
    return obj


def build_auth(config: Config, plugin: Any = None) -> Auth | None:
    """The ``Auth`` the options describe (None: nothing configured). Raises ``AuthFileError``."""
    if plugin is None and config.auth_plugin:
        plugin = load_plugin(config)
    passwords = read_password_file(config.password_file) if config.password_file else None
    acl = read_acl_file(config.acl_file) if config.acl_file else None
    allow = anonymous_allowed(config)
    if passwords is None and acl is None and plugin is None and allow:
        return None
    return Auth(passwords, acl, plugin, allow)


def check_auth(config: Config) -> None:
    """At start, before the workers: a file or plugin that cannot be used is a ``ConfigError``."""
    try:
        build_auth(config)
    except AuthFileError as exc:
        flag = "--password-file" if config.password_file and str(exc).startswith(config.password_file) else "--acl-file"
        raise ConfigError(f"{flag}: {exc}") from None


def install(router: Any, config: Config) -> None:
    """A worker's router gets its ``Auth`` (at start)."""
    from brokerd.router.access import install_auth

    auth = build_auth(config)
    install_auth(router, auth)
    if auth is not None:
        log.info("authentication: %s; ACL: %s; anonymous clients %s",
                 f"{len(auth.passwords)} user(s) in {config.password_file}" if auth.passwords is not None
                 else "no password file", config.acl_file or "none",
                 "allowed" if auth.allow_anonymous else "refused")


def reloads(config: Config) -> bool:
    """Whether a SIGHUP has anything to reload in the workers' access rules: a password or ACL
    file to read again, or an auth plugin whose kept answers to forget."""
    return bool(config.password_file or config.acl_file or config.auth_plugin)


def reload(router: Any, config: Config) -> None:
    """SIGUSR1 in a worker (the supervisor's SIGHUP): read the files again and forget a plugin's
    kept answers; on an error keep the configuration in force."""
    from brokerd.router.access import install_auth

    old = router.auth if router.auth is not None else router.acl
    try:
        auth = build_auth(config, plugin=old.plugin if old is not None else None)
    except (AuthFileError, ConfigError) as exc:
        log.error("reload failed, the previous password/ACL configuration stays in force: %s", exc)
        return
    install_auth(router, auth)
    if not (config.password_file or config.acl_file):
        log.info("auth plugin's kept answers forgotten")
        return
    log.info("password and ACL files reloaded (%s)",
             f"{len(auth.passwords)} user(s)" if auth is not None and auth.passwords is not None else "no password file")


def forward_reload(config: Config, pids: dict[int, int]) -> bool:
    """In the supervisor, on SIGHUP: tell every worker to reload its password and ACL files (and
    forget an auth plugin's kept answers) and its TLS listeners' certificates. False when there is
    nothing of the kind."""
    tls = any(x.tls for x in config.listeners)
    if not (reloads(config) or tls):
        return False
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    log.info("SIGHUP: workers reload %s", " and ".join(
        (["the password and ACL files"] if config.password_file or config.acl_file else [])
        + (["the auth plugin's answers"] if config.auth_plugin else [])
        + (["the TLS certificates"] if tls else [])))
    return True


# -- brokerd passwd -----------------------------------------------------------------------------------

def passwd_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="brokerd passwd",
        description="Create or update a user in a Mosquitto-format password file ($7$: PBKDF2-SHA512). "
        "The password is asked twice on a terminal, else read as one line from stdin; with -b it is "
        "the third argument (as mosquitto_passwd -b: for scripts; it shows in the process list).")
    p.add_argument("-b", dest="batch", action="store_true", help="batch mode: the password is an argument")
    p.add_argument("file", metavar="FILE")
    p.add_argument("user", metavar="USER")
    p.add_argument("password", metavar="PASSWORD", nargs="?", help="with -b only")
    args = p.parse_args(argv)
    if args.batch != (args.password is not None):
        p.error("PASSWORD is given with -b, and only then")
    if args.batch:
        password = args.password
    elif sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Reenter password: ") != password:
            print("brokerd passwd: error: passwords do not match", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("brokerd passwd: error: empty password", file=sys.stderr)
        return 1
    try:
        new = set_password(args.file, args.user, password)
    except AuthFileError as exc:
        print(f"brokerd passwd: error: {exc}", file=sys.stderr)
        return 1
    print(f"{'added' if new else 'updated'} user {args.user} in {args.file}")
    return 0

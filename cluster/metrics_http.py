"""The /metrics HTTP server: loopback unless an address is given, optionally behind basic auth
(a Mosquitto-format password file, the same as for MQTT clients) and TLS.

prometheus_client's own ``start_http_server`` takes TLS but no authentication, so the WSGI app it
makes (``make_wsgi_app``) is served here by the standard library's WSGI server in a thread, with a
basic-auth check in front of it and the listening socket wrapped by ``ssl``.
"""

from __future__ import annotations

import base64
import binascii
import ssl
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from brokerd.router.auth import read_password_file, verify_password

REALM = "brokerd metrics"
# A WSGI application (PEP 3333): environ and start_response in, the body's chunks out.
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a scrape every few seconds is not worth a log line


def basic_auth(app: WSGIApp, passwords: dict[str, str]) -> WSGIApp:
    """``app`` for requests that carry a user and password of ``passwords``; 401 for the others."""
    ok: dict[str, bool] = {}  # Authorization header → verdict: PBKDF2 once per credential, not per scrape

    def checked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_AUTHORIZATION", "")
        verdict = ok.get(header)
        if verdict is None:
            verdict = False
            if header.startswith("Basic "):
                try:
                    user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
                    stored = passwords.get(user)
                    verdict = stored is not None and verify_password(stored, password.encode())
                except (binascii.Error, UnicodeDecodeError):
                    verdict = False
            if len(ok) < 64:
                ok[header] = verdict
        if not verdict:
            start_response("401 Unauthorized", [("WWW-Authenticate", f'Basic realm="{REALM}"'),
                                                 ("Content-Type", "text/plain")])
            return [b"authentication required\n"]
        return app(environ, start_response)

    return checked


def serve(registry: Any, host: str, port: int, *, password_file: str | None = None,
          certfile: str | None = None, keyfile: str | None = None) -> _Server:
    """Serve ``registry`` on http(s)://host:port/metrics in a daemon thread; returns the server."""
    from prometheus_client import make_wsgi_app

    app = make_wsgi_app(registry)
    if password_file:
        app = basic_auth(app, read_password_file(password_file))
    httpd = make_server(host, port, app, _Server, handler_class=_QuietHandler)
    if certfile:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certfile, keyfile)
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd

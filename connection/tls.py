"""TLS for mqtts:// and wss:// listeners: the standard ``ssl`` module, driven by the event loop (uvloop).

The loop does the handshake before the protocol's ``connection_made``, so a connection sees only
decrypted bytes and its peer's verified certificate: ``peer_identity`` reads the name in it that
``use_identity_as_username`` makes the username.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import tempfile
from dataclasses import replace

from .listener import Listener

_VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


def _why(exc: OSError) -> object:
    """What is wrong with a TLS file, in words: an SSLError's reason, else the OSError's strerror,
    else the error itself. Either may be None, though typeshed says str: read untyped, for compiled
    (mypyc checks a declared str when it is read) None raised TypeError, not the ValueError that a
    SIGHUP reload reports and start-up prints."""
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc


def server_context(listener: Listener) -> ssl.SSLContext:
    """The SSL context of a TLS listener: its certificate and key, the lowest version it accepts, and
    with a CA file, client certificates checked against it (required with ``require_certificate``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[listener.tls_version or "tlsv1.2"]
    if not listener.certfile:
        raise ValueError("TLS needs a certificate file (--certfile)")
    try:
        ctx.load_cert_chain(listener.certfile, listener.keyfile)
    except ssl.SSLError as exc:
        raise ValueError(f"--certfile/--keyfile: cannot use {listener.certfile} with {listener.keyfile}: "
                         f"{_why(exc)}") from None
    except OSError as exc:
        raise ValueError(f"--certfile/--keyfile: cannot read {exc.filename or listener.certfile}: "
                         f"{_why(exc)}") from None
    if listener.cafile:
        try:
            ctx.load_verify_locations(cafile=listener.cafile)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"--cafile: cannot use {listener.cafile}: {_why(exc)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if listener.require_certificate else ssl.CERT_OPTIONAL
    return ctx


def reload_context(ctx: ssl.SSLContext, listener: Listener) -> None:
    """Load the listener's certificate, key and CA files again into its live context (SIGHUP): the
    connections accepted from now on get them, established ones keep what they negotiated. The files
    are copied first and checked in a context of their own, so a bad, missing or half-written file
    raises ValueError and leaves ``ctx`` as it was. A CA file's certificates are added: a CA that was
    trusted stays trusted until a restart."""
    with tempfile.TemporaryDirectory(prefix="brokerd-tls-") as staging:  # mode 0700: the key stays private
        copies: dict[str, str] = {}
        for name in ("certfile", "keyfile", "cafile"):
            path = getattr(listener, name)
            if path:
                copy = copies[name] = os.path.join(staging, name)
                try:
                    shutil.copyfile(path, copy)
                except OSError as exc:
                    raise ValueError(f"--{name}: cannot read {path}: {_why(exc)}") from None
        staged = replace(listener, certfile=copies.get("certfile", listener.certfile),
                         keyfile=copies.get("keyfile", listener.keyfile), cafile=copies.get("cafile", listener.cafile))
        try:
            server_context(staged)
        except ValueError as exc:
            message = str(exc)
            for name, copy in copies.items():
                message = message.replace(copy, getattr(listener, name))
            raise ValueError(message) from None
        # (mypy: the listener's certificate paths, checked above)
        ctx.load_cert_chain(staged.certfile, staged.keyfile)  # type: ignore[arg-type]
        if staged.cafile:
            ctx.load_verify_locations(cafile=staged.cafile)


def peer_identity(transport: asyncio.BaseTransport) -> str | None:
    """The verified client certificate's common name, or its first subject alternative name when it has
    none; None without a client certificate, or with one that names no one (an empty CN counts as none).
    On a ``use_identity_as_username`` listener None refuses the client (``router.access``): the CONNECT's
    own user name never stands in for the certificate's."""
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                name: str = value
                return name
    for _kind, value in cert.get("subjectAltName", ()):
        if value:
            name = value
            return name
    return None

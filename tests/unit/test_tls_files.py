"""A TLS file that cannot be used is a ValueError that names it and says why (``connection.tls``),
at start-up and on a SIGHUP reload alike, whether the error carries a reason, a strerror or
neither: ssl's "PEM lib" error has no reason, and compiled (mypyc checks a declared str) reading
it as str raised TypeError, which the reload does not catch."""

from __future__ import annotations

import ssl

import pytest

from brokerd.connection.listener import Listener
from brokerd.connection.tls import reload_context, server_context


def _listener(tmp_path, cert: str) -> Listener:
    (tmp_path / "cert.pem").write_text(cert)
    return Listener(scheme="mqtts", certfile=str(tmp_path / "cert.pem"))


def test_a_file_that_is_not_a_certificate_is_a_value_error(tmp_path):
    listener = _listener(tmp_path, "-----BEGIN CERTIFICATE-----\nnot a certificate\n")
    with pytest.raises(ValueError, match=r"--certfile/--keyfile: cannot use .*cert\.pem with None: .*PEM lib"):
        server_context(listener)


def test_a_reload_of_a_bad_certificate_is_a_value_error_naming_the_file_not_its_copy(tmp_path):
    listener = _listener(tmp_path, "-----BEGIN CERTIFICATE-----\nnot a certificate\n")
    with pytest.raises(ValueError, match=r"cannot use .*/cert\.pem with None") as raised:
        reload_context(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), listener)
    assert "brokerd-tls-" not in str(raised.value)


def test_a_missing_file_says_why(tmp_path):
    listener = Listener(scheme="mqtts", certfile=str(tmp_path / "gone.pem"))
    with pytest.raises(ValueError, match=r"--certfile: cannot read .*gone\.pem: No such file or directory"):
        reload_context(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), listener)

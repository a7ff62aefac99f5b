"""sd_notify: tell systemd (``Type=notify``) when brokerd is ready and when it is stopping.

systemd passes ``NOTIFY_SOCKET``, a unix datagram socket: a path, or an abstract name written with a
leading ``@``. The supervisor sends ``READY=1`` once every worker serves (with /metrics, when on), so
``systemctl start`` returns when clients can connect and units ordered after brokerd start then, and
``STOPPING=1`` when it begins a graceful stop. Without ``NOTIFY_SOCKET`` nothing is sent. Standard
library only; a failure to send is never an error of the broker's.
"""

from __future__ import annotations

import os
import socket


def notify(state: str, socket_path: str | None = None) -> bool:
    """Send ``state`` ("READY=1\\nSTATUS=...") to the service manager; True if it was sent."""
    path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET")
    if not path or path[0] not in "/@":
        return False
    address = "\0" + path[1:] if path[0] == "@" else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(state.encode())
    except OSError:
        return False
    return True

"""An auth plugin that asks an operator's HTTP service, once per CONNECT (as EMQX and VerneMQ offer).

``--auth-plugin brokerd.cluster.auth_http:HttpAuth --auth-plugin-opt url=http://HOST:PORT/PATH``

Each CONNECT with a user name POSTs JSON ``{"clientid", "username", "password", "peer"}`` to
``url`` (standard library, in a thread: the worker's loop keeps running; the client's reading is
paused meanwhile). 200 or 204 allows, unless a JSON body says ``{"result": "deny"}`` (or
``"ignore"``: no opinion, the client is refused as not authorized); 401/403 (any 4xx) refuses with
bad user name or password. A failed request (timeout, 5xx) refuses as not authorized and is logged;
it is not cached. Answers are cached for ``cache_s`` seconds (default 30) per client id, user and
password hash, so reconnect storms do not hammer the service. Options: ``url`` (required),
``timeout_s`` (default 5), ``cache_s``. Topics are not asked about (``authorize`` has no opinion:
the ACL file decides).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger(__name__)

CACHE_MAX = 10_000


class HttpAuth:
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options.get("url", "")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("needs url=http://HOST:PORT/PATH")
        self.timeout_s = float(options.get("timeout_s", 5))
        self.cache_s = float(options.get("cache_s", 30))
        self._cache: dict[tuple, tuple[float, bool | None]] = {}

    async def authenticate(self, client_id: str, username: str | None, password: bytes | None,
                           peer: Any) -> bool | None:
        key = (client_id, username, hashlib.sha256(password or b"").digest())
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        body = json.dumps({"clientid": client_id, "username": username,
                           "password": (password or b"").decode("utf-8", "replace"),
                           "peer": str(peer)}).encode()
        answer = await asyncio.get_running_loop().run_in_executor(None, self._ask, body)
        if len(self._cache) >= CACHE_MAX:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
        self._cache[key] = (now + self.cache_s, answer)
        return answer

    def _ask(self, body: bytes) -> bool | None:
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - the operator's URL
                text = response.read(65536)
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                return False
            raise RuntimeError(f"auth service {self.url}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"auth service {self.url}: {exc}") from None
        if not text.strip():
            return True
        try:
            result = json.loads(text).get("result", "allow")
        except (ValueError, AttributeError):
            return True
        return {"allow": True, "deny": False}.get(str(result).lower())

    def authorize(self, client_id: str, username: str | None, topic: str, access: str) -> bool | None:
        return None

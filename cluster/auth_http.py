"""An auth plugin that asks an operator's HTTP service, once per CONNECT (as EMQX and VerneMQ offer).

``--auth-plugin brokerd.cluster.auth_http:HttpAuth --auth-plugin-opt url=http://HOST:PORT/PATH``

Each CONNECT with a user name POSTs JSON ``{"clientid", "username", "password", "peer"}`` to
``url``. The documented answers: 200 or 204 with an empty body allows; 200 with a JSON object
``{"result": "allow" | "deny" | "ignore"}`` allows, refuses with bad user name or password, or has no
opinion (the client is refused as not authorized); 401/403 (any 4xx) refuses with bad user name or
password. Anything else (another status, a body that is not that JSON, no answer within
``timeout_s``) is a failure: the client is refused as not authorized, the failure is logged, and it is
not cached. Allowing on an answer nobody wrote would let in whoever a broken service lets in.

Answers are cached for ``cache_s`` seconds per client id, user, the client's address (not its
port: the service may decide by address) and password hash, so reconnect storms do not hammer the
service; a cached answer is given at once, with no request and no wait.
A request runs in one of the plugin's own ``max_concurrent`` threads per worker (never the loop's
default executor, which writes snapshots and replicated files): the worker's loop keeps running and
the client's reading is paused meanwhile. ``timeout_s`` bounds the whole wait, for a free thread
included, so a slow service delays only the CONNECTs that need it, by at most that much.
Options: ``url`` (required), ``timeout_s`` (default 5), ``cache_s`` (default 30),
``max_concurrent`` (default 8). Topics are not asked about (``authorize`` has no opinion: the ACL
file decides).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

CACHE_MAX = 10_000
_RESULTS = {"allow": True, "deny": False, "ignore": None}


class HttpAuth:
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options.get("url", "")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("needs url=http://HOST:PORT/PATH")
        self.timeout_s = float(options.get("timeout_s", 5))
        self.cache_s = float(options.get("cache_s", 30))
        self.max_concurrent = int(options.get("max_concurrent", 8))
        if self.timeout_s <= 0 or self.max_concurrent < 1:
            raise ValueError("timeout_s must be above 0 and max_concurrent at least 1")
        self._cache: dict[tuple, tuple[float, bool | None]] = {}
        self._slots = asyncio.Semaphore(self.max_concurrent)  # binds to the worker's loop on first use
        self._pool: ThreadPoolExecutor | None = None  # made in the worker (a thread does not survive fork)

    def authenticate(self, client_id: str, username: str | None, password: bytes | None,
                     peer: Any) -> bool | None | Awaitable[bool | None]:
        """A cached answer at once, else an awaitable of the service's."""
        key = (client_id, username, str(peer).rpartition(":")[0], hashlib.sha256(password or b"").digest())
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        body = json.dumps({"clientid": client_id, "username": username,
                           "password": (password or b"").decode("utf-8", "replace"),
                           "peer": str(peer)}).encode()
        return self._request(key, body)

    async def _request(self, key: tuple, body: bytes) -> bool | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            await asyncio.wait_for(self._slots.acquire(), self.timeout_s)
        except TimeoutError:
            raise RuntimeError(f"auth service {self.url}: {self.max_concurrent} requests in flight for "
                               f"{self.timeout_s:g} s, none free (max_concurrent)") from None
        left = deadline - loop.time()
        if left < 0.05:  # a slot came too late to ask in time: spare the service the request
            self._slots.release()
            raise RuntimeError(f"auth service {self.url}: no request free within {self.timeout_s:g} s "
                               "(max_concurrent)")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="auth-http")
        future = loop.run_in_executor(self._pool, self._ask, body)
        future.add_done_callback(self._finished)  # the slot is freed when the thread is, not before
        try:
            answer = await asyncio.wait_for(asyncio.shield(future), left)
        except TimeoutError:
            raise RuntimeError(f"auth service {self.url}: no answer within {self.timeout_s:g} s") from None
        now = time.monotonic()
        if len(self._cache) >= CACHE_MAX:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
        self._cache[key] = (now + self.cache_s, answer)
        return answer

    def _finished(self, future: asyncio.Future) -> None:
        self._slots.release()
        if not future.cancelled():
            future.exception()  # a late failure after the timeout was reported already: mark it seen

    def _ask(self, body: bytes) -> bool | None:
        """One request, in a pool thread. The socket timeout bounds each read; ``_request`` the whole."""
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - the operator's URL
                status = response.status
                text = response.read(65536)
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                return False
            raise RuntimeError(f"auth service {self.url}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"auth service {self.url}: {exc}") from None
        return self._meaning(status, text)

    def _meaning(self, status: int, text: bytes) -> bool | None:
        """A 200/204 answer as the module docstring documents it; anything else is a failure."""
        if status not in (200, 204):
            raise RuntimeError(f"auth service {self.url}: HTTP {status}, expected 200, 204 or 4xx")
        if not text.strip():
            return True
        try:
            return _RESULTS[json.loads(text)["result"].lower()]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise RuntimeError(f"auth service {self.url}: the answer is not JSON {{\"result\": \"allow\", "
                               f"\"deny\" or \"ignore\"}} ({len(text)} bytes)") from None

    def authorize(self, client_id: str, username: str | None, topic: str, access: str) -> bool | None:
        return None

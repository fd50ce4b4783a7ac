"""Authentication of every call between the driver and the receivers.

Each application has a secret, generated at start (or Spark's own
``spark.authenticate.secret`` when set) and shipped to the receivers with their
task. A client signs every call: the ``x-sr-auth`` header carries
``<timestamp_ms>.<nonce>.<hmac-sha256(secret, timestamp.nonce)>``. The server
checks the signature in constant time, refuses tokens older than
``max_skew_ms`` and refuses a nonce it has already seen (replay).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict

AUTH_HEADER = "x-sr-auth"


def new_secret() -> str:
    """Return a fresh random application secret (hex)."""
    return secrets.token_hex(32)


def sign(secret: str, now_ms: int | None = None) -> str:
    """Return a one-use token for one call, signed with ``secret``."""
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    nonce = secrets.token_hex(12)
    payload = f"{ts}.{nonce}"
    mac = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()
    return f"{payload}.{mac}"


class TokenVerifier:
    """Checks call tokens: signature, freshness and single use.

    Thread-safe; remembers the nonces of the last ``max_skew_ms`` window.
    """

    def __init__(
        self, secret: str, max_skew_ms: int = 300_000, max_nonces: int = 1_000_000
    ) -> None:
        self._key = secret.encode()
        self._max_skew_ms = max_skew_ms
        self._max_nonces = max_nonces
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def verify(self, token: str | None, now_ms: int | None = None) -> str | None:
        """Return None when ``token`` is valid, else the reason it is refused."""
        if not token:
            return "no credentials"
        parts = token.split(".")
        if len(parts) != 3 or not parts[0].isdigit() or len(token) > 256:
            return "malformed credentials"
        ts_s, nonce, mac = parts
        expected = hmac.new(self._key, f"{ts_s}.{nonce}".encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, mac):
            return "wrong credentials"
        now = int(time.time() * 1000) if now_ms is None else now_ms
        ts = int(ts_s)
        if abs(now - ts) > self._max_skew_ms:
            return "expired credentials"
        with self._lock:
            if nonce in self._seen:
                return "replayed credentials"
            self._seen[nonce] = ts
            horizon = now - self._max_skew_ms
            while self._seen and (
                next(iter(self._seen.values())) < horizon or len(self._seen) > self._max_nonces
            ):
                self._seen.popitem(last=False)
        return None

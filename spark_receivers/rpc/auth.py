"""Authentication of every call between the driver and the receivers, bound to the call.

Each application has a secret, generated at start (or Spark's own
``spark.authenticate.secret`` when set) and shipped to the receivers with their
task. A client signs every call: the ``x-sr-auth`` header carries
``<timestamp_ms>.<nonce>.<mac>`` where ``mac`` is the HMAC-SHA256, under the
secret, of the call it authorises (:func:`call_payload`):

* the **endpoint** it is meant for (the ``host:port`` the endpoint advertises),
* the Flight **method** (``DoAction``, ``DoGet``, ``ListActions``),
* the **action type** (a message name) or nothing for a block read,
* the SHA-256 of the **body** (the action's JSON body, or the ``do_get`` ticket),
* the timestamp and the nonce.

The endpoint recomputes the MAC over what it actually received, in constant time,
refuses tokens older than ``max_skew_ms`` and refuses a nonce it has already seen.
So a token seen on the wire is worth nothing elsewhere: replayed at another
endpoint, with another message type or another body, its MAC does not match; at
the same endpoint with the same call, its nonce was seen. Tokens and the secret
never appear in a refusal, a log line or an exception (only the reason).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict

AUTH_HEADER = "x-sr-auth"
_DOMAIN = "spark-receivers-call-v2"
"""Prefix of every signed payload, so a MAC of ours means nothing to another protocol."""

__all__ = ["AUTH_HEADER", "TokenVerifier", "call_payload", "new_secret", "sign"]


def new_secret() -> str:
    """Return a fresh random application secret (hex)."""
    return secrets.token_hex(32)


def call_payload(endpoint: str, method: str, name: str, body: bytes, ts: str, nonce: str) -> bytes:
    """The bytes a call's MAC covers (see the module doc)."""
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join((_DOMAIN, endpoint, method, name, digest, ts, nonce)).encode()


def _mac(key: bytes, payload: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def sign(
    secret: str,
    endpoint: str,
    method: str,
    name: str = "",
    body: bytes = b"",
    now_ms: int | None = None,
) -> str:
    """Return a one-use token for one call to ``endpoint``, signed with ``secret``.

    Example::

        token = sign(secret, "10.0.0.5:40123", "DoAction", "AddBlock", body)
    """
    ts = str(int(time.time() * 1000) if now_ms is None else now_ms)
    nonce = secrets.token_hex(12)
    mac = _mac(secret.encode(), call_payload(endpoint, method, name, body, ts, nonce))
    return f"{ts}.{nonce}.{mac}"


class TokenVerifier:
    """Checks call tokens for one endpoint: signature over the call, freshness, single use.

    ``endpoint`` is the ``host:port`` the endpoint advertises (what clients sign
    for); it may be set after construction (:attr:`endpoint`), once the port is
    known. Thread-safe; remembers the nonces of the last ``max_skew_ms`` window.
    """

    def __init__(
        self,
        secret: str,
        endpoint: str = "",
        max_skew_ms: int = 300_000,
        max_nonces: int = 1_000_000,
    ) -> None:
        self._key = secret.encode()
        self.endpoint = endpoint
        self._max_skew_ms = max_skew_ms
        self._max_nonces = max_nonces
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def well_formed(token: str | None) -> str | None:
        """None when ``token`` has the shape of a token, else the reason it is refused."""
        if not token:
            return "no credentials"
        parts = token.split(".")
        if len(token) > 256 or len(parts) != 3 or not parts[0].isdigit():
            return "malformed credentials"
        return None

    def verify(
        self,
        token: str | None,
        method: str,
        name: str = "",
        body: bytes = b"",
        now_ms: int | None = None,
    ) -> str | None:
        """Return None when ``token`` authorises this call, else the reason it is refused."""
        reason = self.well_formed(token)
        if reason is not None:
            return reason
        assert token is not None
        ts_s, nonce, mac = token.split(".")
        payload = call_payload(self.endpoint, method, name, body, ts_s, nonce)
        if not hmac.compare_digest(_mac(self._key, payload), mac):
            return "wrong credentials (another secret, or a token signed for another call)"
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

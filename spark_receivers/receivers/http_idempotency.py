"""The ``Idempotency-Key`` memory of :class:`~spark_receivers.receivers.http.HttpReceiver`.

A client that retries a POST (its answer was lost, the connection broke, it got a 429
after the store had begun) sends the same ``Idempotency-Key`` header again. The receiver
remembers, for ``window_s`` seconds and at most ``max_keys`` keys (the oldest forgotten
first), the answer of every request with a key whose records were stored: a repeat gets
that first answer again and stores nothing. Only stored requests are remembered: a
refused one (400, 413, 429 before the store, 503) may be retried and stored. A repeat
that arrives while the first request is still being stored is answered 409 with
``Retry-After``.

Across a restart of the receiver (or of its executor, or of the driver with
``get_or_create``), the memory of one life is gone, but every store with a key carries
the key as its source position (``{"idempotency_key": ..., "stored": n}``): the
restarted receiver asks the driver for the last one it accepted and remembers it, so
the request a crash cut off between the store and the answer, retried, is not stored
again. Older keys of the window are not carried over (see docs/receivers.md).

Thread contract: every method may be called from any thread (one lock, held briefly).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_KEY_LENGTH", "IdempotencyKeys", "Seen", "position_of", "stored_of_position"]

MAX_KEY_LENGTH = 255
"""The longest ``Idempotency-Key`` taken (characters); a longer one is a 400."""


@dataclass(frozen=True)
class Seen:
    """What :meth:`IdempotencyKeys.begin` found: a first answer to replay, or a request busy."""

    answer: dict[str, Any] | None
    busy: bool = False


class IdempotencyKeys:
    """Remembered keys with their first answer, and the keys being stored."""

    def __init__(
        self, window_s: float, max_keys: int, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._now = now
        self._lock = threading.Lock()
        self._answers: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._busy: set[str] = set()
        self.replayed = 0
        """Repeats answered from memory (nothing stored)."""

    def begin(self, key: str) -> Seen | None:
        """None: a new key, now being stored (end it with :meth:`finish` or :meth:`abandon`)."""
        with self._lock:
            self._expire()
            if key in self._answers:
                self.replayed += 1
                return Seen(self._answers[key][1])
            if key in self._busy:
                return Seen(None, busy=True)
            self._busy.add(key)
            return None

    def finish(self, key: str, answer: dict[str, Any]) -> None:
        """The key's records were stored: remember ``answer`` for the window."""
        with self._lock:
            self._busy.discard(key)
            self._answers[key] = (self._now(), answer)
            self._answers.move_to_end(key)
            while len(self._answers) > self.max_keys:
                self._answers.popitem(last=False)

    def abandon(self, key: str) -> None:
        """The key's request was refused before storing: a retry may store it."""
        with self._lock:
            self._busy.discard(key)

    def remember_position(self, position: str | None) -> bool:
        """Remember the key of a position :func:`position_of` made (the driver's last)."""
        parsed = stored_of_position(position)
        if parsed is None:
            return False
        key, stored = parsed
        self.finish(key, {"stored": stored})
        return True

    def _expire(self) -> None:
        horizon = self._now() - self.window_s
        while self._answers:
            key, (at, _) = next(iter(self._answers.items()))
            if at >= horizon:
                return
            del self._answers[key]


def position_of(key: str, stored: int) -> str:
    """The source position of a request's store: its key and how many records it had."""
    return json.dumps({"idempotency_key": key, "stored": stored}, separators=(",", ":"))


def stored_of_position(position: str | None) -> tuple[str, int] | None:
    """``(key, stored)`` of a position :func:`position_of` made; None for anything else."""
    if position is None:
        return None
    try:
        raw = json.loads(position)
        return str(raw["idempotency_key"]), int(raw["stored"])
    except (ValueError, KeyError, TypeError):
        return None

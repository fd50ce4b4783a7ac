r"""The lines of the local line server: fixed-size, numbered, made once and reused.

Every line is exactly :data:`LINE_BYTES` (100) bytes::

    0000012345 kqz bwoe aplmxvt ... yfa\n

a 10-digit zero-padded sequence number, then words, then ``\n``. The words are drawn
from a seeded vocabulary of 1,000 words of 2-9 lowercase letters (the benchmarks' load),
or from the words given (the demo's: :data:`LINE_WORDS`).

Speed: lines are never formatted one by one. A :class:`LinePool` of 1,000-line blocks is
built once; the last three digits of the sequence number are fixed by the line's position
in its block, and the seven leading digits are written into a block with seven strided
``bytearray`` slice assignments when the block comes up. Sending is then a ``send`` of a
slice of a block (``line_source.py``).
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from spark_receivers.errors import ConfigError

__all__ = [
    "BLOCK_LINES",
    "LINE_BYTES",
    "LINE_WORDS",
    "SEQ_DIGITS",
    "VOCABULARY",
    "LinePool",
    "parse_seq",
]

VOCABULARY = [
    "spark",
    "stream",
    "receiver",
    "block",
    "batch",
    "driver",
    "executor",
    "record",
    "python",
    "arrow",
    "flight",
    "window",
    "state",
    "delay",
    "rate",
    "limit",
    "tracker",
    "supervisor",
    "generator",
    "buffer",
    "queue",
    "write",
    "ahead",
    "log",
    "replay",
    "offset",
    "commit",
    "source",
    "sink",
    "table",
    "frame",
    "column",
    "value",
    "schema",
    "cluster",
    "task",
    "job",
    "stage",
    "shuffle",
    "partition",
    "memory",
    "disk",
    "network",
    "socket",
    "packet",
    "latency",
    "throughput",
]

LINE_WORDS = (*VOCABULARY, "io", "ok")
"""The demo's words: :data:`VOCABULARY` and two of two letters (a line's last word may
need to be that short to end the line at exactly :data:`LINE_BYTES`)."""

LINE_BYTES = 100
SEQ_DIGITS = 10
BLOCK_LINES = 1000
_SUFFIX_DIGITS = 3  # log10(BLOCK_LINES): fixed per position inside a block
_PREFIX_DIGITS = SEQ_DIGITS - _SUFFIX_DIGITS
_MAX_BLOCKS = 10**_PREFIX_DIGITS
_MIN_WORD, _MAX_WORD = 2, 9


def parse_seq(line: bytes | str) -> int:
    """The sequence number at the start of a line produced by :class:`LinePool`."""
    return int(line[:SEQ_DIGITS])


class LinePool:
    """Pre-built blocks of :data:`BLOCK_LINES` lines; hands out the block for any sequence range.

    ``words``: the words lines are made of (those of 2-9 letters, every length among
    them); by default ``vocab_size`` words of random letters, seeded.
    Not thread-safe: one sender thread owns a pool. A view returned by :meth:`block` is valid
    until the same template is handed out again (``pool_blocks`` blocks later), so send it
    before asking for that many further blocks.
    """

    def __init__(
        self,
        *,
        vocab_size: int = 1000,
        seed: int = 0,
        pool_blocks: int = 16,
        words: Sequence[str] | None = None,
    ) -> None:
        if vocab_size < _MAX_WORD - _MIN_WORD + 1:
            msg = f"vocab_size must be >= {_MAX_WORD - _MIN_WORD + 1}, got {vocab_size}"
            raise ConfigError(msg)
        if pool_blocks < 1:
            msg = f"pool_blocks must be >= 1, got {pool_blocks}"
            raise ConfigError(msg)
        rng = random.Random(seed)
        if words is None:
            self.vocabulary: tuple[str, ...] = _vocabulary(rng, vocab_size)
        else:
            self.vocabulary = tuple(w for w in words if _MIN_WORD <= len(w) <= _MAX_WORD)
            lengths = {len(w) for w in self.vocabulary}
            missing = sorted(set(range(_MIN_WORD, _MAX_WORD + 1)) - lengths)
            if missing:
                msg = f"words need a word of each length {_MIN_WORD}-{_MAX_WORD}, none of {missing}"
                raise ConfigError(msg)
        self._templates = [_template(rng, self.vocabulary) for _ in range(pool_blocks)]
        self._template_block = [-1] * pool_blocks
        self._digit_runs = {d: bytes([d]) * BLOCK_LINES for d in b"0123456789"}

    def block(self, index: int) -> memoryview:
        """The ``BLOCK_LINES * LINE_BYTES`` bytes of lines ``index*1000 .. index*1000+999``."""
        if not 0 <= index < _MAX_BLOCKS:
            msg = f"block index must be in [0, {_MAX_BLOCKS}), got {index}"
            raise ConfigError(msg)
        slot = index % len(self._templates)
        buf = self._templates[slot]
        if self._template_block[slot] != index:
            for pos, digit in enumerate(b"%0*d" % (_PREFIX_DIGITS, index)):
                buf[pos::LINE_BYTES] = self._digit_runs[digit]
            self._template_block[slot] = index
        return memoryview(buf)

    def line(self, seq: int) -> bytes:
        """One line, for tests and examples (slow path)."""
        index, pos = divmod(seq, BLOCK_LINES)
        return bytes(self.block(index)[pos * LINE_BYTES : (pos + 1) * LINE_BYTES])


def _vocabulary(rng: random.Random, size: int) -> tuple[str, ...]:
    words: set[str] = set()
    out: list[str] = []
    span = _MAX_WORD - _MIN_WORD + 1
    while len(out) < size:
        # Lengths round-robin so every length has words: the body filler relies on it.
        length = _MIN_WORD + len(out) % span
        word = "".join(rng.choices(string.ascii_lowercase, k=length))
        if word not in words:
            words.add(word)
            out.append(word)
    return tuple(out)


def _template(rng: random.Random, vocabulary: tuple[str, ...]) -> bytearray:
    by_len: dict[int, list[str]] = {}
    for w in vocabulary:
        by_len.setdefault(len(w), []).append(w)
    fits = {n: [w for w in vocabulary if len(w) <= n] for n in range(_MIN_WORD, _MAX_WORD + 1)}
    buf = bytearray()
    for pos in range(BLOCK_LINES):
        # Each word costs 1 + len bytes (its leading space). Leave >= 3 bytes so a final word
        # of exactly the remaining length (2..9 letters) closes the line at LINE_BYTES.
        remaining = LINE_BYTES - 1 - SEQ_DIGITS
        parts = []
        while remaining > 1 + _MAX_WORD:
            word = rng.choice(fits[min(_MAX_WORD, remaining - 4)])
            parts.append(word)
            remaining -= 1 + len(word)
        parts.append(rng.choice(by_len[remaining - 1]))
        line = (
            "0" * _PREFIX_DIGITS + f"{pos:0{_SUFFIX_DIGITS}d} " + " ".join(parts) + "\n"
        ).encode()
        assert len(line) == LINE_BYTES, line
        buf += line
    return buf

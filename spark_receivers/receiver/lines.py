r"""Lines from the bytes a source gave, as one Arrow string array: no Python object per line.

The built-in line receivers (socket, file tail, HTTP ``lines``) read bytes in chunks and
store one record per line. :func:`split_lines` splits a chunk on ``\n`` and checks it with
Arrow's own kernels (split, length, a cast that validates UTF-8, a regex for a trailing
``\r``), so a million lines cost a few calls instead of a million ``str`` objects and their
conversion back to Arrow. It answers None when a line of the chunk is bad (not UTF-8, or
longer than the limit): the caller then goes line by line, where the bad-record policy sees
which line and where it was.

Executor side; plain functions, no state.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["split_lines"]


def split_lines(
    chunk: bytes | memoryview, max_record_bytes: int, has_cr: bool | None = None
) -> pa.Array | None:
    r"""The lines of ``chunk`` as an Arrow ``string`` array, split and checked in C.

    Each line loses its ``\n`` and one trailing ``\r``; ``n`` newlines make ``n + 1``
    lines (a chunk that ends with a newline ends with an empty line: drop it before).
    None when a line is longer than ``max_record_bytes`` (``\r`` counted) or not valid
    UTF-8: the caller then goes line by line. ``has_cr``: whether the chunk holds a
    ``\r`` (None: looked for; a caller holding a ``memoryview`` knows it cheaper). The
    array holds copies of the lines: it never points into ``chunk``, which the caller
    may overwrite once this returns.
    """
    raw = _one_value(chunk)
    try:
        # The whole chunk at once: a newline cannot sit inside a UTF-8 sequence, so the chunk
        # is valid exactly when each of its lines is, and one long run is checked faster than
        # thousands of short ones (split and check: 63-64 against 66-71 ns of CPU a line,
        # bench/results/probes-20261201/utf8_probe.log).
        whole = raw.cast(pa.large_string() if raw.type == pa.large_binary() else pa.string())
    except pa.ArrowInvalid:
        return None
    text = pc.split_pattern(whole, "\n").values
    if len(chunk) > max_record_bytes:
        longest = pc.max(pc.binary_length(text)).as_py()
        if longest > max_record_bytes:
            return None
    if text.type != pa.string():  # a chunk of 2 GiB or more
        text = text.cast(pa.string())
    if has_cr is None:
        has_cr = b"\r" in (bytes(chunk) if isinstance(chunk, memoryview) else chunk)
    if has_cr:
        text = pc.replace_substring_regex(text, "\r$", "", max_replacements=1)
    return text


_INT32_MAX = 2**31 - 1


def _one_value(chunk: bytes | memoryview) -> pa.Array:
    """``chunk`` as a binary array of one value over the chunk's own bytes (no copy).

    ``pa.array([chunk])`` copied every byte read once more (a fifth of the split's CPU).
    """
    if len(chunk) > _INT32_MAX:  # binary offsets are 32-bit
        return pa.array([bytes(chunk)], pa.large_binary())
    offsets = pa.py_buffer(struct.pack("=ii", 0, len(chunk)))
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(chunk)])

"""split_lines: a chunk of bytes into an Arrow string array, or None for a bad line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.receiver.lines import split_lines


@given(st.lists(st.text(alphabet="ab\r é中", max_size=8), min_size=1, max_size=20))
def test_arrow_split_matches_line_by_line_decoding(lines):
    chunk = "\n".join(lines).encode()
    split = split_lines(chunk, max_record_bytes=1 << 20)
    assert split is not None
    assert split.to_pylist() == [line.removesuffix("\r") for line in chunk.decode().split("\n")]


@pytest.mark.parametrize(
    ("chunk", "limit"),
    [
        (b"ok\nbad \xff\nok", 100),
        (b"short\n" + b"x" * 50 + b"\nshort", 10),
        (b"cut \xc3\n\xa9 on", 100),  # a sequence cut by a newline: both lines are bad
        (b"ok\nends cut \xe4\xb8", 100),
    ],
)
def test_arrow_split_leaves_bad_chunks_to_the_line_by_line_path(chunk, limit):
    assert split_lines(chunk, max_record_bytes=limit) is None


def test_a_line_of_exactly_the_limit_is_kept():
    split = split_lines(b"x" * 10 + b"\n" + b"y" * 3, max_record_bytes=10)
    assert split is not None
    assert split.to_pylist() == ["x" * 10, "yyy"]


def test_the_lines_are_copies_the_read_buffer_can_be_overwritten():
    """The socket receiver splits a view of the buffer its next reads overwrite."""
    buf = bytearray(b"first\r\nsecond\nthird")
    view = memoryview(buf)
    split = split_lines(view[: len(buf)], max_record_bytes=100, has_cr=True)
    buf[:] = b"X" * len(buf)
    assert split is not None
    assert split.to_pylist() == ["first", "second", "third"]


def test_a_view_without_has_cr_is_looked_at_for_a_carriage_return():
    split = split_lines(memoryview(b"a\r\nb"), max_record_bytes=100)
    assert split is not None
    assert split.to_pylist() == ["a", "b"]

"""An HTTP ``json`` body read by pyarrow.json stores exactly what the line-by-line rules store."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.receiver.schema import records_to_table
from spark_receivers.receivers.http_body import (
    BadRequestError,
    RecordTooLongError,
    _line_by_line,
    json_columns,
    parse_body,
)

SCHEMA = pa.schema(
    [
        pa.field("user", pa.string()),
        pa.field("clicks", pa.int64()),
        pa.field("score", pa.float64()),
        pa.field("ok", pa.bool_(), nullable=False),
    ]
)


def test_a_json_body_under_a_declared_schema_is_one_arrow_table():
    body = b'{"user": "ann", "clicks": 3, "score": 0.5, "ok": true}\n\n  \r\n{"ok": false}\r\n'
    table = parse_body(body, "json", SCHEMA, 1 << 20)
    assert isinstance(table, pa.Table) and table.schema.equals(SCHEMA)
    assert table.to_pylist() == [
        {"user": "ann", "clicks": 3, "score": 0.5, "ok": True},
        {"user": None, "clicks": None, "score": None, "ok": False},
    ]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"ok": true, "score": NaN}', "not valid JSON"),
        (b'{"ok": true, "score": -Infinity}', "not valid JSON"),
        (b'{"ok": true, "score": 1e999}', "not valid JSON"),
        (b'{"ok": true, "score": 9007199254740993}', "score"),  # not exactly a double
        (b'{"ok": true} {"ok": false}', "not valid JSON"),  # two objects on one line
        (b'{"ok": true,', "not valid JSON"),  # an object over two lines ...
        (b'"user": "x"}', "not valid JSON"),  # ... is two bad lines
        (b'{"user": "x"}', "ok"),  # a non-nullable field missing
        (b'{"ok": null}', "ok"),
        (b'{"ok": true, "extra": 1}', "extra"),
        (b'{"ok": true, "user": "\\ud800"}', "user"),  # a lone surrogate
        (b'{"ok": true, "clicks": "many"}', "clicks"),
        (b"[1]", "not an object"),
    ],
)
def test_what_arrow_would_bend_or_refuses_is_400_naming_the_line(line, why):
    body = b'{"ok": true}\n' + line + b"\n"
    with pytest.raises(BadRequestError, match=rf"^line 2\b.*{why}"):
        parse_body(body, "json", SCHEMA, 1 << 20)


def test_invalid_utf8_and_a_long_line_are_refused_naming_the_line():
    with pytest.raises(BadRequestError, match=r"^line 2 is not valid UTF-8"):
        parse_body(b'{"ok": true}\n{"ok": true, "user": "\xff"}\n', "json", SCHEMA, 1 << 20)
    long = b'{"ok": true, "user": "' + b"x" * 100 + b'"}'
    with pytest.raises(RecordTooLongError, match=r"^line 2 is"):
        parse_body(b'{"ok": true}\n' + long + b"\n", "json", SCHEMA, 100)


def test_types_arrow_converts_more_loosely_go_line_by_line():
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("v", pa.string())])
    assert json_columns(b'{"ts": 5, "v": "a"}\n', schema, 1 << 20) is None
    with pytest.raises(BadRequestError, match=r"^line 1: field 'ts'"):
        parse_body(b'{"ts": "2024-01-01T00:00:00", "v": "a"}\n', "json", schema, 1 << 20)


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)
_objects = st.dictionaries(
    st.sampled_from(["user", "clicks", "score", "ok", "other"]), _values, max_size=5
).map(lambda d: json.dumps(d).encode())  # NaN and Infinity as Python writes them
_lines = st.one_of(
    _objects,
    _objects,
    st.tuples(_objects, _objects).map(lambda t: t[0] + b" " + t[1]),
    st.sampled_from([b"", b"  ", b"\r", b"{", b"}", b"[1]", b'"s"', b"{}", b'{"ok": true']),
)


@given(st.lists(_lines, max_size=8), st.booleans())
def test_arrow_stores_exactly_what_line_by_line_stores(lines, crlf):
    body = (b"\r\n" if crlf else b"\n").join(lines)
    try:
        expected = records_to_table(_line_by_line(body, "json", SCHEMA, 1 << 20), SCHEMA)
    except BadRequestError:
        expected = None
    table = json_columns(body, SCHEMA, 1 << 20)
    if table is not None:  # else the line-by-line path decides
        assert expected is not None, body
        assert table.to_pylist() == expected.to_pylist()

r"""What an ``HttpReceiver`` request body becomes: its records, or a 400 naming the bad line.

``format="lines"``: every line is a record (``\n`` and ``\r\n`` end a line; a
trailing newline adds no empty record). ``format="json"``: every non-blank line
must be one JSON value, strictly: ``NaN``, ``Infinity``, numbers out of a
double's range, integers longer than Python converts (4,300 digits) and
nesting deeper than Python's recursion limit are refused like any other
invalid JSON. Under the default schema the record is the line's JSON text;
under a declared schema, the decoded object, checked against the schema.
Either way a line longer than ``max_record_bytes`` is refused
(:class:`RecordTooLongError`, answered 413): nothing of the body is stored.

A ``json`` body under a declared schema of strings, integers, doubles and booleans is
read into the schema's columns by ``pyarrow.json`` in one call (:func:`json_columns`):
no Python object per record. Arrow's reader is looser than the rules above in a few
places (it takes ``NaN`` and ``Infinity``, rounds integers beyond 2**53 into doubles,
reads two objects on one line, a null into a non-nullable column); each such body, and
every body Arrow refuses, is gone through again line by line, which names the bad line
exactly as before. So Arrow only ever stores what the line-by-line rules store.
"""

from __future__ import annotations

import functools
import io
import json
import math
import sys
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.bad_records import too_long
from spark_receivers.receiver.lines import split_lines
from spark_receivers.receiver.schema import check_record, is_default

__all__ = ["FORMATS", "BadRequestError", "RecordTooLongError", "json_columns", "parse_body"]

FORMATS = ("lines", "json")


class BadRequestError(ReceiverError, ValueError):
    """A request body that cannot be stored; the message names the line."""

    status = 400
    """The HTTP status that answers it."""


class RecordTooLongError(BadRequestError):
    """A line of the body is longer than ``max_record_bytes``; the message names it."""

    status = 413


def parse_body(
    body: bytes, format: str, schema: pa.Schema, max_record_bytes: int | None = None
) -> list[Any] | pa.Array | pa.Table:
    """The records of ``body`` (see the module doc); :class:`BadRequestError` when malformed.

    A ``lines`` body under the default schema is one Arrow array, split and checked by
    Arrow's kernels (no Python object per line); a ``json`` body under a declared schema
    Arrow reads is one Arrow table (:func:`json_columns`). If a line is bad, or Arrow's
    reading is in doubt, the body is gone through again line by line for the error that
    names the line.
    """
    limit = sys.maxsize if max_record_bytes is None else max_record_bytes
    if format == "lines" and body and is_default(schema):
        data = body[:-1] if body.endswith(b"\n") else body
        lines = split_lines(data, limit)
        if lines is not None:
            return lines
    if format == "json" and body and not is_default(schema):
        table = json_columns(body, schema, limit)
        if table is not None:
            return table
    return _line_by_line(body, format, schema, max_record_bytes)


def _line_by_line(
    body: bytes, format: str, schema: pa.Schema, max_record_bytes: int | None
) -> list[Any]:
    """The records of ``body`` one line at a time; the error names the first bad line."""
    if max_record_bytes is not None and len(body) > max_record_bytes:
        _check_line_lengths(body, max_record_bytes)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        line = body.count(b"\n", 0, e.start) + 1
        msg = f"line {line} is not valid UTF-8 (byte {e.start})"
        raise BadRequestError(msg) from None
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if "\r" in text:
        lines = [line.removesuffix("\r") for line in lines]
    if format == "lines":
        return lines
    as_objects = not is_default(schema)
    records: list[Any] = []
    for number, text_line in enumerate(lines, 1):
        raw = text_line.strip()
        if not raw:
            continue
        value = _loads(raw, number)
        if not as_objects:
            records.append(raw)
            continue
        if not isinstance(value, dict):
            msg = (
                f"line {number} is a JSON {type(value).__name__}, not an object with "
                f"the fields {schema.names}"
            )
            raise BadRequestError(msg)
        try:
            check_record(value, schema)
        except ReceiverError as e:
            msg = f"line {number}: {e}"
            raise BadRequestError(msg) from None
        records.append(value)
    return records


_ARROW_JSON_TYPES = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_signed_integer,
    pa.types.is_float64,
    pa.types.is_boolean,
)
"""The column types :func:`json_columns` reads: those where Arrow's JSON conversion takes
exactly the values ``check_record`` takes (or fewer: then the line-by-line path decides)."""


def json_columns(body: bytes, schema: pa.Schema, max_record_bytes: int) -> pa.Table | None:
    """The JSON lines of ``body`` as a table of ``schema``, read by ``pyarrow.json`` at once.

    None when the line-by-line path must decide: a column of another type (timestamps,
    nested types: Arrow converts some values the line-by-line rules refuse), Arrow
    refuses the body, or its reading could differ from those rules. The checks, all
    vectorized: the body is UTF-8; no line is longer than ``max_record_bytes``; every
    non-blank line starts with ``{`` and ends with ``}`` (so no object spans lines) and
    the reader made exactly one row of each (so no line holds two); no ``NaN``/``Inf``
    token (Arrow takes them) and no integer of 16 digits or more (Arrow rounds it into
    a double; Python refuses one beyond 2**53) when a column is a double; no null in a
    non-nullable column. Blank lines are skipped, as line by line.
    """
    if not all(any(is_type(f.type) for is_type in _ARROW_JSON_TYPES) for f in schema):
        return None
    lines = pc.split_pattern(pa.array([body], pa.binary()), b"\n").values
    if len(body) > max_record_bytes:
        longest = pc.max(pc.binary_length(lines)).as_py()
        if longest > max_record_bytes:
            return None  # 413, naming the line
    try:
        text = lines.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return None
    trimmed = pc.utf8_trim_whitespace(text)
    objects = trimmed.filter(pc.greater(pc.utf8_length(trimmed), 0))
    if len(objects) == 0:
        return pa.Table.from_pylist([], schema=schema)
    whole = pc.and_(pc.starts_with(objects, "{"), pc.ends_with(objects, "}"))
    if not pc.all(whole).as_py():
        return None
    doubles = any(pa.types.is_float64(f.type) for f in schema)
    if doubles and pc.any(pc.match_substring_regex(objects, r"NaN|Inf|\d{16}")).as_py():
        return None
    options = pa_json.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="error", newlines_in_values=False
    )
    try:
        table = pa_json.read_json(
            io.BytesIO(body),
            read_options=pa_json.ReadOptions(
                use_threads=False, block_size=min(max(len(body), 1 << 20), 1 << 30)
            ),
            parse_options=options,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != len(objects):
        return None
    table = table.select(schema.names)
    for field, column in zip(schema, table.columns, strict=True):
        if not field.nullable and column.null_count:
            return None
    return table.cast(schema).combine_chunks()


def _check_line_lengths(body: bytes, limit: int) -> None:
    """Raise :class:`RecordTooLongError` naming the first line longer than ``limit`` bytes."""
    start = 0
    number = 1
    while start <= len(body):
        end = body.find(b"\n", start)
        if end < 0:
            end = len(body)
        length = end - start - (1 if end > start and body[end - 1 : end] == b"\r" else 0)
        if length > limit:
            msg = f"line {number} is {too_long(length, limit)}"
            raise RecordTooLongError(msg)
        start = end + 1
        number += 1


def _loads(raw: str, number: int) -> Any:
    try:
        return _decoder().decode(raw)
    except json.JSONDecodeError as e:
        msg = f"line {number} is not valid JSON: {e.msg} at column {e.colno}"
        raise BadRequestError(msg) from None
    except ValueError as e:  # NaN, Infinity, 1e999, an integer of 5,000 digits
        why = str(e).split("; use sys.set_int_max_str_digits")[0]  # a hint for servers only
        msg = f"line {number} is not valid JSON: {why}"
        raise BadRequestError(msg) from None
    except RecursionError:
        msg = f"line {number} is not valid JSON: nested too deeply"
        raise BadRequestError(msg) from None


def _no_constant(name: str) -> NoReturn:
    msg = f"{name} is not a JSON number"
    raise ValueError(msg)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        msg = f"{text[:20]} is out of range for a JSON number"
        raise ValueError(msg)
    return value


@functools.cache
def _decoder() -> json.JSONDecoder:
    """The strict decoder, made once (``json.loads`` with hooks makes one per call)."""
    return json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)

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
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, NoReturn

import pyarrow as pa

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.bad_records import too_long
from spark_receivers.receiver.lines import split_lines
from spark_receivers.receiver.schema import check_record, is_default

__all__ = ["FORMATS", "BadRequestError", "RecordTooLongError", "parse_body"]

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
) -> list[Any] | pa.Array:
    """The records of ``body`` (see the module doc); :class:`BadRequestError` when malformed.

    A ``lines`` body under the default schema is one Arrow array, split and checked by
    Arrow's kernels (no Python object per line); if a line is bad, the body is gone
    through again line by line for the error that names it.
    """
    if format == "lines" and body and is_default(schema):
        data = body[:-1] if body.endswith(b"\n") else body
        lines = split_lines(data, sys.maxsize if max_record_bytes is None else max_record_bytes)
        if lines is not None:
            return lines
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
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
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

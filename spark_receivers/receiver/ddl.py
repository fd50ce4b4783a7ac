"""Spark DDL schema strings (``"ts timestamp, v string"``) parsed without a SparkSession.

PySpark parses DDL in the JVM (``StructType.fromDDL`` needs an active session),
but a receiver is built before any session may exist, and its schema must be
checked there, on the driver, not on an executor. :func:`parse_ddl` is a small
recursive-descent parser of the DDL Spark accepts for a table schema, giving
the same :class:`~pyspark.sql.types.StructType` as ``StructType.fromDDL`` (a
test compares the two on Spark):

* fields ``name type [NOT NULL] [COMMENT 'text']`` separated by commas, or
  Python's legacy ``name: type``; the whole list may be written
  ``struct<...>``; names may be quoted with backticks (```` `a b` ````);
* types, case-insensitive: ``boolean``, ``tinyint``/``byte``,
  ``smallint``/``short``, ``int``/``integer``, ``bigint``/``long``,
  ``float``/``real``, ``double``, ``decimal``/``dec``/``numeric`` ``[(p[, s])]``,
  ``string``, ``char(n)``/``character(n)``, ``varchar(n)``, ``binary``,
  ``date``, ``timestamp`` (Spark's default ``TIMESTAMP_LTZ``),
  ``timestamp_ltz``, ``timestamp_ntz``, ``void``, ``array<T>``,
  ``map<K, V>``, ``struct<name[:] T [NOT NULL] [COMMENT '...'], ...>``.

Interval, time, variant and collated string types are refused with a message
saying so (pass a ``StructType`` or a ``pyarrow.Schema`` for those).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructField, StructType

__all__ = ["parse_ddl"]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<ident>[A-Za-z0-9_]+)
      | `(?P<quoted>(?:[^`]|``)*)`
      | '(?P<single>(?:[^'\\]|\\.)*)'
      | "(?P<double>(?:[^"\\]|\\.)*)"
      | (?P<punct><>|[<>(),:])
    )""",
    re.VERBOSE | re.DOTALL,
)
_UNSUPPORTED = ("interval", "time", "variant", "geometry", "geography", "object")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "b": "\b", "Z": "\x1a"}


class _Token:
    __slots__ = ("kind", "pos", "text")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind, self.text, self.pos = kind, text, pos

    def is_word(self, *words: str) -> bool:
        return self.kind == "ident" and self.text.lower() in words


def _tokens(ddl: str, what: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    end = len(ddl.rstrip())
    while pos < end:
        match = _TOKEN.match(ddl, pos)
        if match is None or match.end() == pos:
            start = pos + len(ddl[pos:]) - len(ddl[pos:].lstrip())
            _fail(what, ddl, start, f"unexpected character {ddl[start]!r}")
        assert match is not None
        kind = match.lastgroup or ""
        text, start = match.group(kind), match.start(kind)
        if kind == "quoted":
            kind, text = "name", text.replace("``", "`")
        elif kind in ("single", "double"):
            kind, text = "string", re.sub(r"\\(.)", lambda e: _ESCAPES.get(e[1], e[1]), text)
        out.append(_Token(kind, text, start))
        pos = match.end()
    return out


def _fail(what: str, ddl: str, pos: int, problem: str) -> None:
    msg = (
        f"{what}: {ddl!r} is not a valid DDL schema: {problem} at position {pos}; "
        "write it as Spark's DDL, e.g. 'ts timestamp, key string, value double'"
    )
    raise ConfigError(msg)


class _Parser:
    def __init__(self, ddl: str, what: str) -> None:
        from pyspark.sql import types as t

        self.t = t
        self.ddl = ddl
        self.what = what
        self.tokens = _tokens(ddl, what)
        self.i = 0

    # --- the token stream --------------------------------------------------------

    def peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def fail(self, problem: str) -> None:
        token = self.peek()
        pos = token.pos if token is not None else len(self.ddl.rstrip())
        if problem.startswith("expected"):
            problem += f", found {token.text!r}" if token is not None else ", found the end"
        _fail(self.what, self.ddl, pos, problem)

    def take(self, punct: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "punct" and token.text == punct:
            self.i += 1
            return True
        return False

    def expect(self, punct: str) -> None:
        if not self.take(punct):
            self.fail(f"expected {punct!r}")

    def word(self, *words: str) -> bool:
        token = self.peek()
        if token is not None and token.is_word(*words):
            self.i += 1
            return True
        return False

    def integer(self) -> int:
        token = self.peek()
        if token is None or token.kind != "ident" or not token.text.isdigit():
            self.fail("expected an integer")
        assert token is not None
        self.i += 1
        return int(token.text)

    # --- the grammar -------------------------------------------------------------

    def schema(self) -> StructType:
        first = self.peek()
        if first is None:
            self.fail("expected a field")
        assert first is not None
        nxt = self.tokens[self.i + 1] if self.i + 1 < len(self.tokens) else None
        if first.is_word("struct") and nxt is not None and nxt.text in ("<", "<>"):
            self.i += 1
            struct = self.struct_body()
        else:
            struct = self.t.StructType(self.fields())
        if self.peek() is not None:
            self.fail("expected ',' or the end of the schema")
        if not struct.fields:
            _fail(self.what, self.ddl, 0, "a receiver schema needs at least one field")
        return struct

    def fields(self) -> list[StructField]:
        out = [self.field()]
        while self.take(","):
            out.append(self.field())
        return out

    def field(self) -> StructField:
        token = self.peek()
        if token is None or token.kind not in ("ident", "name") or token.text.isdigit():
            self.fail("expected a field name")
        assert token is not None
        self.i += 1
        self.take(":")
        if self.peek() is None:
            if token.kind == "ident" and self.i == 1:
                self.i = 0
                self.fail(f"a field needs a name and a type (write 'value {token.text}')")
            self.fail(f"expected a type for field {token.text!r}")
        data_type = self.data_type()
        nullable = True
        metadata: dict[str, Any] = {}
        while True:
            if self.word("not"):
                if not self.word("null"):
                    self.fail("expected NULL after NOT")
                nullable = False
            elif self.word("comment"):
                comment = self.peek()
                if comment is None or comment.kind != "string":
                    self.fail("expected a quoted comment after COMMENT")
                assert comment is not None
                self.i += 1
                metadata["comment"] = comment.text
            else:
                break
        return self.t.StructField(token.text, data_type, nullable, metadata or None)

    def struct_body(self) -> StructType:
        if self.take("<>"):
            return self.t.StructType([])
        self.expect("<")
        if self.take(">"):
            return self.t.StructType([])
        fields = self.fields()
        self.expect(">")
        return self.t.StructType(fields)

    def data_type(self) -> DataType:
        t = self.t
        token = self.peek()
        if token is None or token.kind != "ident" or token.text.isdigit():
            self.fail("expected a type")
        assert token is not None
        name = token.text.lower()
        self.i += 1
        simple: dict[str, Any] = {
            "boolean": t.BooleanType,
            "tinyint": t.ByteType,
            "byte": t.ByteType,
            "smallint": t.ShortType,
            "short": t.ShortType,
            "int": t.IntegerType,
            "integer": t.IntegerType,
            "bigint": t.LongType,
            "long": t.LongType,
            "float": t.FloatType,
            "real": t.FloatType,
            "double": t.DoubleType,
            "binary": t.BinaryType,
            "date": t.DateType,
            "timestamp": t.TimestampType,
            "timestamp_ltz": t.TimestampType,
            "timestamp_ntz": t.TimestampNTZType,
            "void": t.NullType,
        }
        if name in simple:
            return simple[name]()  # type: ignore[no-any-return]
        if name == "string":
            if self.peek() is not None and self.word("collate"):
                self.i -= 1
                self.fail("collated strings are not supported in a receiver schema")
            return t.StringType()
        if name in ("decimal", "dec", "numeric"):
            start = self.i - 1
            precision, scale = 10, 0
            if self.take("("):
                precision = self.integer()
                if self.take(","):
                    scale = self.integer()
                self.expect(")")
            if not 0 < precision <= 38 or not 0 <= scale <= precision:
                self.i = start
                self.fail(
                    f"decimal({precision}, {scale}) needs 1 <= precision <= 38 "
                    "and 0 <= scale <= precision"
                )
            return t.DecimalType(precision, scale)
        if name in ("char", "character", "varchar"):
            self.expect("(")
            length = self.integer()
            self.expect(")")
            return t.VarcharType(length) if name == "varchar" else t.CharType(length)
        if name == "array":
            self.expect("<")
            element = self.data_type()
            self.expect(">")
            return t.ArrayType(element, True)
        if name == "map":
            self.expect("<")
            key = self.data_type()
            self.expect(",")
            value = self.data_type()
            self.expect(">")
            return t.MapType(key, value, True)
        if name == "struct":
            return self.struct_body()
        self.i -= 1
        if name in _UNSUPPORTED:
            self.fail(f"type {token.text} is not supported in a DDL receiver schema")
        self.fail(f"unknown type {token.text!r}")
        raise AssertionError  # unreachable: fail() raises


def parse_ddl(ddl: str, what: str = "schema") -> StructType:
    """The :class:`~pyspark.sql.types.StructType` of a DDL schema string (no Spark needed).

    Raises :class:`ConfigError` starting with ``what`` and naming the position
    and what was expected. Pure Python, any thread.
    """
    return _Parser(ddl, what).schema()

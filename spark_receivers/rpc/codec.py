"""The wire codec of the messages: JSON with a fixed schema per message dataclass.

:func:`decode` checks the message type is one the endpoint accepts, that every
field is present with the declared type and that the size is within
``max_message_bytes``. Nothing received is ever unpickled or evaluated. The
message classes themselves are in :mod:`spark_receivers.rpc.messages`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union

from spark_receivers.errors import RpcError

__all__ = ["decode", "encode", "json_reply", "json_unreply"]

T = TypeVar("T")


def encode(message: Any) -> bytes:
    """Encode a message dataclass as JSON bytes."""
    return json.dumps(dataclasses.asdict(message), separators=(",", ":")).encode()


def decode(kind: str, body: bytes, allowed: tuple[type, ...], max_bytes: int) -> Any:
    """Decode ``body`` as the message named ``kind`` among ``allowed``.

    Raises :class:`RpcError` naming what was wrong: an unknown type, an oversized
    body, invalid JSON, a missing, unknown or mistyped field.
    """
    if len(body) > max_bytes:
        msg = f"{kind} message of {len(body)} bytes exceeds max_message_bytes={max_bytes}"
        raise RpcError(msg)
    cls = next((c for c in allowed if c.__name__ == kind), None)
    if cls is None:
        names = ", ".join(c.__name__ for c in allowed)
        msg = f"unknown message type {kind[:80]!r}; this endpoint accepts {names}"
        raise RpcError(msg)
    try:
        raw = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        msg = f"{kind} body is not valid JSON: {e}"
        raise RpcError(msg) from None
    return _build(cls, raw, kind)


def _build(cls: type[T], raw: Any, where: str) -> T:
    if not isinstance(raw, dict):
        msg = f"{where} must be a JSON object, got {type(raw).__name__}"
        raise RpcError(msg)
    checks, required = _shape(cls)
    if not raw.keys() <= checks.keys():
        unknown = set(raw) - set(checks)
        msg = f"{where} has unknown field(s) {sorted(unknown)[:5]}"
        raise RpcError(msg)
    values = {}
    for name, check in checks.items():  # in field order: the first problem is reported
        if name in raw:
            values[name] = check(raw[name], where, name)
        elif name in required:
            msg = f"{where} is missing field {name!r}"
            raise RpcError(msg)
    return cls(**values)


Check = Callable[[Any, str, str], Any]
"""Checks (and converts) one field's JSON value: ``check(value, where, field_name)``."""
_SHAPES: dict[type, tuple[dict[str, Check], frozenset[str]]] = {}


def _shape(cls: type) -> tuple[dict[str, Check], frozenset[str]]:
    """A message class's field checks (by name, in field order) and its required fields.

    Built once per class: resolving type hints is slow, and a check made for its type is
    several times cheaper per message than walking the type on every decode (the tracker
    decodes thousands of block infos a second).
    """
    shape = _SHAPES.get(cls)
    if shape is None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        checks = {f.name: _compile(hints[f.name]) for f in fields}
        required = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        shape = _SHAPES[cls] = (checks, required)
    return shape


_SCALAR_CHECKS: dict[Any, Callable[[Any], bool]] = {
    int: lambda v: type(v) is int or (isinstance(v, int) and not isinstance(v, bool)),
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    str: lambda v: type(v) is str,
    bool: lambda v: isinstance(v, bool),
}


def _compile(tp: Any) -> Check:
    """The check of a field typed ``tp`` (see :data:`Check`)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        inner = _compile(next(a for a in args if a is not type(None)))
        if type(None) not in args:
            return inner
        return lambda v, where, name: None if v is None else inner(v, where, name)
    if dataclasses.is_dataclass(tp):
        return lambda v, where, name: _build(tp, v, f"{where}.{name}")  # type: ignore[arg-type]
    if origin is tuple:
        item = _compile(typing.get_args(tp)[0])

        def check_tuple(v: Any, where: str, name: str) -> tuple[Any, ...]:
            if not isinstance(v, list):
                msg = f"{where}.{name} must be a list, got {type(v).__name__}"
                raise RpcError(msg)
            return tuple(item(x, f"{where}.{name}", "[]") for x in v)

        return check_tuple
    if origin is dict:

        def check_dict(v: Any, where: str, name: str) -> Any:
            if not isinstance(v, dict):
                msg = f"{where}.{name} must be an object, got {type(v).__name__}"
                raise RpcError(msg)
            return v

        return check_dict
    ok = _SCALAR_CHECKS.get(tp)
    type_name = getattr(tp, "__name__", str(tp))

    def check_scalar(v: Any, where: str, name: str) -> Any:
        if ok is None or not ok(v):
            msg = f"{where}.{name} must be {type_name}, got {v!r:.60}"
            raise RpcError(msg)
        return float(v) if tp is float else v

    return check_scalar


def json_reply(value: Any) -> bytes:
    """Encode a handler's reply (None, bool, number, str, list or dict) as JSON."""
    return json.dumps(value, separators=(",", ":")).encode()


def json_unreply(body: bytes) -> Any:
    """Decode a reply encoded by :func:`json_reply`."""
    return json.loads(body.decode("utf-8"))

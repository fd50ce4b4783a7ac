"""The reduce by key behind reduce_by_key_and_window, against a reduce one pair at a time."""

from __future__ import annotations

import math
import operator
import random

import pandas as pd
import pyarrow as pa
import pytest

from spark_receivers.stream.keyed_reduce import combine, partials_of_partition, reduce_by_key


def one_pair_at_a_time(fn, keys, values) -> dict:
    out: dict = {}
    for k, v in zip(keys, values, strict=True):
        out[k] = fn(out[k], v) if k in out else v
    return out


def as_dict(series: pd.Series) -> dict:
    # pandas gives a null key back as NaN; the reference keeps None.
    def key(k):
        return None if k is None or (isinstance(k, float) and math.isnan(k)) else k

    return {key(k): v for k, v in series.items()}


def scalar_max(a, b):
    return a if a > b else b  # raises on Series: "truth value ... is ambiguous"


def joined(a, b):
    return f"{a}|{b}" if isinstance(a, str) else None  # not a Series for Series arguments


@pytest.mark.parametrize("fn", [operator.add, scalar_max, max, min])
def test_every_key_is_reduced_as_one_pair_at_a_time_would(fn):
    rng = random.Random(7)
    for _ in range(150):
        n = rng.randint(0, 80)
        keys = [rng.choice(["a", "b", "c", "d", None]) for _ in range(n)]
        values = [rng.randint(-9, 9) for _ in range(n)]
        got = reduce_by_key(fn, keys, values)
        assert as_dict(got) == one_pair_at_a_time(fn, keys, values), (keys, values)
        assert got.index.is_unique


def test_keys_come_out_in_order_of_first_appearance_and_a_key_with_many_values_is_summed():
    keys = ["x"] * 1000 + ["y", "z"] + ["x"] * 24
    got = reduce_by_key(operator.add, keys, list(range(len(keys))))
    assert got.index.to_list() == ["x", "y", "z"]
    assert got["x"] == sum(range(1000)) + sum(range(1002, 1026))


def test_a_function_that_is_not_vectorised_is_called_per_pair():
    a, b = pd.Series(["p", "q"], index=[5, 6]), pd.Series(["r", "s"], index=[0, 1])
    out = combine(joined, a, b)
    assert out.to_list() == ["p|r", "q|s"]
    assert out.index.to_list() == [5, 6]  # the left side's keys


def test_an_error_of_the_users_function_reaches_the_caller():
    def broken(a, b):
        raise ZeroDivisionError("the user's bug")

    with pytest.raises(ZeroDivisionError, match="the user's bug"):
        reduce_by_key(broken, ["k", "k"], [1, 2])


def test_a_partition_gives_one_row_per_key_with_its_arrow_types():
    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    batches = [
        pa.record_batch([pa.array(["a", "b", "a"]), pa.array([1, 1, 1])], schema=schema),
        pa.record_batch([pa.array([], pa.string()), pa.array([], pa.int64())], schema=schema),
        pa.record_batch([pa.array(["b", "c"]), pa.array([5, 2])], schema=schema),
    ]
    (out,) = list(partials_of_partition(operator.add, "word", "n")(iter(batches)))
    assert out.schema == schema
    assert dict(zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True)) == {
        "a": 2,
        "b": 6,
        "c": 2,
    }
    assert list(partials_of_partition(operator.add, "word", "n")(iter(batches[1:2]))) == []

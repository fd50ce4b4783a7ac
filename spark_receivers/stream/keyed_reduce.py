"""Values reduced by key with a user's two-argument function, a column at a time.

``reduce_by_key_and_window`` takes Spark's ``reduceByKey`` functions: ``fn(a, b)``,
associative and commutative. Calling it once per pair of values (or a pandas function
per key) costs a Python call per record; here the values of every key are combined in
rounds instead: each round pairs the 1st value of every key with its 2nd, the 3rd with
the 4th, ... and calls ``fn`` once on two aligned pandas Series. A key with ``n`` values
takes ``ceil(log2 n)`` rounds, so a batch of a million words over ten thousand keys is
about twenty calls of ``fn``.

A function written with operators (``operator.add``, ``lambda a, b: a + b``) works on
Series as on scalars. One that does not (``max``, ``a if a > b else b``) raises on
Series, or returns something that is not one Series of the same length: it is then
called pair by pair, as Spark would, and any error it raises there is the user's.

The same reduce runs in Spark's tasks (one partial result per partition, without a
shuffle: :func:`partials_of_partition`) and on the driver (the partials of all
partitions, and a window's state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

Reducer = Callable[[Any, Any], Any]


def combine(fn: Reducer, a: pd.Series, b: pd.Series) -> pd.Series:
    """``fn`` of two Series of the same length, pair by pair; the result keeps ``a``'s index."""
    import pandas as pd

    try:
        out = fn(a, b.set_axis(a.index))
    except Exception:  # noqa: BLE001 - a scalar-only function; the pairwise call says why
        out = None
    if isinstance(out, pd.Series) and len(out) == len(a):
        return out.set_axis(a.index)
    pairs = zip(a.tolist(), b.tolist(), strict=True)
    return pd.Series([fn(x, y) for x, y in pairs], index=a.index, dtype=object)


def reduce_by_key(fn: Reducer, keys: Any, values: Any) -> pd.Series:
    """The values of each key reduced with ``fn``: a Series indexed by key.

    ``keys`` and ``values`` are aligned sequences (Series, arrays, lists). A null key is
    a key of its own, as in Spark's ``groupBy``. Keys come out in order of first
    appearance.
    """
    import numpy as np
    import pandas as pd

    vals = pd.Series(values).reset_index(drop=True)
    codes, uniques = pd.factorize(pd.Series(keys), use_na_sentinel=False)
    if len(uniques) == len(vals):  # every key once: nothing to combine
        return vals.set_axis(pd.Index(uniques))
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    vals = vals.take(order).reset_index(drop=True)
    positions = np.arange(len(codes))
    starts = np.r_[True, codes[1:] != codes[:-1]] if len(codes) else np.zeros(0, bool)
    rank = positions - np.maximum.accumulate(np.where(starts, positions, 0))
    while len(vals) > len(uniques):
        even = np.flatnonzero(rank % 2 == 0)
        partner = even + 1
        paired = partner < len(rank)
        paired[paired] = rank[partner[paired]] == rank[even[paired]] + 1
        kept = vals.take(even).reset_index(drop=True)
        if paired.any():
            at = np.flatnonzero(paired)
            combined = combine(fn, kept.take(at), vals.take(partner[paired]))
            if combined.dtype != kept.dtype:
                kept = kept.astype(object)
            kept.iloc[at] = combined.to_numpy()
        vals, codes, rank = kept, codes[even], rank[even] // 2
    return vals.set_axis(pd.Index(uniques.take(codes)))


def partials_of_partition(
    fn: Reducer, key: str, value: str
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: one row per key of the partition, its values reduced.

    The partial results of the partitions are combined on the driver
    (:func:`reduce_by_key` again), so a slide costs one Spark stage and no shuffle.
    """

    def partials(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        read = [b for b in batches if b.num_rows]
        if not read:
            return
        table = pa.Table.from_batches(read)
        reduced = reduce_by_key(fn, table.column(key).to_pandas(), table.column(value).to_pandas())
        schema = table.schema
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(reduced.index.to_list(), type=schema.field(key).type),
                pa.array(reduced.to_list(), type=schema.field(value).type),
            ],
            schema=schema,
        )

    return partials

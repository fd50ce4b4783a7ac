"""The benchmarks' batch queries, written once: every system and section runs these.

Lines are the load generator's (``<10-digit sequence> word word ...``). The word count
replaces each line's sequence number with :data:`WORD_MARK` before it splits the words,
so the count of that mark is the batch's line count: one query gives the work (split,
explode, aggregate, collect) and the figure to check it by.

- ``ingest``: :func:`line_count`, one ``count()``;
- ``wordcount``: :func:`word_count`, ``explode(split)`` → ``groupBy`` → ``collect``;
- ``two_action``: :func:`two_action`, ``count()`` then the word count on the same batch;
- ``windowed``: the line count of each batch (the window is an output operation of its
  own, over :func:`words`; ``bench/receivers.py``).

Each query takes a DataFrame with a ``value`` string column and returns its line count.
DStream's RDD word count (``bench/peers.py``) is the same query in RDD operations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["QUERIES", "WORD_MARK", "batch_query", "line_count", "two_action", "word_count", "words"]

WORD_MARK = "#lines"
"""Replaces each line's sequence number: its count is the line count."""

Query = Callable[[Any], int]


def words() -> Any:
    """The words of ``value``, its first one (the sequence number) replaced by the mark."""
    from pyspark.sql import functions as F

    return F.concat(F.array(F.lit(WORD_MARK)), F.slice(F.split("value", " "), 2, 1000))


def word_count(df: Any) -> int:
    """The ladder's word count; returns the batch's line count."""
    from pyspark.sql import functions as F

    rows = df.select(F.explode(words()).alias("word")).groupBy("word").count().collect()
    return next((int(r["count"]) for r in rows if r["word"] == WORD_MARK), 0)


def line_count(df: Any) -> int:
    """The ``ingest`` pipeline: the batch's line count."""
    return int(df.count())


def two_action(df: Any) -> int:
    """The ladder's two-action pipeline: ``count()``, then the word count."""
    n = line_count(df)
    word_count(df)
    return n


QUERIES: dict[str, Query] = {
    "ingest": line_count,
    "wordcount": word_count,
    "two_action": two_action,
    "windowed": line_count,
}
"""Each pipeline's query on one batch, by the name ``--pipeline`` takes."""


def batch_query(pipeline: str) -> Query:
    """The query one batch of ``pipeline`` runs (see the module doc)."""
    return QUERIES[pipeline]

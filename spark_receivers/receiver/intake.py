"""The first stage of a receiver's pipe: what ``Receiver.store`` hands over, checked and metered.

The executor's pipe, one way (``receiver/pipe.py`` builds it, docs/architecture.md draws it)::

    Receiver.store → Intake → BlockGenerator → BlockWriter → BlockReporter → driver

A receiver reaches its pipe through its :class:`Intake` alone (the supervisor attaches it,
and is not on the way). :meth:`Intake.admit` takes whatever ``store`` was handed — one
record, many records, an Arrow/pandas block — tells which it is by the receiver's schema
(a tuple is one record of a multi-column schema, many records of the default one), checks
it and hands it to the :class:`~spark_receivers.receiver.block_generator.BlockGenerator`,
which cuts a block per interval. It is the generator's only caller, and the generator
is all it calls. A store that is ``reliable``, carries ``metadata`` or a source
``position`` is a block of its own: the intake converts it once and hands it to the
generator's ``add_own_block``, which names it, rate-limits it and has the
:class:`~spark_receivers.receiver.block_writer.BlockWriter` write it at once (waiting for
the driver's answer when ``reliable``).

One string record of the default schema is the hot path: :attr:`Intake.add_text` is the
generator's own ``add_data`` (a list append under a lock), lent to the receiver without a
wrapper: one more Python call per record would slow ``store(one)`` down, whose whole cost is
a few calls.

Threads: every method runs on the receiver's storing threads; ``update_rate`` on the block
server's (the driver's ``UpdateRateLimit``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from spark_receivers.receiver.block_generator import BlockGenerator
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.receiver.schema import (
    check_record,
    is_block_data,
    is_default,
    is_many,
    records_to_table,
    to_table,
)

__all__ = ["Intake"]


class Intake:
    """Records and blocks from ``Receiver.store`` into the pipe; see the module doc.

    Thread-safe.
    """

    def __init__(self, schema: pa.Schema, generator: BlockGenerator) -> None:
        self.schema = schema
        self._generator = generator
        self._default_schema = is_default(schema)
        self.add_text: Callable[[str], None] | None = (
            generator.add_data if self._default_schema else None
        )
        """``add_text(str)``: one record of the default schema (None for another schema)."""
        # pyarrow imports pandas on its first conversion of a Python list (~1 s under the
        # GIL): pay that here, not in the first block's write while the receiver stores.
        records_to_table([], schema)

    # --- what Receiver.store reaches ------------------------------------------------------

    def admit(
        self,
        data: Any,
        metadata: dict[str, Any] | None = None,
        reliable: bool = False,
        position: str | None = None,
    ) -> None:
        """What ``Receiver.store`` was handed (but its hot path): a block, many records or one.

        With ``reliable``, ``metadata`` or ``position`` it is a block of its own, stored
        (and, when ``reliable``, accepted by the driver) before this returns.
        """
        own = reliable or metadata is not None or position is not None
        if type(data) is str:
            self._one(data, own, metadata, reliable, position)
        elif is_block_data(data):
            self._block(to_table(data, self.schema), own, metadata, reliable, position)
        elif is_many(data, self.schema):
            self._records(
                data if isinstance(data, list) else list(data), own, metadata, reliable, position
            )
        else:
            self._one(data, own, metadata, reliable, position)

    def _one(
        self,
        record: Any,
        own: bool,
        metadata: dict[str, Any] | None,
        reliable: bool,
        position: str | None,
    ) -> None:
        if not (self._default_schema and type(record) is str):
            check_record(record, self.schema)
        if own:
            table = records_to_table([record], self.schema)
            self._generator.add_own_block(table, metadata, reliable, position)
        else:
            self._generator.add_data(record)

    def _records(
        self,
        records: list[Any],
        own: bool,
        metadata: dict[str, Any] | None,
        reliable: bool,
        position: str | None,
    ) -> None:
        if not records:
            return
        if self._default_schema:
            table = records_to_table(records, self.schema)  # converting is the type check
        else:
            for r in records:
                check_record(r, self.schema)
            if not own:
                self._generator.add_many(records)
                return
            table = records_to_table(records, self.schema)
        self._block(table, own, metadata, reliable, position)

    def _block(
        self,
        table: pa.Table,
        own: bool,
        metadata: dict[str, Any] | None,
        reliable: bool,
        position: str | None,
    ) -> None:
        """Rows joined into the current block without copying, or a block of their own."""
        if table.num_rows == 0:
            return
        if own:
            self._generator.add_own_block(table, metadata, reliable, position)
        else:
            self._generator.add_table(table)

    # --- the driver and the metrics ---------------------------------------------------------

    @property
    def rate_limiter(self) -> RateLimiter:
        """The pipe's rate limiter (the generator's): what a receiver may read of it."""
        return self._generator.rate_limiter

    def update_rate(self, rate: float) -> None:
        """The driver's new rate limit (``UpdateRateLimit``); see ``BlockGenerator.update_rate``."""
        self._generator.update_rate(rate)

    @property
    def waited_for_room_s(self) -> float:
        """Seconds stores were held because the generator's push queue was full, in all."""
        return self._generator.waited_for_room_s

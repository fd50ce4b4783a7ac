"""A block: what a :class:`~spark_receivers.receiver.block_generator.BlockGenerator` cut."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_receivers.rpc.messages import StreamBlockId

__all__ = ["Block"]


@dataclass(frozen=True)
class Block:
    """What was cut from a generator's buffer, in the order it was added.

    ``parts`` holds lists of records (added with ``add_data``/``add_many``) and
    Arrow tables (added with ``add_table``).
    """

    block_id: StreamBlockId
    parts: tuple[list[Any] | pa.Table, ...]
    generated_ms: int

    @property
    def records(self) -> list[Any]:
        """Every record as a Python value (tables as dicts of their rows)."""
        out: list[Any] = []
        for part in self.parts:
            out.extend(part.to_pylist() if isinstance(part, pa.Table) else part)
        return out

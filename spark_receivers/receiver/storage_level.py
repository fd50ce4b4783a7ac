"""Where a receiver's blocks are kept: memory or disk, and on how many executors.

Spark's receivers default to ``MEMORY_AND_DISK_SER_2``: every block is in the
executor's block manager (memory, spilling to disk) and copied to a second
executor before the driver hears of it. Ours are the same four levels without
the ``_SER`` (blocks are always serialized Arrow here, so ``_SER`` changes
nothing):

============================  ==============  ===========
level                         spills to disk  copies
============================  ==============  ===========
``MEMORY_ONLY``               no              1
``MEMORY_ONLY_2``             no              2
``MEMORY_AND_DISK``           yes             1
``MEMORY_AND_DISK_2``         yes             2 (default)
============================  ==============  ===========

:meth:`StorageLevel.of` also takes a level's name (``"MEMORY_AND_DISK_SER_2"``
included) or PySpark's ``pyspark.StorageLevel`` objects, mapped by their flags.
"""

from __future__ import annotations

import enum
from typing import Any

from spark_receivers.errors import ConfigError

__all__ = ["StorageLevel"]


class StorageLevel(enum.Enum):
    """Where a receiver's blocks are kept (see the module doc)."""

    MEMORY_ONLY = "memory_only"
    MEMORY_ONLY_2 = "memory_only_2"
    MEMORY_AND_DISK = "memory_and_disk"
    MEMORY_AND_DISK_2 = "memory_and_disk_2"

    @property
    def use_disk(self) -> bool:
        """True when blocks over the memory budget spill to local disk."""
        return self in (StorageLevel.MEMORY_AND_DISK, StorageLevel.MEMORY_AND_DISK_2)

    @property
    def replication(self) -> int:
        """On how many executors each block is kept."""
        return 2 if self.name.endswith("_2") else 1

    def with_replication(self, replication: int) -> StorageLevel:
        """The same level with ``replication`` copies (1 or 2)."""
        base = "MEMORY_AND_DISK" if self.use_disk else "MEMORY_ONLY"
        return StorageLevel[base if replication <= 1 else f"{base}_2"]

    @classmethod
    def of(cls, level: Any, where: str = "storage_level") -> StorageLevel:
        """``level`` as one of ours: ours, a name, or a PySpark ``StorageLevel``.

        Raises :class:`ConfigError` naming ``where`` and the levels accepted for
        anything else (``DISK_ONLY`` and ``OFF_HEAP`` included: blocks are served
        from memory, spilling to disk only when over the budget).
        """
        if isinstance(level, StorageLevel):
            return level
        if isinstance(level, str):
            name = level.strip().upper().replace("_SER", "")
            if name in cls.__members__:
                return cls[name]
        elif _is_pyspark_level(level) and _memory_level(level):
            base = "MEMORY_AND_DISK" if level.useDisk else "MEMORY_ONLY"
            return cls[base if level.replication == 1 else f"{base}_2"]
        accepted = ", ".join(cls.__members__)
        msg = (
            f"{where} must be one of {accepted} (a name, spark_receivers.StorageLevel or "
            f"pyspark's StorageLevel with those flags; _SER variants are the same here), "
            f"got {level!r}"
        )
        raise ConfigError(msg)


def _memory_level(level: Any) -> bool:
    return bool(level.useMemory) and not level.useOffHeap and level.replication in (1, 2)


def _is_pyspark_level(value: Any) -> bool:
    return all(
        hasattr(value, flag) for flag in ("useDisk", "useMemory", "useOffHeap", "replication")
    )

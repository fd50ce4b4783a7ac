"""Typing checks of the public API, run by ``make lint`` (mypy --warn-unused-ignores).

Each ``# type: ignore[...]`` below marks a line mypy must refuse: if it ever
accepted it, the ignore would be unused and ``make lint`` would fail.
"""

from typing import assert_type

from spark_receivers import StreamingConfig

good = StreamingConfig(block_interval_ms=100, receiver_max_rate=5000.0)
assert_type(good.block_interval_ms, int)
assert_type(good.receiver_wal_enabled, bool)

misspelled = StreamingConfig(blockInterval=5)  # type: ignore[call-arg]
wrong_type = StreamingConfig(block_interval_ms="5s")  # type: ignore[arg-type]
positional = StreamingConfig(200)  # type: ignore[call-arg, arg-type]

"""Fetching one block: from its receiver's block server (WAL fallback comes with the WAL)."""

from __future__ import annotations

import pyarrow as pa

from spark_receivers.errors import BlockNotFoundError, RpcError
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.rpc.transport import EndpointClient


def fetch_block(info: ReceivedBlockInfo, secret: str, timeout_s: float = 60.0) -> pa.Table:
    """Return a block's data; raise :class:`BlockNotFoundError` naming it when it is gone."""
    store_error: Exception | None = None
    if info.store_endpoint:
        client = EndpointClient(info.store_endpoint, secret, timeout_s=timeout_s)
        try:
            return client.read_table(info.block_id.encode())
        except RpcError as e:
            store_error = e
        finally:
            client.close()
    endpoint = info.store_endpoint
    where = f"its block store at {endpoint}" if endpoint else "no block store"
    msg = (
        f"block {info.block_id} of stream {info.stream_id} ({info.num_records} records) "
        f"could not be read: it is in {where} ({store_error}) and has no write-ahead log "
        "record; enable receiver_wal_enabled with a checkpoint_dir to survive receiver loss"
    )
    raise BlockNotFoundError(msg) from store_error

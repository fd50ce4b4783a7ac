"""Message encoding and validation: fixed schema, no code-executing decoding."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.errors import RpcError
from spark_receivers.rpc import codec
from spark_receivers.rpc import messages as m

MAX = 64 * 1024


def test_round_trip_of_every_message():
    info = m.ReceivedBlockInfo(
        3,
        "input-3-5-7",
        10,
        1234,
        "127.0.0.1:80",
        99,
        {"path": "x", "offset": 0, "length": 1},
        {"k": "v"},
    )
    samples = [
        m.RegisterReceiver(1, "SocketTextReceiver", "h", "driver", "h:1"),
        m.AddBlock(info),
        m.AddBlocks((info, info)),
        m.AddBlocks(()),
        m.ReportError(1, "oops", "trace"),
        m.DeregisterReceiver(1, "bye", ""),
        m.DescribeStream("GeneratorReceiver-0"),
        m.StreamOffsets(1),
        m.AllocateOffsets(1, 0, -1),
        m.GetOffsetRange(1, 0, 10),
        m.CommitOffsets(1, 10),
    ]
    for msg in samples:
        assert codec.decode(type(msg).__name__, codec.encode(msg), m.TRACKER_MESSAGES, MAX) == msg
    for msg in (
        m.StopReceiver(),
        m.CleanupOldBlocks(5),
        m.RemoveBlocks(("a", "b")),
        m.UpdateRateLimit(10.5),
    ):
        assert (
            codec.decode(type(msg).__name__, codec.encode(msg), m.SUPERVISOR_MESSAGES, MAX) == msg
        )


@pytest.mark.parametrize(
    ("kind", "body", "error"),
    [
        ("StopReceiver", b"{}", "unknown message type"),
        ("AddBlock", b"not json", "not valid JSON"),
        ("AddBlock", b"[]", "must be a JSON object"),
        ("AddBlock", b'{"block_info": {"stream_id": "1"}}', "stream_id must be int"),
        ("RegisterReceiver", b'{"stream_id": 1}', "missing field"),
        ("ReportError", b'{"stream_id": 1, "message": "m", "error": "e", "x": 1}', "unknown field"),
        ("ReportError", b'{"stream_id": true, "message": "m", "error": "e"}', "must be int"),
        ("AddBlock", b"{" + b" " * MAX + b"}", "exceeds max_message_bytes"),
        ("AllocateOffsets", b'{"stream_id": 1, "start": "0", "max_records": 5}', "must be int"),
        ("CommitOffsets", b'{"stream_id": 1, "end": 1.5}', "end must be int"),
    ],
)
def test_bad_messages_are_refused_with_a_clear_error(kind, body, error):
    with pytest.raises(RpcError, match=error):
        codec.decode(kind, body, m.TRACKER_MESSAGES, MAX)


def test_block_ids_are_validated():
    assert m.StreamBlockId.parse("input-1-2-3") == m.StreamBlockId(1, 2, 3)
    for bad in ("input-1-2", "../etc/passwd", "input-a-1-2", "input-1-2-3\n", 5):
        with pytest.raises(RpcError, match="malformed block id"):
            m.StreamBlockId.parse(bad)  # type: ignore[arg-type]


@given(st.text(max_size=30), st.binary(max_size=300))
def test_decoder_never_crashes_on_garbage(kind, body):
    with contextlib.suppress(RpcError):
        codec.decode(kind, body, m.TRACKER_MESSAGES + m.SUPERVISOR_MESSAGES, MAX)

"""Frame encoding and the torn-tail / corruption rule, with hypothesis properties."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_receivers.errors import CorruptRecordError
from spark_receivers.wal.framing import (
    DIRECT_IO_ALIGN,
    HEADER_SIZE,
    BytesSource,
    CachedSource,
    FrameDecoder,
    decode_bytes,
    encode_frame,
    read_frame_at,
)

payloads = st.lists(st.binary(max_size=80), min_size=1, max_size=8)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frames(records: list[bytes]) -> tuple[bytes, list[int]]:
    out, offsets = b"", []
    for record in records:
        offsets.append(len(out))
        out += encode_frame(record)
    return out, offsets


class RecordingSource:
    """A source that remembers the largest read it was asked for."""

    def __init__(self, data: bytes) -> None:
        self._inner = BytesSource(data)
        self.largest_read = 0

    @property
    def size(self) -> int:
        return self._inner.size

    def read_at(self, offset: int, length: int) -> bytes:
        self.largest_read = max(self.largest_read, length)
        return self._inner.read_at(offset, length)


def test_without_zlib_ng_frames_are_the_same_and_read_back() -> None:
    """An executor given the package as a zip may lack zlib-ng: the standard library's CRC-32
    then writes the same frames and reads this process's frames (decision 0027)."""
    from spark_receivers.wal import framing

    # Where it is installed (the project's venv), zlib-ng computes it: a dropped dependency
    # would otherwise cost the WAL its CPU again without a word.
    assert framing._crc32.__module__ == "zlib_ng.zlib_ng"
    payload = bytes(range(256)) * 300
    here = encode_frame(payload)
    script = (
        "import sys\n"
        "sys.modules['zlib_ng'] = None  # import zlib_ng now raises ImportError\n"
        "from spark_receivers.wal import framing\n"
        "assert framing._crc32.__module__ == 'zlib', framing._crc32.__module__\n"
        "payload = bytes(range(256)) * 300\n"
        "frame = framing.encode_frame(payload)\n"
        "there = bytes.fromhex(sys.stdin.read())\n"
        "assert framing.decode_bytes(there) == ([payload], len(there))\n"
        "sys.stdout.write(frame.hex())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=here.hex(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert bytes.fromhex(done.stdout) == here


def test_frame_layout() -> None:
    frame = encode_frame(b"hello")
    length, payload_crc, header_crc = struct.unpack(">III", frame[:HEADER_SIZE])
    assert length == 5
    assert payload_crc == zlib.crc32(b"hello")
    assert header_crc == zlib.crc32(frame[:8])
    assert frame[HEADER_SIZE:] == b"hello"


def test_empty_payload_and_zero_filled_tail() -> None:
    data, _ = frames([b"", b"x"])
    assert decode_bytes(data) == ([b"", b"x"], len(data))
    # a crash can leave zeros after the last record (size extended, data lost)
    padded = data + bytes(4096)
    assert decode_bytes(padded) == ([b"", b"x"], len(data))


def test_cached_source_serves_small_reads_from_one_window() -> None:
    calls: list[tuple[int, int]] = []
    blob = bytes(range(256)) * 10

    def raw(offset: int, length: int) -> bytes:
        calls.append((offset, length))
        return blob[offset : offset + length]

    source = CachedSource(raw, len(blob), window=1024)
    assert source.read_at(0, 12) == blob[:12]
    assert source.read_at(100, 50) == blob[100:150]
    assert len(calls) == 1
    assert source.read_at(2000, 12) == blob[2000:2012]
    assert source.read_at(0, 2000) == blob[:2000]  # larger than the window: direct
    assert len(calls) == 3


@SETTINGS
@given(payloads)
def test_round_trip(records: list[bytes]) -> None:
    data, offsets = frames(records)
    assert decode_bytes(data) == (records, len(data))
    assert [o for o, _ in FrameDecoder(BytesSource(data), "f")] == offsets
    for offset, record in zip(offsets, records, strict=True):
        assert read_frame_at(BytesSource(data), "f", offset, len(record)) == record


@SETTINGS
@given(payloads)
def test_truncating_the_last_record_at_every_offset_returns_the_prefix(
    records: list[bytes],
) -> None:
    data, offsets = frames(records)
    last = offsets[-1]
    for cut in range(last, len(data)):
        decoder = FrameDecoder(BytesSource(data[:cut]), "seg")
        got = [p for _, p in decoder]
        assert got == records[:-1], cut
        assert decoder.valid_end == last
        assert decoder.torn == (cut > last)


@SETTINGS
@given(payloads, st.binary(min_size=1, max_size=300))
def test_garbage_appended_returns_every_record(records: list[bytes], garbage: bytes) -> None:
    data, _ = frames(records)
    source = RecordingSource(data + garbage)
    decoder = FrameDecoder(source, "seg", max_record_bytes=1024)
    assert [p for _, p in decoder] == records
    assert decoder.valid_end == len(data)
    assert source.largest_read <= max(1024, len(data) + len(garbage))


@SETTINGS
@given(payloads, st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE), st.binary(max_size=64))
def test_a_garbage_length_never_allocates_beyond_the_bound(
    records: list[bytes], header: bytes, rest: bytes
) -> None:
    data, _ = frames(records)
    source = RecordingSource(data + header + rest)
    max_record = 100
    try:
        got = [p for _, p in FrameDecoder(source, "seg", max_record_bytes=max_record)]
    except CorruptRecordError:
        pass  # allowed: a random header happened to carry a valid checksum
    else:
        assert got[: len(records)] == records
    # headers, payloads up to the bound, and resync chunks bounded by the file size
    assert source.largest_read <= max(max_record, source.size)


def test_a_valid_header_with_a_huge_length_is_refused_before_allocating() -> None:
    data, _ = frames([b"ok"])
    prefix = struct.pack(">II", 0xFFFF_FFF0, 0)
    forged = prefix + struct.pack(">I", zlib.crc32(prefix))
    source = RecordingSource(data + forged + b"tail")
    with pytest.raises(CorruptRecordError, match=f"offset {len(data)}.*max_record_bytes"):
        list(FrameDecoder(source, "seg", max_record_bytes=1 << 20))
    assert source.largest_read <= HEADER_SIZE


@SETTINGS
@given(
    st.lists(st.binary(min_size=1, max_size=60), min_size=2, max_size=6),
    st.data(),
)
def test_a_flipped_byte_mid_file_raises_naming_file_and_offset(
    records: list[bytes], draw: st.DataObject
) -> None:
    data, offsets = frames(records)
    victim = draw.draw(st.integers(0, len(records) - 2), label="frame")
    start, end = offsets[victim], offsets[victim + 1]
    pos = draw.draw(st.integers(start, end - 1), label="byte")
    flip = draw.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(data)
    damaged[pos] ^= flip
    with pytest.raises(CorruptRecordError) as info:
        decode_bytes(bytes(damaged), "/wal/log-0-1000")
    message = str(info.value)
    assert "/wal/log-0-1000" in message
    assert f"offset {start}" in message


@SETTINGS
@given(payloads, st.data())
def test_a_flipped_byte_in_the_last_record_is_a_torn_tail(
    records: list[bytes], draw: st.DataObject
) -> None:
    data, offsets = frames(records)
    pos = draw.draw(st.integers(offsets[-1], len(data) - 1))
    damaged = bytearray(data)
    damaged[pos] ^= 0x5A
    assert decode_bytes(bytes(damaged)) == (records[:-1], offsets[-1])


def test_read_frame_at_rejects_length_mismatch_and_bad_crc() -> None:
    data, offsets = frames([b"alpha", b"beta"])
    src = BytesSource(data)
    with pytest.raises(CorruptRecordError, match="handle says 4"):
        read_frame_at(src, "f", offsets[0], 4)
    damaged = bytearray(data)
    damaged[offsets[1] + HEADER_SIZE] ^= 1
    with pytest.raises(CorruptRecordError, match="f at offset 17: bad payload checksum"):
        read_frame_at(BytesSource(bytes(damaged)), "f", offsets[1], 4)


def padded(records: list[bytes]) -> bytes:
    """Frames as a direct-I/O writer lays them out: each zero-padded to a disk block."""
    out = b""
    for record in records:
        frame = encode_frame(record)
        out += frame + bytes(-len(frame) % DIRECT_IO_ALIGN)
    return out


@SETTINGS
@given(st.lists(st.binary(max_size=9000), min_size=1, max_size=5))
def test_direct_io_padding_is_skipped(records: list[bytes]) -> None:
    data = padded(records)
    assert len(data) % DIRECT_IO_ALIGN == 0
    decoder = FrameDecoder(BytesSource(data), "seg")
    assert [payload for _, payload in decoder] == records
    assert not decoder.torn
    last = encode_frame(records[-1])
    assert decoder.valid_end == len(data) - len(bytes(-len(last) % DIRECT_IO_ALIGN))


def test_a_frame_filling_its_block_exactly_has_no_padding() -> None:
    record = b"y" * (DIRECT_IO_ALIGN - HEADER_SIZE)
    data = padded([record, b"next"])
    assert data[DIRECT_IO_ALIGN : DIRECT_IO_ALIGN + HEADER_SIZE] == encode_frame(b"next")[:12]
    assert decode_bytes(data) == ([record, b"next"], DIRECT_IO_ALIGN + HEADER_SIZE + 4)


def test_zeros_that_stop_short_of_a_block_are_still_a_torn_tail() -> None:
    data, _ = frames([b"one", b"two"])
    decoder = FrameDecoder(BytesSource(data + bytes(100)), "seg")
    assert [payload for _, payload in decoder] == [b"one", b"two"]
    assert decoder.torn
    assert decoder.valid_end == len(data)


def test_zeros_at_a_block_start_are_a_torn_tail_not_padding() -> None:
    data = padded([b"one"]) + bytes(DIRECT_IO_ALIGN)  # a whole zero block: lost, not padding
    decoder = FrameDecoder(BytesSource(data), "seg")
    assert [payload for _, payload in decoder] == [b"one"]
    assert decoder.torn
    assert decoder.valid_end == HEADER_SIZE + 3


def test_a_non_zero_byte_in_the_padding_is_damage() -> None:
    data = bytearray(padded([b"one", b"two"]))
    data[100] = 1  # inside the first frame's padding, a valid frame follows
    with pytest.raises(CorruptRecordError, match="offset 15"):
        decode_bytes(bytes(data))


@SETTINGS
@given(st.lists(st.binary(max_size=300), min_size=30, max_size=120))
def test_unpadded_frames_across_block_boundaries_round_trip(records: list[bytes]) -> None:
    # Headers that begin a few bytes before a 4 KiB boundary start with zero bytes (a
    # small length): they must read as frames, not as direct-I/O padding.
    data, _ = frames(records)
    assert decode_bytes(data) == (records, len(data))


def test_a_header_straddling_a_block_boundary_is_a_frame_not_padding() -> None:
    for before in range(1, HEADER_SIZE + 1):
        first = b"a" * (DIRECT_IO_ALIGN - before - HEADER_SIZE)
        data, offsets = frames([first, b"b" * 170, b"c"])
        assert offsets[1] == DIRECT_IO_ALIGN - before
        assert data[offsets[1] : offsets[1] + 2] == b"\0\0"  # the length's high bytes
        assert decode_bytes(data) == ([first, b"b" * 170, b"c"], len(data))

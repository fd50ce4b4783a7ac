"""Lines of a chunk by Arrow's CSV reader (one column, no quoting) against ``split_lines``.

Run from the repository's root: .venv/bin/python
bench/results/probes-20261202/csv_split_probe.py

The receiver's ``split_lines`` (Arrow's split kernel) was a quarter of the receiver task's
CPU in a line count at 600,000 lines/s (perf, 2026-12-02): could Arrow's CSV parser,
told a line has one field (delimiter 0x1f, no quotes or escapes, empty lines kept), split
for less? Process CPU per line, chunks of 256 KiB and 3 MiB of ~100-byte lines, three
rounds; both outputs compared first.
"""

import sys
import time

import pyarrow as pa
import pyarrow.csv as pcsv

sys.path.insert(0, ".")
sys.path.insert(0, "bench/results/probes-20261201")
from split_probe import make_chunk  # the same chunks as that probe

from spark_receivers.receiver.lines import split_lines

READ = pcsv.ReadOptions(column_names=["value"], use_threads=False, block_size=1 << 26)
PARSE = pcsv.ParseOptions(
    delimiter="\x1f",
    quote_char=False,
    escape_char=False,
    double_quote=False,
    newlines_in_values=False,
    ignore_empty_lines=False,
)
CONVERT = pcsv.ConvertOptions(
    column_types={"value": pa.string()},
    strings_can_be_null=False,
    quoted_strings_can_be_null=False,
    check_utf8=True,
    null_values=[],
)


def by_csv(chunk: bytes) -> pa.Array:
    source = pa.BufferReader(pa.py_buffer(chunk))
    table = pcsv.read_csv(source, read_options=READ, parse_options=PARSE, convert_options=CONVERT)
    return table.column(0).combine_chunks()


for size in (256 << 10, 3 << 20):
    chunk = make_chunk(size)
    lines = chunk.count(b"\n") + 1
    assert split_lines(memoryview(chunk), 1 << 20, False).equals(by_csv(chunk))
    reps = max(1, 20_000_000 // len(chunk))
    for _ in range(3):
        costs = []
        for form in ("split_lines", "csv"):
            start = time.process_time()
            for _ in range(reps):
                if form == "csv":
                    by_csv(chunk)
                else:
                    split_lines(memoryview(chunk), 1 << 20, False)
            costs.append((time.process_time() - start) / reps / lines * 1e9)
        print(f"{size >> 10} KiB: split_lines {costs[0]:.1f}, CSV reader {costs[1]:.1f} ns a line")

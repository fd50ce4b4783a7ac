"""Print each raw file's figures in core-seconds per million lines: ``summary.py FILE...``."""

import gzip
import json
import pathlib
import sys

COMPILERS = ("C1 CompilerThre", "C2 CompilerThre")

for name in sys.argv[1:]:
    with gzip.open(name) as f:
        result = json.load(f)["data"]["results"][0]
    millions = result["lines"] / 1e6
    kinds = result["by_kind"]
    everything = sum(kinds.values()) / millions
    jvm = kinds.get("JVM", 0.0) / millions
    receiver = kinds["receiver task (Python worker)"] / millions
    compilers = sum(result["jvm_threads"].get(t, 0.0) for t in COMPILERS) / millions
    alone = result["spark_alone_core_s_per_batch"] / result["rate"] * 1e6
    print(
        f"{pathlib.Path(name).name}: all {everything:.2f}, JVM {jvm:.2f}, "
        f"Python processes {everything - jvm:.2f} (receiver task {receiver:.2f}), "
        f"compilers {compilers:.2f}, Spark alone {alone:.2f}, "
        f"everything but the query {everything - alone:.2f}; "
        f"settle {result.get('settle_s')}; sustained {result['sustained']}"
    )

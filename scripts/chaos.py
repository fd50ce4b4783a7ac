"""``make chaos``: every fault kind at load on a standalone cluster, checked against the source.

Kill -9 of receivers, executors and the driver, a cut receiver and a failing WAL disk; the
sink checked against the Redis stream itself.

See reliability/chaos.py (``--help`` for the knobs, ``--quick`` for a smoke run).
``--record`` writes the chaos section of RELIABILITY.md and its raw file in bench/results/.
Exit status 0 only when nothing acknowledged was lost, every record sent was acknowledged
by the end and every duplicate followed a crash.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reliability.chaos import main

if __name__ == "__main__":
    sys.exit(main())

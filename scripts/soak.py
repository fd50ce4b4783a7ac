"""``make soak``: the word count at half its capacity for 30 minutes; memory, disk, files flat.

See reliability/soak.py (``--help`` for the knobs). ``--record`` writes the plot
(docs/img/soak.png) and the summary into RELIABILITY.md and BENCHMARKS.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reliability.soak import main

if __name__ == "__main__":
    sys.exit(main())

"""``make soak``: the word count at half its capacity for two hours; no leak in its second hour.

See reliability/soak.py (``--help`` for the knobs, ``--quick`` for a smoke run). ``--record``
writes the soak's section of RELIABILITY.md, its raw file in bench/results/ and the plot
(docs/img/soak.png).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reliability.soak import main

if __name__ == "__main__":
    sys.exit(main())

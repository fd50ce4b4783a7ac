"""``python -m spark_receivers``: the ``spark-receivers`` command."""

import sys

from spark_receivers.cli import main

sys.exit(main())

"""The standalone cluster of the integration tests (tests/integration/standalone.py), reused."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from standalone import StandaloneCluster, spark_home

__all__ = ["StandaloneCluster", "spark_home"]

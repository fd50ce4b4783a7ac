"""The ``spark-receivers`` command line (``demo``, ``ingest``).

``main`` is the console script's entry point; ``python -m spark_receivers`` and
``python -m spark_receivers.cli`` run it too. The modules: ``app`` (arguments),
``sources`` and ``uri`` (source URIs), ``sinks`` and ``table_sink`` (sinks),
``spark_session`` (master, ``--conf``, UI), ``ingest`` and ``demo`` (the
commands), ``progress`` (per-batch lines) and ``outcome`` (exit statuses).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    from spark_receivers.cli.app import main as run_main

    return run_main(argv)

"""Reliability runs on a real standalone cluster: ``make chaos`` and ``make soak``.

``reliability.chaos`` kills receivers, executors and the driver, cuts the receiver off
from the driver and fails its WAL's disk while a Redis stream is ingested at load, then
checks the sink against the stream itself; ``reliability.soak`` runs the word count for
a long time and fits a trend to memory, WAL disk use and open files. Both write their
summary into RELIABILITY.md (``reliability.report``).
"""

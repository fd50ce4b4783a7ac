"""Reliability runs on a real standalone cluster: ``make chaos`` and ``make soak``.

``reliability.chaos`` kills receivers, executors and the driver, cuts the receiver off
from the driver and fails its WAL's disk while a Redis stream is ingested at load, then
checks the sink against the stream itself; ``reliability.soak`` runs the word count for
two hours and judges the slope of memory, WAL disk use and open files over its second
hour. Both set up and tear down through ``reliability.rig`` and write their section of
RELIABILITY.md, with its raw file, through ``bench/record.py``.
"""

"""One child session of spark_receivers word count: batch p50/p95 at fixed rates."""

import sys

from bench.cpu_breakdown import SYSTEMS
from bench.machine import core_speed
from bench.step import run_child_session

tag = sys.argv[1]
rates = [int(r) for r in sys.argv[2].split(",")]
speed = core_speed()
s = run_child_session(
    "spark_receivers",
    SYSTEMS["spark_receivers"],
    rates,
    30.0,
    pipeline="wordcount",
    warm_up_steps=1,
)
for st in s.steps:
    print(
        f"{tag} speed {speed:.1f} rate {st.offered_rate} p50 {st.batch_p50_ms:.0f} "
        f"p95 {st.batch_p95_ms:.0f} sched max {st.sched_delay_max_ms:.0f} "
        f"busy {st.extra.get('busy_cores', '?')} sustained {st.sustained}",
        flush=True,
    )

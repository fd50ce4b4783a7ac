"""Times the driver's batch path: loaded through PYTHONPATH, patches only a benchmark driver.

Each wrapped call appends ``<epoch s> <thread> <name> wall <ms> cpu <ms>`` to ``$INSTR_OUT``.
"""

import os
import sys
import threading
import time

if "bench.receivers" in " ".join(getattr(sys, "orig_argv", [])):
    from spark_receivers.driver.batches import job_generator as jg
    from spark_receivers.driver.batches import received_block_tracker as rbt

    out = open(os.environ.get("INSTR_OUT", "/tmp/instr/times.log"), "a", buffering=1)  # noqa: SIM115
    lock = threading.Lock()

    def wrap(cls, name):
        orig = getattr(cls, name)

        def timed(self, *a, **k):
            t0 = time.perf_counter()
            c0 = time.thread_time()
            try:
                return orig(self, *a, **k)
            finally:
                wall = 1000 * (time.perf_counter() - t0)
                cpu = 1000 * (time.thread_time() - c0)
                with lock:
                    thread = threading.current_thread().name
                    out.write(f"{time.time():.3f} {thread} {name} wall {wall:.1f} cpu {cpu:.1f}\n")

        setattr(cls, name, timed)

    for n in ("_finish", "_write_checkpoint", "_generate", "_run_batch"):
        wrap(jg.JobGenerator, n)
    for n in ("allocate_blocks_to_batch", "cleanup_old_batches", "add_blocks"):
        wrap(rbt.ReceivedBlockTracker, n)

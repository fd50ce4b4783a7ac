import sys, os, time, threading
if "bench.receivers" in " ".join(getattr(sys, "orig_argv", [])):
    from spark_receivers.driver.batches import job_generator as jg
    out = open(os.environ.get("INSTR_OUT", "/tmp/instr/times.log"), "a", buffering=1)
    lock = threading.Lock()
    def wrap(cls, name):
        orig = getattr(cls, name)
        def timed(self, *a, **k):
            t0 = time.perf_counter(); c0 = time.thread_time()
            try:
                return orig(self, *a, **k)
            finally:
                with lock:
                    out.write(f"{time.time():.3f} {threading.current_thread().name} {name} wall {1000*(time.perf_counter()-t0):.1f} cpu {1000*(time.thread_time()-c0):.1f}\n")
        setattr(cls, name, timed)
    for n in ("_finish", "_write_checkpoint", "_generate", "_run_batch"):
        wrap(jg.JobGenerator, n)
    from spark_receivers.driver.batches import received_block_tracker as rbt
    for n in ("allocate_blocks_to_batch", "cleanup_old_batches", "add_blocks"):
        if hasattr(rbt.ReceivedBlockTracker, n):
            wrap(rbt.ReceivedBlockTracker, n)

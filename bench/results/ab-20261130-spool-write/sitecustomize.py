"""Times the keeper's adopt, store put, map and remove inside its own process (adopt_times.py).

Active only in a process whose command line names the block keeper; it waits for the
keeper's module (run as ``__main__``) to define its functions, then wraps them.
"""

import os
import sys
import threading
import time

if b"block_keeper" in open("/proc/self/cmdline", "rb").read():  # noqa: SIM115

    def _patch() -> None:
        keeper = sys.modules["__main__"]
        from spark_receivers.receiver import block_store

        out = open(f"/tmp/probe/keeper-times-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115

        def wrap(owner, name):  # type: ignore[no-untyped-def]
            original = getattr(owner, name)

            def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return original(*args, **kwargs)
                finally:
                    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                    out.write(f"{name} {1e3 * wall:.2f} {1e3 * cpu:.2f}\n")

            setattr(owner, name, timed)

        wrap(keeper.BlockKeeper, "adopt")
        wrap(keeper.BlockKeeper, "remove")
        wrap(block_store.BlockStore, "put")
        wrap(keeper, "map_spool_file")

    def _wait_then_patch() -> None:
        for _ in range(2000):
            main = sys.modules.get("__main__")
            if hasattr(main, "BlockKeeper") and hasattr(main, "map_spool_file"):
                _patch()
                return
            time.sleep(0.005)

    threading.Thread(target=_wait_then_patch, daemon=True).start()

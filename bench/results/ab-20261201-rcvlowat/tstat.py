"""Per-thread CPU of processes over a window: tick counts (/proc stat) and run time (schedstat).

Usage: python tstat.py PID[,PID...] SECONDS. Prints each process's total in ms of CPU a
second, then its threads above 0.5 ms/s, largest first.
"""

import os
import sys
import time


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def snap(pid: int) -> dict[str, tuple[int, int, str]]:
    """Each thread's (ticks, schedstat ns, name)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            stat = _read(f"{base}/stat")
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks = int(fields[11]) + int(fields[12])
            ns = int(_read(f"{base}/schedstat").split()[0])
            out[tid] = (ticks, ns, _read(f"{base}/comm").strip())
        except OSError:
            pass
    return out


def main() -> None:
    pids = [int(p) for p in sys.argv[1].split(",")]
    secs = float(sys.argv[2])
    tck = os.sysconf("SC_CLK_TCK")
    before = {p: snap(p) for p in pids}
    time.sleep(secs)
    after = {p: snap(p) for p in pids}
    for p in pids:
        total_ticks = total_sched = 0.0
        rows = []
        for tid, (t1, n1, name) in after[p].items():
            if tid not in before[p]:
                continue
            t0, n0, _ = before[p][tid]
            by_ticks = (t1 - t0) / tck / secs * 1000
            by_sched = (n1 - n0) / 1e9 / secs * 1000
            total_ticks += by_ticks
            total_sched += by_sched
            if by_ticks > 0.5 or by_sched > 0.5:
                rows.append((by_sched, by_ticks, tid, name))
        print(f"pid {p}: ticks {total_ticks:.1f} ms/s, schedstat {total_sched:.1f} ms/s")
        for by_sched, by_ticks, tid, name in sorted(rows, reverse=True)[:10]:
            print(f"   {tid} {name:16s} ticks {by_ticks:6.1f}  sched {by_sched:6.1f} ms/s")


if __name__ == "__main__":
    main()

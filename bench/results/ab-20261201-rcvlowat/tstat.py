"""Per-thread CPU of a process over a window: tick accounting (/proc stat) vs scheduler runtime (schedstat)."""
import os, sys, time
def snap(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            st = open(f"/proc/{pid}/task/{tid}/stat").read()
            rest = st[st.rindex(")") + 2:].split()
            ticks = int(rest[11]) + int(rest[12])
            ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            out[tid] = (ticks, ns, comm)
        except OSError:
            pass
    return out
pids = [int(p) for p in sys.argv[1].split(",")]; secs = float(sys.argv[2])
tck = os.sysconf("SC_CLK_TCK")
a = {p: snap(p) for p in pids}; time.sleep(secs); b = {p: snap(p) for p in pids}
for p in pids:
    T1 = T2 = 0
    rows = []
    for tid, (t1, n1, c) in b[p].items():
        if tid in a[p]:
            t0, n0, _ = a[p][tid]
            d1 = (t1 - t0) / tck / secs * 1000; d2 = (n1 - n0) / 1e9 / secs * 1000
            T1 += d1; T2 += d2
            if d1 > 0.5 or d2 > 0.5: rows.append((d2, d1, tid, c))
    print(f"pid {p}: ticks {T1:.1f} ms/s, schedstat {T2:.1f} ms/s")
    for d2, d1, tid, c in sorted(rows, reverse=True)[:10]:
        print(f"   {tid} {c:16s} ticks {d1:6.1f}  sched {d2:6.1f} ms/s")

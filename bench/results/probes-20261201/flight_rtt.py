"""CPU of one unary Flight action (server and client processes), paced, and when idle.

Run: python bench/results/probes-20261201/flight_rtt.py client  (any directory). Set
GRPC_EXPERIMENTS in the environment to compare gRPC's settings; the server inherits it.
The server's CPU comes from /proc (ticks of 4 ms: 200 calls resolve 0.02 ms a call).
"""

import os
import subprocess
import sys
import time

import pyarrow.flight as fl


class EmptyAction(fl.FlightServerBase):
    def do_action(self, context, action):
        yield fl.Result(b"ok")


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client() -> None:
    server = subprocess.Popen([sys.executable, __file__, "server"], stdout=subprocess.PIPE)
    try:
        port = int(server.stdout.readline())
        conn = fl.connect(f"grpc://127.0.0.1:{port}")
        for _ in range(50):
            list(conn.do_action(fl.Action("x", b"")))
        time.sleep(1)
        s0, c0 = proc_cpu(server.pid), time.process_time()
        time.sleep(5)
        idle_s = (proc_cpu(server.pid) - s0) / 5 * 1000
        idle_c = (time.process_time() - c0) / 5 * 1000
        s0, c0 = proc_cpu(server.pid), time.process_time()
        due = time.monotonic()
        for _ in range(200):  # 20 calls a second for 10 s, like blocks and their reports
            list(conn.do_action(fl.Action("x", b"")))
            due += 0.05
            time.sleep(max(0.0, due - time.monotonic()))
        call_s = (proc_cpu(server.pid) - s0) / 200 * 1000
        call_c = (time.process_time() - c0) / 200 * 1000
        print(
            f"GRPC_EXPERIMENTS={os.environ.get('GRPC_EXPERIMENTS', '')!r}: idle server "
            f"{idle_s:.2f}, client {idle_c:.2f} ms/s; a paced call: server {call_s:.3f}, "
            f"client {call_c:.3f} ms of CPU",
            flush=True,
        )
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["server"]:
        srv = EmptyAction("grpc://127.0.0.1:0")
        print(srv.port, flush=True)
        srv.serve()
    else:
        client()

"""Chaos at load on a standalone cluster; the sink checked against the Redis stream itself.

Started here, stopped by PID at the end: a Spark standalone Master and two Workers
(tests/integration/standalone.py), a ``redis-server``, a producer adding numbered
records at ``--rate``, and the driver, ``spark-receivers ingest`` reading the stream
through ``RedisStreamReceiver`` (XACK only after the reliable store) into a
``parquet:`` sink, both WALs on, with ``--checkpoint`` so that a new driver recovers
through ``get_or_create``. During ``--duration`` the faults of
:mod:`reliability.faults` are applied in a random order at random times, each one
after the previous recovered. Then the producer stops, the run drains (every record
acknowledged and processed), the driver is stopped with Ctrl-C, and the sink is read.

Ground truth comes from outside: Redis says how many records were added, delivered
to the group and acknowledged, and which are pending; the sink's complete batch
directories say what was delivered. ``lost`` counts records acknowledged but in no
batch (must be 0); ``duplicated`` those delivered more than once, each of which must
have been pending right after a crash (else it counts as ``unexplained``, must be 0);
``unacked at the end`` must be 0. Exit status 0 only when everything holds.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.record import Recording, Section, add_record_arguments
from reliability import report
from reliability.cluster import spark_home
from reliability.driver import IngestDriver, spark_env
from reliability.faults import KINDS, FaultEvent, FaultRunner
from reliability.monitor import MemorySampler, Progress
from reliability.redis_source import Producer
from reliability.rig import Rig
from reliability.sink import SinkWatch

STREAM, GROUP = "chaos", "spark"


@dataclass(frozen=True)
class ChaosSettings:
    duration_s: float = 600.0
    rate: float = 20_000.0
    counts: tuple[tuple[str, int], ...] = (
        ("worker", 20), ("executor", 5), ("driver", 5), ("partition", 1), ("enospc", 1), ("eio", 1),
    )  # fmt: skip
    partition_s: float = 30.0
    disk_fault_s: float = 20.0
    batch_ms: int = 1000
    read_batch: int = 5000
    startup_s: float = 300.0
    stall_s: float = 240.0
    drain_s: float = 300.0
    seed: int = 0

    def schedule(self, rng: random.Random) -> list[tuple[float, str]]:
        """``(offset_s, kind)`` of every fault: shuffled, one in each equal slice of the run."""
        kinds = [k for k, n in self.counts for _ in range(n)]
        rng.shuffle(kinds)
        slot = self.duration_s / max(1, len(kinds))
        return [(i * slot + rng.uniform(0, slot * 0.6), k) for i, k in enumerate(kinds)]


def run(settings: ChaosSettings, root: Path, say: Any = print) -> dict[str, Any]:
    rng = random.Random(settings.seed)
    out: dict[str, Any] = {"seed": settings.seed}
    events: list[FaultEvent] = []
    memory: MemorySampler | None = None
    started = time.monotonic()
    with Rig(root, STREAM, GROUP) as rig:
        group = rig.group
        source = (
            f"redis://127.0.0.1:{rig.redis.port}/{STREAM}?group={GROUP}&batch={settings.read_batch}"
        )
        plan = root / "fault-plan.json"
        conf = {
            "spark.receivers.receiver.maxRestarts": "-1",  # kill -9 many times on purpose
            "spark.receivers.testing.faultPlan": str(plan),
            "spark.streaming.receiverRestartDelay": "1s",
        }
        args = ["--source", source, "--sink", f"parquet:{root / 'out'}"]
        args += ["--checkpoint", str(root / "checkpoint"), "--wal"]
        args += ["--batch-interval", f"{settings.batch_ms}ms", "--unreachable-timeout", "1h"]
        env = spark_env(spark_home(), rig.cluster.root / "conf")
        driver = rig.keep_driver(
            IngestDriver(root / "driver", rig.cluster.master_url, args, conf, env)
        )
        driver.start()
        sink = SinkWatch(root / "out")
        progress = rig.keep(Progress(group, sink))
        memory = rig.keep(MemorySampler(driver.pids, rig.cluster.executor_pids))
        producer = rig.keep(Producer(rig.redis, STREAM, settings.rate))
        producer.start()
        say(f"{_t(started)} driver started; producing {settings.rate:g} records/s")
        first = progress.wait(lambda s: s.acked > 0 and s.newest_batch_ms > 0, settings.startup_s)
        if first is None:
            raise RuntimeError(f"no progress within {settings.startup_s:g}s:\n{driver.tail()}")
        say(f"{_t(started)} first records acknowledged and in the sink")
        runner = FaultRunner(
            driver=driver,
            executors=rig.cluster.executor_pids,
            redis_port=rig.redis.port,
            group=group,
            progress=progress,
            plan_path=plan,
            window_s={"partition": settings.partition_s, "enospc": settings.disk_fault_s,
                      "eio": settings.disk_fault_s},
            stall_s=settings.stall_s,
            rng=rng,
            started=started,
        )  # fmt: skip
        unplanned: list[str] = []
        phase = time.monotonic()
        for offset, kind in settings.schedule(rng):
            wait = phase + offset - time.monotonic()
            if wait > 0:
                _watch(driver, runner, unplanned, wait)
            event = runner.apply(kind)
            events.append(event)
            rec = "not recovered" if event.recovery_s is None else f"recovered {event.recovery_s} s"
            extra = "" if event.acks_while_on is None else f", acks while on {event.acks_while_on}"
            say(f"{_t(started)} {kind}: {event.detail}; {rec}{extra}")
            if event.recovery_s is None and not event.detail.startswith("skipped"):
                out["stalled"] = (
                    f"{kind} at {event.at_s}s: no progress within {settings.stall_s:g}s"
                )
                break
            _watch(driver, runner, unplanned, 0)
        rest = phase + settings.duration_s - time.monotonic()
        if rest > 0 and "stalled" not in out:
            _watch(driver, runner, unplanned, rest)
        sent = producer.stop()
        if producer.error is not None:
            raise RuntimeError(f"the producer failed: {producer.error!r}")
        out.update(_drain(settings, driver, group, progress, sent, say, started))
        out["unplanned_driver_exits"] = unplanned
        out["driver_exit"] = driver.stop_gracefully(180)
        say(f"{_t(started)} driver stopped (status {out['driver_exit']}); checking the sink")
        out.update(_check(settings, sink, group, sent, events))
    out["seconds"] = round(time.monotonic() - started)
    out["faults"] = [
        {"kind": e.kind, "at_s": e.at_s, "detail": e.detail, "recovery_s": e.recovery_s,
         "acks_while_on": e.acks_while_on, "error_reported": e.error_reported}
        for e in events
    ]  # fmt: skip
    out["peak_rss_mib"] = {
        "driver": _mib(memory.driver_peak if memory else 0),
        "executor": _mib(memory.executor_peak if memory else 0),
        "keeper": _mib(memory.keeper_peak if memory else 0),
    }
    out["ok"] = _ok(out, settings)
    out["settings"] = asdict(settings)
    return out


def _watch(driver: IngestDriver, runner: FaultRunner, unplanned: list[str], for_s: float) -> None:
    """Wait ``for_s``; a driver that ended on its own is noted (the run fails) and started again."""
    deadline = time.monotonic() + for_s
    while True:
        code = driver.exited()
        if code is not None and not runner.driver_killed:
            unplanned.append(f"driver #{driver.starts} exited with {code}: {driver.tail(5)}")
            driver.start()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(1.0, left))


def _drain(settings, driver, group, progress, sent, say, started) -> dict[str, Any]:
    say(f"{_t(started)} {sent} records sent; draining")
    deadline = time.monotonic() + settings.drain_s
    while not group.all_acked(sent) and time.monotonic() < deadline:
        time.sleep(0.5)
    all_acked = group.all_acked(sent)
    acked_at = progress.now()
    # Batches run in order: one newer than the last acknowledgement + 2 intervals holds it.
    processed = progress.wait(
        lambda s: s.newest_batch_ms > acked_at.wall_ms + 2 * settings.batch_ms,
        max(30.0, deadline - time.monotonic()),
    )
    say(f"{_t(started)} drained: all acked {all_acked}, processed {processed is not None}")
    return {"all_acked": all_acked, "drained": processed is not None}


def _check(settings, sink, group, sent, events) -> dict[str, Any]:
    added, read, pending = group.counts()
    pending_now = group.pending_values()
    counts = sink.counts(sent)
    delivered = counts > 0
    acked = np.zeros(sent, dtype=bool)
    acked[: min(read, sent)] = True  # delivered to the group in stream order ...
    for v in pending_now:
        acked[v] = False  # ... minus what is still pending
    redelivered = set().union(*(e.pending_after for e in events)) if events else set()
    dups = np.flatnonzero(counts > 1)
    unexplained = [int(v) for v in dups if int(v) not in redelivered]
    lost = np.flatnonzero(acked & ~delivered)
    return {
        "sent": sent,
        "added": added,
        "acked": int(acked.sum()),
        "delivered": int(delivered.sum()),
        "delivered_total": int(counts.sum()),
        "lost": len(lost),
        "lost_sample": [int(v) for v in lost[:10]],
        "duplicated": len(dups),
        "duplicated_unexplained": len(unexplained),
        "unexplained_sample": unexplained[:10],
        "unacked_end": sent - int(acked.sum()),
        "pending_end": pending,
        "incomplete_batches": sink.incomplete(),
    }


def _ok(out: dict[str, Any], settings: ChaosSettings) -> bool:
    wanted = dict(settings.counts)
    done = {k: sum(1 for f in out["faults"] if f["kind"] == k and f["recovery_s"] is not None)
            for k in KINDS}  # fmt: skip
    out["faults_done"] = done
    return bool(
        "stalled" not in out
        and "sent" in out
        and out["lost"] == 0
        and out["duplicated_unexplained"] == 0
        and out["unacked_end"] == 0
        and out["all_acked"]
        and out["drained"]
        and out["driver_exit"] == 0
        and not out["unplanned_driver_exits"]
        and all(done.get(k, 0) >= n for k, n in wanted.items())
        and all(f["acks_while_on"] in (0, None) for f in out["faults"])
        and all(f["error_reported"] in (True, None) for f in out["faults"])
    )


def _mib(n: int) -> int:
    return round(n / 2**20)


def _t(started: float) -> str:
    return f"{time.monotonic() - started:7.1f}s"


def recovery_rows(out: dict[str, Any]) -> list[tuple[str, object]]:
    rows = []
    for kind in KINDS:
        times = [f["recovery_s"] for f in out["faults"] if f["kind"] == kind]
        done = [t for t in times if t is not None]
        if times:
            p50 = statistics.median(done) if done else "—"
            rows.append((f"{kind} x{len(times)}", f"p50 {p50} s, max {max(done, default='—')} s"))
    return rows


def render(out: dict[str, Any]) -> str:
    """The chaos section of RELIABILITY.md from a run's raw data."""
    settings = _settings(out["settings"])
    counts = ", ".join(f"{k} {n}" for k, n in out.get("faults_done", {}).items())
    cuts = [f["acks_while_on"] for f in out["faults"] if f["acks_while_on"] is not None]
    errors = [f["error_reported"] for f in out["faults"] if f["error_reported"] is not None]
    rows: list[tuple[str, object]] = [
        ("result", "**OK**" if out["ok"] else "**FAILED**"),
        ("cluster", "standalone: Master + 2 Workers (2 cores, 2g each), executors 2 x 2 cores"),
        (
            "source",
            f"Redis stream, RedisStreamReceiver (XACK after the reliable store), "
            f"XREADGROUP count {settings.read_batch}",
        ),
        ("offered load", f"{settings.rate:,.0f} records/s"),
        (
            "duration",
            f"{settings.duration_s:g} s of faults; {out['seconds']} s in all (seed {out['seed']})",
        ),
        ("WALs", "receiver and driver WAL on, checkpoint, parquet sink per batch_time_ms"),
        ("faults applied (recovered)", counts),
        ("sent", f"{out.get('sent', 0):,}"),
        ("acked", f"{out.get('acked', 0):,}"),
        ("delivered (distinct)", f"{out.get('delivered', 0):,}"),
        ("lost (acked, never delivered)", out.get("lost")),
        (
            "duplicated (all after a crash)",
            f"{out.get('duplicated')} (unexplained {out.get('duplicated_unexplained')})",
        ),
        ("unacked at the end", out.get("unacked_end")),
        ("acks while cut off / disk failing", f"{sum(cuts)} over {len(cuts)} windows"),
        ("disk error named in the driver's output", f"{sum(errors)} of {len(errors)} windows"),
        *[(f"recovery: {k}", v) for k, v in recovery_rows(out)],
        ("peak RSS driver (Python + JVM)", f"{out['peak_rss_mib']['driver']} MiB"),
        ("peak RSS executor (JVM + workers + keeper)", f"{out['peak_rss_mib']['executor']} MiB"),
        ("driver exit after Ctrl-C", out.get("driver_exit")),
    ]
    if out.get("stalled"):
        rows.append(("stalled", out["stalled"]))
    return report.table(rows, ("", "")) + (
        "\n\nRecovery: from the kill (or the end of a cut or disk fault) to the first moment "
        "both new acknowledgements in Redis and a newer complete batch in the sink are seen."
    )


def _settings(d: dict[str, Any]) -> ChaosSettings:
    return ChaosSettings(**{**d, "counts": tuple((k, int(n)) for k, n in d["counts"])})


SECTION = Section(
    name="chaos", module="reliability.chaos", title="make chaos", render=render,
    file="RELIABILITY.md",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/chaos.py", description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--quick", action="store_true",
        help="smoke: 45 s of faults at 2,000 records/s, every kind once (the worker twice)",
    )  # fmt: skip
    p.add_argument("--duration", type=float, help="seconds of faults (600; quick 45)")
    p.add_argument("--rate", type=float, help="records/s offered (20000; quick 2000)")
    p.add_argument("--workers", type=int, help="kill -9 of the receiver's worker (20; quick 2)")
    p.add_argument("--executors", type=int, help="kill -9 of an executor JVM (5; quick 1)")
    p.add_argument("--drivers", type=int, help="kill -9 of the driver (5; quick 1)")
    p.add_argument("--partitions", type=int, help="cut-off windows (1)")
    p.add_argument("--partition-s", type=float, help="seconds cut off (30; quick 8)")
    p.add_argument("--disk-faults", type=int, help="ENOSPC windows, and as many EIO (1)")
    p.add_argument("--disk-fault-s", type=float, help="seconds of each (20; quick 5)")
    p.add_argument("--read-batch", type=int, default=5000, help="XREADGROUP COUNT")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--record", action="store_true", help="write the section of RELIABILITY.md")
    p.add_argument("--keep", action="store_true", help="keep the run's directory")
    p.add_argument("--json", action="store_true", help="last line: the JSON summary")
    add_record_arguments(p, "RELIABILITY.md")
    a = p.parse_args(argv)
    a.no_write = a.no_write or not a.record

    def pick(given: float | None, full: float, quick: float) -> Any:
        return given if given is not None else (quick if a.quick else full)

    disk = pick(a.disk_faults, 1, 1)
    settings = ChaosSettings(
        duration_s=pick(a.duration, 600.0, 45.0),
        rate=pick(a.rate, 20_000.0, 2_000.0),
        counts=(("worker", pick(a.workers, 20, 2)), ("executor", pick(a.executors, 5, 1)),
                ("driver", pick(a.drivers, 5, 1)), ("partition", pick(a.partitions, 1, 1)),
                ("enospc", disk), ("eio", disk)),
        partition_s=pick(a.partition_s, 30.0, 8.0),
        disk_fault_s=pick(a.disk_fault_s, 20.0, 5.0),
        read_batch=a.read_batch,
        seed=a.seed if a.seed is not None else random.randrange(1 << 30),
    )  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="spark-receivers-chaos-"))
    print(f"chaos run in {root} (seed {settings.seed})", flush=True)
    try:
        with Recording(SECTION, "python scripts/chaos.py", argv, a) as rec:
            out = run(settings, root, say=lambda s: print(s, flush=True))
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(render(out), flush=True)
    rec.finish(out)
    if a.json:
        print(json.dumps(out, default=str), flush=True)
    return 0 if out["ok"] else 1

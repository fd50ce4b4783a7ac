"""The soak: the word count at half its capacity for a long time; memory, disk and files stay flat.

On a standalone cluster (Master + 2 Workers) of its own, with a redis-server of its own:
the driver is ``reliability/soak_app.py`` (a word count over a Redis stream, both WALs
on). First the **capacity** is measured, unless ``--capacity`` gives it: a backlog of
``--probe-records`` lines is added at once and capacity = backlog / the time until every
line is acknowledged and its batch completed (the whole path: read, WAL, keeper,
AddBlock, batch). Then a producer offers ``--load`` (0.5) x capacity lines/s for
``--minutes``, and every ``--sample-s`` the harness samples from /proc: the RSS of the
driver (its Python, JVM and Python workers) and of the executors (JVMs, Python workers,
block keepers), the checkpoint directory's size (both WALs), and the open file
descriptors of the driver and of the executors. The driver's and executors' JVMs start
with their heap committed and touched (``JVM_CONF``), so that their RSS does not grow while
the heap is sized.

**The flatness rule.** Samples of the first ``--warmup-s`` are left out. For each
series a least-squares line is fitted; its growth over the soak (slope x span) must not
exceed the larger of 3 x the standard deviation of the residuals (noise) and 5 % of the
series' mean (a floor for quiet series). A leak grows steadily and fails it; a sawtooth
of garbage collections is noise. The samples, the fits and the verdicts go into a plot
(docs/img/soak.png with ``--record``) and a section of BENCHMARKS.md and of RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reliability import procs, report
from reliability.cluster import StandaloneCluster, spark_home
from reliability.driver import IngestDriver, spark_env
from reliability.redis_source import Group, Producer, RedisServer

STREAM = "soak"
SERIES = (
    ("driver_rss_mib", "driver RSS (MiB)"),
    ("executor_rss_mib", "executors RSS (MiB)"),
    ("wal_mib", "checkpoint + WALs on disk (MiB)"),
    ("driver_fds", "driver open fds"),
    ("executor_fds", "executors open fds"),
)
PLOT = report.ROOT / "docs" / "img" / "soak.png"
JVM_CONF = {
    "spark.driver.extraJavaOptions": "-Xms768m -XX:+AlwaysPreTouch",
    "spark.executor.extraJavaOptions": "-Xms768m -XX:+AlwaysPreTouch",
}
"""The JVMs' heaps committed and touched at start (``-Xms`` = their ``-Xmx``, 768m): a
JVM that grows its heap towards ``-Xmx`` raises its RSS for a long time without leaking
(the first 30-minute soak failed on the driver's RSS, +370 MiB, while its JVM's heap was
still growing: 545 of 768 MiB committed after 22 min). With the heap fixed, RSS growth is
what leaks; ``driver_jvm_rss_mib`` (sampled, not judged) tells the JVM from the Python."""


@dataclass(frozen=True)
class SoakSettings:
    minutes: float = 30.0
    sample_s: float = 60.0
    warmup_s: float = 180.0
    load: float = 0.5
    capacity: float | None = None
    probe_records: int = 300_000
    batch_ms: int = 1000
    read_batch: int = 5000


def du_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # removed by WAL cleanup meanwhile
    return total


def trees(executors: dict[str, int]) -> list[int]:
    """Every process of our executors: JVMs, their Python workers, their block keepers."""
    children = procs.children_map()
    out: set[int] = set()
    for jvm in executors.values():
        out |= {jvm, *procs.descendants(jvm, children)}
        work = procs.cwd_of(jvm)
        if work:
            out |= set(procs.under(work))
    return sorted(out)


def batch_lines(driver: IngestDriver) -> list[dict[str, Any]]:
    out = []
    for line in driver.log_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def processed(driver: IngestDriver) -> int:
    return sum(b.get("records", 0) for b in batch_lines(driver))


def wait_for(predicate: Any, timeout_s: float, what: str, every_s: float = 0.5) -> float:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)
    return time.monotonic()


def trend(t_s: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The fit, growth over the span, noise and the verdict of the flatness rule."""
    slope, intercept = np.polyfit(t_s, y, 1)
    residuals = y - (slope * t_s + intercept)
    span = float(t_s[-1] - t_s[0])
    growth = float(slope * span)
    noise = float(np.std(residuals))
    tolerance = max(3 * noise, 0.05 * float(np.mean(y)))
    return {
        "mean": round(float(np.mean(y)), 1),
        "slope_per_h": round(float(slope) * 3600, 2),
        "growth": round(growth, 2),
        "noise": round(noise, 2),
        "tolerance": round(tolerance, 2),
        "flat": growth <= tolerance,
        "fit": (float(slope), float(intercept)),
    }


def _t(started: float) -> str:
    return f"{time.monotonic() - started:7.1f}s"


def run(settings: SoakSettings, root: Path, say: Any = print) -> dict[str, Any]:
    cluster = StandaloneCluster(root / "cluster")
    redis = group = producer = driver = None
    out: dict[str, Any] = {"machine": report.machine()}
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    try:
        cluster.start()
        redis = RedisServer(root / "redis")
        group = Group(redis, STREAM, "soak")
        ckpt = root / "checkpoint"
        app = str(Path(__file__).with_name("soak_app.py"))
        args = ["--redis-url", redis.url, "--checkpoint", str(ckpt)]
        args += ["--batch-ms", str(settings.batch_ms), "--read-batch", str(settings.read_batch)]
        env = spark_env(spark_home(), cluster.root / "conf")
        env["PYTHONPATH"] = str(report.ROOT)
        driver = IngestDriver(root / "driver", cluster.master_url, args, JVM_CONF, env, app=app)
        driver.start()
        wait_for(lambda: '"started"' in driver.log_text(), 300, "the soak app to start")
        say(f"{_t(started)} soak app started")
        capacity = settings.capacity
        if capacity is None:
            filler = Producer(redis, STREAM, 0, words=True)
            t0 = time.monotonic()
            filler.fill(settings.probe_records)
            n = settings.probe_records
            wait_for(lambda: group.all_acked(n) and processed(driver) >= n, 900, "the backlog")
            capacity = n / (time.monotonic() - t0)
            out["capacity_from"] = f"a backlog of {n:,} lines: {time.monotonic() - t0:.1f} s"
            filler.stop()
            say(f"{_t(started)} capacity {capacity:,.0f} lines/s ({out['capacity_from']})")
        else:
            out["capacity_from"] = "given (--capacity)"
        out["capacity"] = round(capacity)
        rate = settings.load * capacity
        out["rate"] = round(rate)
        base = group.counts()[0]
        producer = Producer(redis, STREAM, rate, words=True, first=base)
        producer.start()
        soak_start, soak_wall_ms = time.monotonic(), int(time.time() * 1000)
        end = soak_start + settings.minutes * 60
        say(f"{_t(started)} soaking at {rate:,.0f} lines/s for {settings.minutes:g} min")
        while time.monotonic() < end:
            time.sleep(min(settings.sample_s, max(0.0, end - time.monotonic())))
            executors = trees(cluster.executor_pids())
            dpids = driver.pids()
            jvms = [p for p in dpids if (procs.cmdline(p) or [""])[0].endswith("java")]
            sample = {
                "t_s": round(time.monotonic() - soak_start, 1),
                "driver_rss_mib": sum(map(procs.rss_bytes, dpids)) / 2**20,
                "driver_jvm_rss_mib": sum(map(procs.rss_bytes, jvms)) / 2**20,
                "executor_rss_mib": sum(map(procs.rss_bytes, executors)) / 2**20,
                "wal_mib": du_bytes(ckpt) / 2**20,
                "driver_fds": sum(map(procs.open_fds, dpids)),
                "executor_fds": sum(map(procs.open_fds, executors)),
            }
            samples.append(sample)
            say(f"{_t(started)} " + "  ".join(f"{k} {v:,.1f}" for k, v in sample.items()))
            if driver.exited() is not None:
                raise RuntimeError(f"the soak app exited:\n{driver.tail()}")
        sent = base + producer.stop()
        after = soak_wall_ms + settings.warmup_s * 1000  # the backlog's batches are not the soak's
        lines = [b for b in batch_lines(driver) if b.get("batch", 0) >= after]
        delays = [b["delay_ms"] for b in lines if b.get("delay_ms") is not None]
        out["max_delay_ms"] = max(delays, default=None)
        wait_for(lambda: group.all_acked(sent), 300, "every line acknowledged")
        wait_for(lambda: processed(driver) >= sent, 300, "every line processed")
        out["sent"], out["processed"] = sent, processed(driver)
        out["driver_exit"] = driver.stop_gracefully(180)
    finally:
        if producer is not None:
            producer.stop()
        if driver is not None and driver.exited() is None:
            driver.kill9()
        if group is not None:
            group.close()
        if redis is not None:
            redis.stop()
        cluster.stop()
    out["samples"] = samples
    out["seconds"] = round(time.monotonic() - started)
    kept = [s for s in samples if s["t_s"] >= settings.warmup_s] or samples
    t_s = np.array([s["t_s"] for s in kept])
    out["trends"] = {k: trend(t_s, np.array([s[k] for s in kept])) for k, _ in SERIES}
    out["ok"] = bool(
        len(kept) >= 3
        and all(v["flat"] for v in out["trends"].values())
        and out.get("driver_exit") == 0
        and out.get("processed", 0) >= out.get("sent", 1)
    )
    return out


def plot(out: dict[str, Any], settings: SoakSettings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(SERIES), 1, figsize=(8, 2.1 * len(SERIES)), sharex=True)
    t_min = np.array([s["t_s"] for s in out["samples"]]) / 60
    for ax, (key, label) in zip(axes, SERIES, strict=True):
        ax.plot(t_min, [s[key] for s in out["samples"]], "o-", ms=3, label="sample")
        tr = out["trends"][key]
        slope, intercept = tr["fit"]
        fitted = t_min[t_min * 60 >= min(settings.warmup_s, t_min[-1] * 60)]
        ax.plot(fitted, slope * fitted * 60 + intercept, "--", label="fit")
        ax.axvspan(0, settings.warmup_s / 60, color="0.9", label="warm-up")
        verdict = "flat" if tr["flat"] else "GROWS"
        ax.set_ylabel(label, fontsize=8)
        ax.set_title(
            f"{label}: {verdict} (growth {tr['growth']:g} vs {tr['tolerance']:g})", fontsize=9
        )
    axes[-1].set_xlabel("minutes")
    axes[0].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"soak: word count at {out['rate']:,} lines/s ({settings.load:.0%} of capacity)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(out: dict[str, Any], settings: SoakSettings, image: str) -> str:
    rows: list[tuple[str, object]] = [
        ("result", "**OK**" if out["ok"] else "**FAILED**"),
        ("machine", out["machine"]),
        (
            "pipeline",
            "word count over a Redis stream (RedisStreamReceiver), both WALs on, "
            "standalone cluster: Master + 2 Workers, executors 2 x 2 cores; driver and "
            "executor JVMs with their 768 MiB heap committed at start (-Xms = -Xmx, "
            "AlwaysPreTouch)",
        ),
        ("capacity", f"{out['capacity']:,} lines/s ({out['capacity_from']})"),
        ("offered load", f"{out['rate']:,} lines/s ({settings.load:.0%} of capacity)"),
        (
            "duration",
            f"{settings.minutes:g} min, a sample every {settings.sample_s:g} s, "
            f"first {settings.warmup_s:g} s left out of the fits",
        ),
        ("lines sent / processed", f"{out.get('sent', 0):,} / {out.get('processed', 0):,}"),
        ("largest scheduling delay after the warm-up", f"{out.get('max_delay_ms')} ms"),
        ("command", f"`{out.get('command', 'make soak')}`"),
        ("driver exit after Ctrl-C", out.get("driver_exit")),
    ]
    for key, label in SERIES:
        tr = out["trends"][key]
        rows.append(
            (
                label,
                f"mean {tr['mean']:g}, slope {tr['slope_per_h']:g}/h, growth "
                f"{tr['growth']:g} (tolerance {tr['tolerance']:g}): "
                f"{'flat' if tr['flat'] else '**grows**'}",
            )
        )
    jvm = [x["driver_jvm_rss_mib"] for x in out["samples"] if "driver_jvm_rss_mib" in x]
    if jvm:
        rows.append(
            (
                "driver JVM RSS, first / last sample (MiB; not judged)",
                f"{jvm[0]:,.0f} / {jvm[-1]:,.0f}",
            )
        )
    rule = (
        "Flat: the fitted growth over the soak (slope x span) is at most the larger of 3 x the "
        "residuals' standard deviation and 5 % of the mean."
    )
    return f"## make soak\n\n{report.table(rows)}\n\n{rule}\n\n![soak]({image})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--sample-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=180.0)
    p.add_argument("--load", type=float, default=0.5, help="fraction of capacity offered (0.5)")
    p.add_argument("--capacity", type=float, default=None, help="lines/s; else measured")
    p.add_argument("--probe-records", type=int, default=300_000)
    p.add_argument("--record", action="store_true", help="RELIABILITY.md, BENCHMARKS.md, plot")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    settings = SoakSettings(
        minutes=a.minutes,
        sample_s=a.sample_s,
        warmup_s=a.warmup_s,
        load=a.load,
        capacity=a.capacity,
        probe_records=a.probe_records,
    )
    root = Path(tempfile.mkdtemp(prefix="spark-receivers-soak-"))
    print(f"soak run in {root}", flush=True)
    try:
        out = run(settings, root, say=lambda s: print(s, flush=True))
        out["command"] = " ".join(
            ["scripts/soak.py", *(argv if argv is not None else sys.argv[1:])]
        )
        image = PLOT if a.record else root / "soak.png"
        plot(out, settings, image)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    text = markdown(out, settings, "docs/img/soak.png")
    print(text, flush=True)
    if a.record:
        from bench.harness import write_benchmarks_md

        report.write_section("soak", text)
        write_benchmarks_md(report.ROOT / "BENCHMARKS.md", {"soak": text})
        print(f"wrote {report.RELIABILITY_MD}, BENCHMARKS.md and {PLOT}", flush=True)
    if a.json:
        print(json.dumps({k: v for k, v in out.items() if k != "samples"}, default=str))
    return 0 if out["ok"] else 1

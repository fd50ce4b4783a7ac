"""The soak: the word count at half its capacity for two hours; no leak in memory, disk or files.

On a standalone cluster (Master + 2 Workers) of its own, with a redis-server of its own
(:class:`reliability.rig.Rig`): the driver is ``reliability/soak_app.py`` (a word count over
a Redis stream, both WALs on). First the **capacity** is measured, unless ``--capacity``
gives it: a backlog of ``--probe-records`` lines is added at once and capacity = backlog /
the time until every line is acknowledged and its batch completed (the whole path: read,
WAL, keeper, AddBlock, batch). Then a producer offers ``--load`` (0.5) x capacity lines/s
for ``--minutes`` (120), and every ``--sample-s`` (15) the harness samples from /proc: the
RSS of the driver (its Python, JVM and Python workers) and of the executors (JVMs, Python
workers, block keepers), the checkpoint directory's size (both WALs), and the open file
descriptors of the driver and of the executors. The driver's and executors' JVMs start
with their heap committed and touched (``JVM_CONF``), so that their RSS does not grow while
the heap is sized.

**The rule tells a leak from warm-up.** The first half of the soak (the first hour of the
default two) is warm-up: caches fill, the JIT compiles, allocators settle; it is shown, not
judged. Over the **second half**, a least-squares line is fitted to each series; its slope
must be at most its limit (:data:`LIMITS_PER_H`: 10 MiB/h for the driver's and the
executors' RSS and for the WAL disk use, 10 per hour for open files). The slope is reported
with its spread (± 2 standard errors of the fitted slope). A leak of 10 MiB/h is 240 MiB a
day; a process that warmed up and then stays level passes, one still growing steadily in
its second hour fails, however much it grew before. The verdict is the fitted slope against
the limit; when the spread is wider than the limit (a noisy series: a 60 MiB garbage-collection
sawtooth alone blurs an hour's slope by about ± 10 MiB/h), the section says the run could not
tell, rather than hiding it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.record import REPO_ROOT, Recording, RunInfo, Section, add_record_arguments
from reliability import procs, report
from reliability.cluster import spark_home
from reliability.driver import IngestDriver, spark_env
from reliability.redis_source import Producer
from reliability.rig import Rig

__all__ = ["LIMITS_PER_H", "SECTION", "SoakSettings", "judge", "main", "render", "slope_fit"]

STREAM = "soak"
SERIES = (
    ("driver_rss_mib", "driver RSS", "MiB"),
    ("executor_rss_mib", "executors RSS", "MiB"),
    ("wal_mib", "checkpoint + WALs on disk", "MiB"),
    ("driver_fds", "driver open fds", "fds"),
    ("executor_fds", "executors open fds", "fds"),
)
LIMITS_PER_H = {
    "driver_rss_mib": 10.0,
    "executor_rss_mib": 10.0,
    "wal_mib": 10.0,
    "driver_fds": 10.0,
    "executor_fds": 10.0,
}
"""The largest slope each series may have over the second half of the soak, per hour."""
PLOT = REPO_ROOT / "docs" / "img" / "soak.png"
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
    minutes: float = 120.0
    sample_s: float = 15.0
    warmup_s: float = 180.0
    """Batches of the first seconds (the capacity probe's backlog) are left out of the
    largest scheduling delay."""
    load: float = 0.5
    capacity: float | None = None
    probe_records: int = 300_000
    batch_ms: int = 1000
    read_batch: int = 5000


QUICK = SoakSettings(minutes=3.0, sample_s=5.0, warmup_s=30.0, probe_records=30_000)
"""``--quick``: a smoke run (the rule applies, over 90 s it proves nothing)."""


# -- the rule ---------------------------------------------------------------------------------


def slope_fit(t_s: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Least-squares slope of ``y`` against ``t_s`` (seconds), per hour, with its standard
    error (per hour) and the fit's intercept; needs 3 points or more."""
    n = len(t_s)
    if n < 3:
        raise ValueError(f"a slope needs at least 3 samples, got {n}")
    t_mean = float(np.mean(t_s))
    sxx = float(np.sum((t_s - t_mean) ** 2))
    if sxx == 0:
        raise ValueError("the samples all have the same time")
    slope = float(np.sum((t_s - t_mean) * (y - np.mean(y)))) / sxx
    intercept = float(np.mean(y)) - slope * t_mean
    residuals = y - (slope * t_s + intercept)
    se = math.sqrt(float(np.sum(residuals**2)) / (n - 2) / sxx)
    return {"slope_per_h": slope * 3600, "se_per_h": se * 3600, "intercept": intercept}


def judge(samples: list[dict[str, float]], span_s: float) -> dict[str, dict[str, Any]]:
    """Each series of :data:`SERIES` under the rule: the slope over the second half of
    ``span_s`` at most its limit (see the module doc); the first half's slope beside it."""
    half = span_s / 2
    out: dict[str, dict[str, Any]] = {}
    for key, _, _ in SERIES:
        judged = [(s["t_s"], s[key]) for s in samples if s["t_s"] >= half and key in s]
        warm = [(s["t_s"], s[key]) for s in samples if s["t_s"] < half and key in s]
        entry: dict[str, Any] = {"limit_per_h": LIMITS_PER_H[key], "samples": len(judged)}
        if len(judged) >= 3:
            t, y = (np.array(v, dtype=float) for v in zip(*judged, strict=True))
            fit = slope_fit(t, y)
            entry |= {k: round(v, 3) for k, v in fit.items()}
            entry |= {"mean": round(float(np.mean(y)), 1), "from_s": float(t[0])}
            entry["ok"] = fit["slope_per_h"] <= LIMITS_PER_H[key]
        else:
            entry |= {"ok": False, "why": f"{len(judged)} samples in the second half (< 3)"}
        if len(warm) >= 3:
            t, y = (np.array(v, dtype=float) for v in zip(*warm, strict=True))
            entry["warmup_slope_per_h"] = round(slope_fit(t, y)["slope_per_h"], 3)
        out[key] = entry
    return out


# -- the run ----------------------------------------------------------------------------------


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


def _t(started: float) -> str:
    return f"{time.monotonic() - started:7.1f}s"


def run(settings: SoakSettings, root: Path, say: Any = print) -> dict[str, Any]:
    """One soak in ``root``; every figure of the section (see :func:`render`)."""
    out: dict[str, Any] = {"settings": asdict(settings)}
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    with Rig(root, STREAM, "soak") as rig:
        group = rig.group
        ckpt = root / "checkpoint"
        app = str(Path(__file__).with_name("soak_app.py"))
        args = ["--redis-url", rig.redis.url, "--checkpoint", str(ckpt)]
        args += ["--batch-ms", str(settings.batch_ms), "--read-batch", str(settings.read_batch)]
        env = spark_env(spark_home(), rig.cluster.root / "conf")
        env["PYTHONPATH"] = str(report.ROOT)
        driver = rig.keep_driver(
            IngestDriver(root / "driver", rig.cluster.master_url, args, JVM_CONF, env, app=app)
        )
        driver.start()
        wait_for(lambda: '"started"' in driver.log_text(), 300, "the soak app to start")
        say(f"{_t(started)} soak app started")
        capacity = settings.capacity
        if capacity is None:
            filler = rig.keep(Producer(rig.redis, STREAM, 0, words=True))
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
        producer = rig.keep(Producer(rig.redis, STREAM, rate, words=True, first=base))
        producer.start()
        soak_start, soak_wall_ms = time.monotonic(), int(time.time() * 1000)
        end = soak_start + settings.minutes * 60
        say(f"{_t(started)} soaking at {rate:,.0f} lines/s for {settings.minutes:g} min")
        while time.monotonic() < end:
            time.sleep(min(settings.sample_s, max(0.0, end - time.monotonic())))
            executors = trees(rig.cluster.executor_pids())
            dpids = driver.pids()
            jvms = [p for p in dpids if (procs.cmdline(p) or [""])[0].endswith("java")]
            sample = {
                "t_s": round(time.monotonic() - soak_start, 1),
                "driver_rss_mib": round(sum(map(procs.rss_bytes, dpids)) / 2**20, 1),
                "driver_jvm_rss_mib": round(sum(map(procs.rss_bytes, jvms)) / 2**20, 1),
                "executor_rss_mib": round(sum(map(procs.rss_bytes, executors)) / 2**20, 1),
                "wal_mib": round(du_bytes(ckpt) / 2**20, 2),
                "driver_fds": sum(map(procs.open_fds, dpids)),
                "executor_fds": sum(map(procs.open_fds, executors)),
                "load_1m": round(os.getloadavg()[0], 2),
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
    out["samples"] = samples
    out["seconds"] = round(time.monotonic() - started)
    out["trends"] = judge(samples, settings.minutes * 60)
    out["ok"] = bool(
        all(v["ok"] for v in out["trends"].values())
        and out.get("driver_exit") == 0
        and out.get("processed", 0) >= out.get("sent", 1)
    )
    return out


# -- the record -------------------------------------------------------------------------------


def plot(out: dict[str, Any], path: Path) -> None:
    """Every series over time, the second half's fit, the first half shaded (not judged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = SoakSettings(**out["settings"])
    half_min = settings.minutes / 2
    fig, axes = plt.subplots(len(SERIES), 1, figsize=(8, 2.1 * len(SERIES)), sharex=True)
    t_min = np.array([s["t_s"] for s in out["samples"]]) / 60
    for ax, (key, label, unit) in zip(axes, SERIES, strict=True):
        ax.plot(t_min, [s[key] for s in out["samples"]], "o-", ms=2, label="sample")
        tr = out["trends"][key]
        ax.axvspan(0, half_min, color="0.92", label="warm-up (not judged)")
        if "slope_per_h" in tr:
            xs = t_min[t_min >= half_min]
            ax.plot(xs, tr["slope_per_h"] / 60 * xs + tr["intercept"], "--", label="fit")
            title = (
                f"{label}: {tr['slope_per_h']:+.1f} ± {2 * tr['se_per_h']:.1f} {unit}/h "
                f"(limit {tr['limit_per_h']:g}): {'ok' if tr['ok'] else 'GROWS'}"
            )
        else:
            title = f"{label}: {tr.get('why', 'not judged')}"
        ax.set_ylabel(unit, fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[-1].set_xlabel("minutes")
    axes[0].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"soak: word count at {out['rate']:,} lines/s ({settings.load:.0%} of capacity)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def render(out: dict[str, Any]) -> str:
    """The soak's section of RELIABILITY.md from a run's raw data."""
    settings = SoakSettings(**out["settings"])
    rows: list[tuple[str, object]] = [
        ("result", "**OK**" if out["ok"] else "**FAILED**"),
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
            f"{settings.minutes:g} min, a sample every {settings.sample_s:g} s; judged: the "
            f"second half, from minute {settings.minutes / 2:g}",
        ),
        ("lines sent / processed", f"{out.get('sent', 0):,} / {out.get('processed', 0):,}"),
        ("largest scheduling delay after the warm-up", f"{out.get('max_delay_ms')} ms"),
        ("driver exit after Ctrl-C", out.get("driver_exit")),
    ]
    series = [
        "| series | slope over the second half (± 2 SE) | limit | first half (warm-up, not "
        "judged) | mean, second half | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for key, label, unit in SERIES:
        tr = out["trends"][key]
        warm = tr.get("warmup_slope_per_h")
        warm_text = "-" if warm is None else f"{warm:+,.1f} {unit}/h"
        if "slope_per_h" in tr:
            verdict = "ok" if tr["ok"] else "**grows**"
            if 2 * tr["se_per_h"] > tr["limit_per_h"]:
                verdict += " (the spread is wider than the limit: this run cannot tell)"
            series.append(
                f"| {label} | {tr['slope_per_h']:+,.1f} ± {2 * tr['se_per_h']:,.1f} {unit}/h "
                f"| ≤ {tr['limit_per_h']:g} {unit}/h | {warm_text} | {tr['mean']:,.1f} {unit} "
                f"| {verdict} |"
            )
        else:
            series.append(
                f"| {label} | - | ≤ {tr['limit_per_h']:g} {unit}/h | {warm_text} | - "
                f"| **not judged**: {tr.get('why')} |"
            )
    jvm = [x["driver_jvm_rss_mib"] for x in out["samples"] if "driver_jvm_rss_mib" in x]
    notes = []
    if jvm:
        notes.append(
            f"Driver JVM RSS, first / last sample (not judged): {jvm[0]:,.0f} / {jvm[-1]:,.0f} MiB."
        )
    rule = (
        "The rule: over the second half of the soak, a least-squares line through each "
        "series' samples; its slope must be at most the limit (a leak of 10 MiB/h is 240 MiB a "
        "day). The first half is warm-up: shown, not judged. ± 2 SE: twice the standard error "
        "of the fitted slope."
    )
    image = PLOT.relative_to(REPO_ROOT)
    return "\n\n".join([report.table(rows), "\n".join(series), rule, *notes, f"![soak]({image})"])


def _plot(out: dict[str, Any], info: RunInfo) -> None:
    plot(out, PLOT)
    print(f"wrote {PLOT.relative_to(REPO_ROOT)}")


SECTION = Section(
    name="soak",
    module="reliability.soak",
    title="make soak",
    render=render,
    file="RELIABILITY.md",
    also_write=_plot,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/soak.py", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke: 3 min, a sample every 5 s")
    p.add_argument("--minutes", type=float, help="length of the soak (120; quick 3)")
    p.add_argument("--sample-s", type=float, help="seconds between samples (15; quick 5)")
    p.add_argument("--warmup-s", type=float, help="left out of the largest delay (180)")
    p.add_argument("--load", type=float, default=0.5, help="fraction of capacity offered (0.5)")
    p.add_argument("--capacity", type=float, default=None, help="lines/s; else measured")
    p.add_argument("--probe-records", type=int, help="the capacity probe's backlog (300,000)")
    p.add_argument("--record", action="store_true", help="write RELIABILITY.md and the plot")
    p.add_argument("--keep", action="store_true", help="keep the run's directory")
    p.add_argument("--json", action="store_true", help="last line: the JSON summary")
    add_record_arguments(p, "RELIABILITY.md")
    a = p.parse_args(argv)
    a.no_write = a.no_write or not a.record
    base = QUICK if a.quick else SoakSettings()
    settings = SoakSettings(
        minutes=a.minutes or base.minutes,
        sample_s=a.sample_s or base.sample_s,
        warmup_s=a.warmup_s if a.warmup_s is not None else base.warmup_s,
        load=a.load,
        capacity=a.capacity,
        probe_records=a.probe_records or base.probe_records,
    )
    root = Path(tempfile.mkdtemp(prefix="spark-receivers-soak-"))
    print(f"soak run in {root}", flush=True)
    try:
        with Recording(SECTION, "python scripts/soak.py", argv, a) as rec:
            out = run(settings, root, say=lambda s: print(s, flush=True))
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(render(out), flush=True)
    rec.finish(out)
    if a.json:
        print(json.dumps({k: v for k, v in out.items() if k != "samples"}, default=str))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

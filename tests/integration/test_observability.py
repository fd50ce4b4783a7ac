"""Observability on a real local Spark: /metrics moves with the data, the status page in a
real headless Chromium, progress in Structured Streaming's shape, readable Spark UI jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from spark_receivers import StreamingConfig, StreamingContext
from spark_receivers.testing import CountingReceiver

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 90


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url + "metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def total(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def observed_context(spark, rate: int = 2_000, offsets: bool = False) -> StreamingContext:
    config = StreamingConfig(ui_enabled=True, ui_port=0, metrics_report_interval_ms=200)
    ssc = StreamingContext(spark, batch_interval_ms=500, config=config)
    ssc.receiver_stream(CountingReceiver(rate=rate, offsets=offsets)).foreach_batch(
        lambda df, t: df.count(), name="count"
    )
    return ssc


def progressed(ssc: StreamingContext, batches: int) -> bool:
    return len([p for p in ssc.recent_progress if p.num_input_rows > 0]) >= batches


def test_metrics_move_with_the_data(spark):
    ssc = observed_context(spark)
    ssc.start()
    try:
        url = ssc.status_page_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert wait_until(lambda: progressed(ssc, 1) and ssc.status().receiver(0).metrics, WAIT_S)
        before = scrape(url)
        seen = ssc.status().records_received
        assert wait_until(
            lambda: ssc.status().records_received > seen + 2_000 and progressed(ssc, 3), WAIT_S
        )
        after = scrape(url)
        for name in (
            "spark_receivers_records_received_total",
            "spark_receivers_blocks_received_total",
            "spark_receivers_bytes_received_total",
            "spark_receivers_batch_processing_seconds_count",
            "spark_receivers_batch_total_delay_seconds_count",
            "spark_receivers_records_processed_total",
            "spark_receivers_add_block_latency_seconds_count",
        ):
            assert total(after, name) > total(before, name), name
        key = (("receiver", "CountingReceiver-0"), ("stream", "0"))
        assert after[("spark_receivers_records_received_total", key)] >= seen
        active = tuple(sorted((*key, ("state", "ACTIVE"), ("executor", "driver"))))
        assert after[("spark_receivers_receiver_state", active)] == 1.0
        # The rate is over the last few seconds: on a busy machine one scrape can fall in a
        # quiet moment (seen beside stress-ng on 2026-11-27), so wait for a scrape that has it.
        rate = ("spark_receivers_input_rate_records_per_second", key)
        assert wait_until(lambda: scrape(url).get(rate, 0.0) > 0, WAIT_S)
        metrics = ssc.status().receiver(0).metrics
        assert metrics is not None and metrics.bytes > 0 and metrics.add_block_mean_ms
    finally:
        ssc.stop(graceful=False)
    assert ssc.status_page_url is None
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def test_progress_json_has_the_field_names_of_structured_streaming(spark):
    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 50).load()
        .writeStream.format("noop").trigger(processingTime="500 milliseconds").start()
    )  # fmt: skip
    try:
        assert wait_until(lambda: (query.lastProgress or {}).get("numInputRows", 0) > 0, WAIT_S)
        theirs = json.loads(query.lastProgress.json)
    finally:
        query.stop()
    ssc = observed_context(spark, rate=1_000, offsets=True)
    ssc.start()
    try:
        assert wait_until(lambda: progressed(ssc, 1), WAIT_S)
        progress = next(p for p in reversed(ssc.recent_progress) if p.num_input_rows > 0)
    finally:
        ssc.stop(graceful=False)
    ours = json.loads(progress.json())
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    for key in theirs:
        if theirs[key] is not None and key not in ("sources", "sink", "durationMs"):
            assert isinstance(ours[key], type(theirs[key])) or {
                type(ours[key]),
                type(theirs[key]),
            } <= {int, float}, key
    assert set(theirs["sources"][0]) - {"metrics"} <= set(ours["sources"][0])
    assert set(theirs["sink"]) <= set(ours["sink"])
    assert {"triggerExecution", "addBatch"} <= set(theirs["durationMs"]) & set(ours["durationMs"])
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.fullmatch(iso, theirs["timestamp"]) and re.fullmatch(iso, ours["timestamp"])
    source = ours["sources"][0]
    assert source["numInputRows"] == progress.num_input_rows > 0
    # store() metadata: the first and last offsets of the batch (equal when it held one store call)
    assert source["endOffset"]["offset"] >= source["startOffset"]["offset"] > 0


def test_spark_ui_shows_readable_job_descriptions(spark):
    descriptions: list[str] = []

    def describe(df, t) -> None:
        descriptions.append(spark.sparkContext.getLocalProperty("spark.job.description"))
        df.count()

    ssc = StreamingContext(spark, batch_interval_ms=500)
    ssc.receiver_stream(CountingReceiver(rate=500)).foreach_batch(describe, name="tally")
    ssc.start()
    try:
        assert wait_until(lambda: len(descriptions) >= 2, WAIT_S)
        store = spark.sparkContext._jsc.sc().statusStore()
        jobs = store.jobsList(None).iterator()
        described = []
        while jobs.hasNext():
            d = jobs.next().description()
            if d.isDefined():
                described.append(str(d.get()))
    finally:
        ssc.stop(graceful=False)
    batch = re.compile(r"Streaming batch \d\d:\d\d:\d\d(\.\d{3})? \[output op tally\]")
    assert all(batch.fullmatch(d) for d in descriptions), descriptions
    assert "Receiver 0: CountingReceiver-0 on executor driver" in described, described[-10:]
    assert any(batch.fullmatch(d) for d in described)


def test_the_status_page_in_a_real_headless_chromium(spark, tmp_path):
    from browser import chromium
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    ssc = observed_context(spark, rate=3_000, offsets=True)
    ssc.start()
    try:
        url = ssc.status_page_url
        assert url is not None
        assert wait_until(lambda: progressed(ssc, 2), WAIT_S)
        with chromium() as browser:  # raises (fails the test) when Chromium cannot start
            browser.get(url)
            wait = WebDriverWait(browser, 60, poll_frequency=0.2)
            wait.until(
                lambda b: (
                    float(b.find_element(By.ID, "chart-input-rate").get_attribute("data-max") or 0)
                    > 0
                )
            )
            wait.until(
                lambda b: "ACTIVE" in b.find_element(By.CSS_SELECTOR, "#receivers tbody").text
            )
            wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#batches tbody tr")) >= 2)
            streams = browser.find_element(By.CSS_SELECTOR, "#streams tbody").text
            assert "CountingReceiver-0" in streams and "batches" in streams
            points = browser.find_element(By.ID, "chart-processing-time").get_attribute(
                "data-points"
            )
            assert int(points) >= 2
            assert "offset" in browser.find_element(By.ID, "batches").text  # store() metadata
            assert browser.find_elements(By.CSS_SELECTOR, "#chart-total-delay line.interval")
            shot = tmp_path / "status-page.png"
            browser.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
            if os.environ.get("SPARK_RECEIVERS_SCREENSHOTS"):
                shutil.copy(shot, ROOT / "docs" / "img" / "status-page.png")
    finally:
        ssc.stop(graceful=False)


def test_the_status_page_opened_with_credentials_in_its_address_shows_data(tmp_path):
    """``http://user:secret@host:port/`` is how a browser sends basic auth from an address
    (issue 36): the page's requests must still reach the API (fetch() refuses addresses
    holding credentials, and relative ones inherit the page's)."""
    from browser import chromium
    from ingest_run import IngestRun
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    secret = "s3cret-page"
    run = IngestRun(
        [
            *("--source", "generator://?rate=500", "--sink", "console", "--progress", "lines"),
            *("--conf", f"spark.authenticate.secret={secret}"),
            *("--conf", "spark.receivers.ui.port=0", "--conf", "spark.ui.enabled=false"),
        ],
        tmp_path / "ingest.log",
    )
    try:
        text = run.wait_for(
            lambda t: re.search(r"status page (http://\S+/)", t), 240, "the status page"
        )
        url = re.search(r"status page (http://\S+/)", text).group(1)
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(url, timeout=10)  # the page needs the secret
        with_credentials = url.replace("http://", f"http://spark:{secret}@", 1)
        with chromium() as browser:
            browser.get(with_credentials)
            wait = WebDriverWait(browser, 90, poll_frequency=0.2)
            wait.until(
                lambda b: (
                    "ACTIVE" in b.find_element(By.CSS_SELECTOR, "#receivers tbody").text
                    or b.find_element(By.ID, "problem").text
                )
            )
            assert browser.find_element(By.ID, "problem").text == ""
            wait.until(
                lambda b: (
                    float(b.find_element(By.ID, "chart-input-rate").get_attribute("data-max") or 0)
                    > 0
                )
            )
            assert "GeneratorReceiver-0" in browser.find_element(By.CSS_SELECTOR, "#streams").text
            assert browser.find_element(By.ID, "problem").text == ""
    finally:
        run.stop()

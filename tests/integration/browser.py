"""Headless Chromium from the OS packages, driven by Selenium (no browser download, ever).

``scripts/services.sh install chromium`` (run by ``make test``) installs Debian's
``chromium`` and ``chromium-driver``. :func:`chromium` starts it with a fresh profile,
sandbox off (tests run as root), no network besides what the page asks of loopback,
and raises (a test failure, not a skip) when it cannot start.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("SPARK_RECEIVERS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SPARK_RECEIVERS_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1300",
)


@contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium driver of headless Chromium; quit (and its profile deleted) on exit."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise AssertionError(
                f"{path} is missing: run `scripts/services.sh install chromium` (make test does)"
            )
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="sr-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)

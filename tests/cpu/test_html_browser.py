"""The demo's HTML page in a real browser: Debian's chromium driven by selenium through the
system's chromedriver (nothing downloads a browser: selenium-manager is never run), headless,
offline, at a laptop's viewport. No console error; the first divergence is shown in its marked
row; the mma heatmap and k-block curve have a size; the stage table is visible. A screenshot is
saved beside the page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

pytestmark = pytest.mark.skipif(not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
                                reason=f"the browser test needs Debian's chromium at {CHROMIUM} and its driver at "
                                       f"{CHROMEDRIVER} (apt-get install chromium chromium-driver)")


def browser():
    """Headless chromium, offline, 1366x768, through the system's driver (selenium-manager never runs)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1366,768", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_window_size(1366, 768)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                                 "downloadThroughput": 0, "uploadThroughput": 0})
    return driver


def test_selenium_manager_is_never_asked(monkeypatch):
    """The service names the driver, so selenium does not look for one (SeleniumManager would)."""
    pytest.importorskip("selenium")
    from selenium.webdriver.common import selenium_manager

    def refuse(*_a, **_k):
        raise AssertionError("selenium-manager was run")

    monkeypatch.setattr(selenium_manager.SeleniumManager, "binary_paths", refuse)
    driver = browser()
    driver.quit()


def test_the_demo_page_in_chromium(tmp_path):
    page = tmp_path / "demo.html"
    proc = subprocess.run([sys.executable, "-m", "oracle", "compare", "--demo", "--quiet", "--html", str(page)],
                          cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 1 and page.is_file(), proc.stderr  # the demo diverges
    from selenium.webdriver.common.by import By

    driver = browser()
    try:
        driver.get(page.as_uri())
        assert driver.execute_script("return navigator.onLine") is False
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == []
        row = driver.find_element(By.CSS_SELECTOR, "#stages tr.first")
        assert row.get_attribute("data-stage") == "mma" and "first divergence" in row.text and row.is_displayed()
        assert driver.find_element(By.ID, "stages").is_displayed()
        assert "First divergence: mma" in driver.find_element(By.ID, "sentence").text
        for ident in ("heatmap-mma", "worst-mma", "kblocks-mma"):
            box = driver.execute_script("const r = document.getElementById(arguments[0]).getBoundingClientRect();"
                                        "return [r.width, r.height];", ident)
            assert box[0] > 100 and box[1] > 50, (ident, box)
            assert box[0] <= 1366, (ident, box)  # fits the laptop's width
        assert driver.execute_script("return document.querySelectorAll('#kblocks-mma polyline').length") == 2
        driver.find_element(By.CSS_SELECTOR, "button[data-copy]").click()  # the copy button runs without error
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
        shot = tmp_path / "demo.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        driver.quit()

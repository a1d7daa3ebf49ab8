"""Debian's chromium, headless, driven by Selenium through Debian's chromedriver (scripts/install.sh
dev installs both; Selenium is given their paths, so it never looks for a browser to download).

A page is opened with the network switched off (DevTools' offline mode, and a proxy that answers
nothing besides), and every request it made and every console message it logged are kept: a page
that needs the network shows up as a request here, whether it failed or not."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@dataclass
class Opened:
    driver: Any
    url: str
    seconds: float  # from asking for the page to its load event, as the client saw it
    console: list[dict[str, Any]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [entry for entry in self.console if entry["level"] == "SEVERE"]

    @property
    def beyond_the_file(self) -> list[str]:
        return [url for url in self.requests if url != self.url]

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)


@contextmanager
def chromium(width: int = 1000, height: int = 1400) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in CI: chromium refuses its sandbox there
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--proxy-server=http://127.0.0.1:9",  # nothing listens: a request that slips offline mode fails
        "--no-first-run",
        "--disable-background-networking",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, path: Path) -> Opened:
    driver.get_log("performance")  # what an earlier page left
    driver.get_log("browser")
    url = path.absolute().as_uri()
    start = time.perf_counter()
    driver.get(url)  # returns once the document's load event fired
    seconds = time.perf_counter() - start
    opened = Opened(driver, url, seconds, console=driver.get_log("browser"))
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            opened.requests.append(message["params"]["request"]["url"])
    return opened


def timeline_x(opened: Opened, node: str, kind: str, t: float, nth: int = 0) -> tuple[float, float]:
    """(where the browser drew `node`'s `nth` mark of `kind`, where `t` seconds after the command falls
    on the timeline's axis), in screen pixels: the page's scale read off its svg, the time from the
    caller (a run's record), so a mark drawn at the wrong time is off by its error times the scale."""
    found = opened.js(
        """const svg = document.querySelector('svg.timeline');
        const box = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal;
        const lane = [...svg.querySelectorAll('.lane')].find(l => l.dataset.node === arguments[0]);
        const mark = lane.querySelectorAll('.mark.' + arguments[1])[arguments[2]];
        const r = mark.querySelector('.shape').getBoundingClientRect();
        return [box.left, box.width, vb.width, +svg.dataset.x0, +svg.dataset.x1, +svg.dataset.t1,
                r.left + r.width / 2];""",
        node,
        kind,
        nth,
    )
    left, width, view, x0, x1, t1, drawn = found
    return drawn, left + (x0 + (x1 - x0) * t / t1) * width / view

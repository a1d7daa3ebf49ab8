"""`dlinfra report` of a 1,000-step, 8-node run (a chief, 6 workers, a ps; one worker restarted): the
page's size, the time to write it, and the time headless Chromium takes to open it offline, from
asking for the page to its load event (best and median of N opens, one browser). Goal: open < 2 s.

The run is recorded through the store's own layout (tests/report_runs.py), not trained: the page reads
the same records either way. Needs `bash scripts/install.sh dev` (chromium, chromedriver, Selenium)."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]
OPENS = 7


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["DLINFRA_HOME"] = str(Path(scratch) / "home")
        from browser import chromium, open_page
        from report_runs import recorded_run

        from dlinfra.runs.report_page import run_page

        run, _ = recorded_run(workers=6, steps=1000)
        start = time.perf_counter()
        html = run_page(run.id)
        written = time.perf_counter() - start
        page = Path(scratch) / "report.html"
        page.write_text(html, encoding="utf-8")
        size = page.stat().st_size
        opens = []
        with chromium() as driver:
            for _ in range(OPENS):
                opened = open_page(driver, page)
                assert not opened.errors and not opened.beyond_the_file, (opened.console, opened.requests)
                lanes = opened.js("return document.querySelectorAll('svg.timeline .lane').length")
                assert lanes == 8, lanes
                opens.append(opened.seconds)
    print(f"report of a 1000-step 8-node run: {size / 1024:.1f} KiB, written in {written:.2f} s")
    print(
        f"opened offline in headless Chromium: best {min(opens):.3f} s, "
        f"median {statistics.median(opens):.3f} s ({OPENS} opens; goal < 2 s)"
    )


if __name__ == "__main__":
    main()

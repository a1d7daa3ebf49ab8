"""`dlinfra report` of a real run: a local parameter-server cluster whose worker-1 is killed with
kill -9 mid-run and restarted, deployed once for the module and opened in headless Chromium with the
network off. The marks must sit where the run's own records (worker-1's restart history in the store)
put them, on the clock the deploy command started."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, open_page, timeline_x

from e2e.conftest import Live, kill_at, start_deploy
from support import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.slow]
STEPS = 600
VICTIM = "worker-1"


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Live:
    tmp = tmp_path_factory.mktemp("report-run")
    live = start_deploy(
        tmp, "--workers", "2", "--steps", str(STEPS), "--set", "training.checkpoint_every=100"
    )
    kill_at(live, VICTIM, 0.45, steps=STEPS)
    done = live.finish()
    assert done.returncode == 0, done.stdout + done.stderr
    return live


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def _page(live: Live, *args: str) -> Path:
    path = live.run_dir.parent.parent / f"report-{len(args)}.html"
    env = dict(os.environ, DLINFRA_HOME=str(live.home))
    result = run_cli("report", *args, "-o", str(path), env=env, cwd=live.home, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return path


def test_the_killed_workers_restart_sits_on_its_lane_at_the_time_its_record_gives(
    killed_run: Live, browser: Any
) -> None:
    page = open_page(browser, _page(killed_run, killed_run.run_dir.name))
    assert page.errors == [], page.console
    assert page.beyond_the_file == [], "the page works offline: it asked for nothing but itself"
    manifest = json.loads((killed_run.run_dir / "manifest.json").read_text())
    lanes = page.js("return [...document.querySelectorAll('svg.timeline .lane')].map(l => l.dataset.node)")
    assert lanes == manifest["nodes"] and sorted(lanes) == ["chief-0", "ps-0", "worker-0", "worker-1"], lanes
    history = killed_run.status(VICTIM)["restart_history"]
    assert [r["cause"] for r in history] == ["killed by signal 9"], history
    t0 = manifest["command_started"]
    drawn, expected = timeline_x(page, VICTIM, "restart", history[0]["restarted_at"] - t0)
    assert abs(drawn - expected) < 1.5, (drawn, expected)
    drawn, expected = timeline_x(page, VICTIM, "resumed", history[0]["resumed_at"] - t0)
    assert abs(drawn - expected - 2.5) < 1.5, (drawn, expected)  # its triangle spans x to x + 5
    others = page.js(
        "return document.querySelectorAll('.lane:not([data-node=\"worker-1\"]) .mark.restart').length"
    )
    assert others == 0
    result = page.js("return document.querySelector('table.result').innerText")
    assert "restarts\t1 (worker-1)" in result and f"steps\t{STEPS}" in result, result
    assert (
        page.js("return document.querySelectorAll('svg.chart polyline.series').length") == 2
    )  # examples/s, loss


def test_a_report_of_the_run_beside_itself_compares_them_offline(killed_run: Live, browser: Any) -> None:
    run_id = killed_run.run_dir.name
    page = open_page(browser, _page(killed_run, "--compare", run_id, run_id))
    assert page.errors == [] and page.beyond_the_file == []
    assert page.js("return document.querySelectorAll('section.run svg.timeline .lane').length") == 2 * 4

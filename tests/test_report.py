"""`dlinfra report` (issue 58): the page of a recorded run, written by the real CLI and opened in a real
headless Chromium with the network off. The runs are recorded through the store's own layout
(tests/report_runs.py); tests/e2e/test_report.py does the same for a real run with a node killed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, open_page, timeline_x
from report_runs import recorded_run

pytestmark = pytest.mark.slow
INJECTED = '<script>alert("run")</script><img src=x onerror=alert(2)>'
SECRET = "s3cr3t-value-of-a-token-81723"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def _report(cli: Any, tmp_path: Path, *args: str, **kwargs: Any) -> Path:
    path = tmp_path / "page.html"
    result = cli("report", *args, "-o", str(path), **kwargs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"report: {path}"
    return path


def test_a_done_runs_page_opens_offline_with_a_lane_per_node_and_the_restart_where_its_record_puts_it(
    cli: Any, home: Path, tmp_path: Path, browser: Any
) -> None:
    run, restart = recorded_run()
    assert restart is not None
    page = open_page(browser, _report(cli, tmp_path, run.id))
    assert page.errors == [], page.console
    assert page.requests == [page.url] and page.beyond_the_file == [], "it asked for nothing but itself"
    assert page.js("return document.scripts.length") == 0
    lanes = page.js("return [...document.querySelectorAll('svg.timeline .lane')].map(l => l.dataset.node)")
    assert lanes == run.manifest().nodes and len(lanes) == 8
    t0 = run.manifest().command_started
    assert t0 is not None
    for kind, at in (("restart", restart.restarted_at), ("fault", restart.failed_at)):
        drawn, expected = timeline_x(page, "worker-1", kind, at - t0)
        # the fault's cross is drawn from 3 units before its time to 5 after: its centre is 1 right
        assert abs(drawn - expected - (1 if kind == "fault" else 0)) < 1.5, (kind, drawn, expected)
    assert (
        page.js("return document.querySelectorAll('.lane[data-node=\"worker-0\"] .mark.restart').length") == 0
    )
    # worker-3's pause (8 s from 60 % of the run) spans its time on its lane: its middle at 4 s in
    pause = next(i for st in run.store().statuses(["worker-3"]).values() if st for i in st.incidents)
    drawn, expected = timeline_x(page, "worker-3", "incident", pause.at + pause.seconds / 2 - t0)
    assert abs(drawn - expected) < 1.5, (drawn, expected)
    text = page.js("return document.body.innerText")
    for shown in (
        "eval accuracy",
        "0.9700",
        "restart: worker-1 restarted (killed by signal 9)",
        "lived through\tpaused 1 (worker-3)",
        "paused: worker-3, its trainer stopped for 8.0 s",
        "tensorflow-cpu",
    ):
        assert shown in text, shown
    # preflight: a bar per node against the fleet's median, the slow worker drawn short
    widths = page.js(
        "return Object.fromEntries([...document.querySelectorAll('svg.preflight-gemm_gflops rect.bar')]"
        ".map(b => [b.dataset.node, b.getBoundingClientRect().width]))"
    )
    assert len(widths) == 8 and min(widths, key=widths.get) == "worker-2", widths


def test_the_offline_check_catches_a_page_that_reaches_out_or_logs_an_error(
    tmp_path: Path, browser: Any
) -> None:
    """The two checks above can fail: a page asking the network for an image is seen asking, offline."""
    page = tmp_path / "reaching.html"
    page.write_text('<html><body><img src="http://example.invalid/x.png"><script>console.error("x")</script>')
    opened = open_page(browser, page)
    assert opened.beyond_the_file == ["http://example.invalid/x.png"]
    assert opened.errors, opened.console


def test_a_failed_runs_page_leads_with_the_verdict_and_stacks_escaped_and_with_no_secret(
    cli: Any, home: Path, tmp_path: Path, browser: Any
) -> None:
    traceback = f'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: {INJECTED} {AWS_KEY}'
    run, _ = recorded_run(
        ended="FAILED",
        error=f"crashed: ps-0 exited with code 1 {INJECTED}",
        traceback=traceback,
        log_lines=[f"token {SECRET} in a log line", f"key {AWS_KEY}", "the last line"],
        restart=None,
    )
    path = _report(cli, tmp_path, run.id, extra_env={"MY_API_TOKEN": SECRET})
    html = path.read_text()
    assert SECRET not in html and AWS_KEY not in html
    assert "<script" not in html and "<img" not in html
    assert html.count("&lt;script&gt;alert(&quot;run&quot;)&lt;/script&gt;") >= 2  # the error, the traceback
    page = open_page(browser, path)
    assert page.errors == [] and page.beyond_the_file == []
    assert page.js("return document.scripts.length + document.images.length") == 0
    headings = page.js("return [...document.querySelectorAll('h2')].map(h => h.innerText)")
    assert headings[0] == "Verdict: crashed" and headings[1] == "Result", headings
    verdict = page.js("return document.querySelector('section.verdict').innerText")
    assert "ValueError" in verdict and "the last line" in verdict and "***" in verdict
    assert 'alert("run")' in verdict, "the injected text is shown as text"
    drawn = page.js("return document.querySelectorAll('.lane[data-node=\"ps-0\"] .mark.fault').length")
    assert drawn == 1, "the failure on the failed node's lane"


def test_stopped_and_script_runs_and_runs_side_by_side(
    cli: Any, home: Path, tmp_path: Path, browser: Any
) -> None:
    stopped, _ = recorded_run(ended="STOPPED", workers=2, restart=None)
    script, _ = recorded_run(script=True, workers=2)
    page = open_page(browser, _report(cli, tmp_path, stopped.id))
    assert page.errors == [] and page.beyond_the_file == []
    assert page.js("return document.querySelector('h1 .status').innerText") == "STOPPED"
    page = open_page(browser, _report(cli, tmp_path, script.id))
    assert "script time" in page.js("return document.querySelector('table.result').innerText")
    path = tmp_path / "both.html"
    result = cli("report", "--compare", stopped.id, script.id, "-o", str(path))
    assert result.returncode == 0, result.stderr
    page = open_page(browser, path)
    assert page.errors == [] and page.beyond_the_file == []
    sections = page.js("return [...document.querySelectorAll('section.run')].map(s => s.dataset.run)")
    assert sections == [stopped.id, script.id]
    assert page.js("return document.querySelectorAll('section.run svg.timeline .lane').length") == 2 * 4
    assert page.js("return document.querySelectorAll('svg.chart polyline.series').length") == 1, (
        "the one run that trained to its end has a throughput series"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("no-such-run-20260101-000000-abcd",), "not found"),
        (("--compare", "@last"), "name two runs or more"),
        (("@last", "@last~1"), "one run per page"),
    ],
)
def test_bad_input_is_one_message_and_exit_2(
    cli: Any, home: Path, tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    recorded_run(workers=1, restart=None)
    result = cli("report", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.html")), "nothing written"
    assert re.search(r"Fix:", result.stderr)

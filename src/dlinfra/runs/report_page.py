"""`dlinfra report`: one self-contained HTML page of a run, or of runs side by side. It gathers what
`show`, `status` and `compare` gather, through their own functions, and the result deploy printed
(watching.recorded_outcome, runs.results); it adds pictures of it (runs.charts), never new figures.

The page opens offline: styles inline, no script, and a Content-Security-Policy that lets it load
nothing. Every text from the run (a name, an error, a stack) is escaped; nothing is shown that
`show`, `status` or deploy's output would not print (logs are masked as deploy masks them)."""

from __future__ import annotations

import statistics
from html import escape
from typing import Any

from dlinfra.node.masked_log import masker
from dlinfra.runs import charts, compare
from dlinfra.runs.charts import Lane, Mark
from dlinfra.runs.preflight import JUDGED
from dlinfra.runs.preflight import table as preflight_table
from dlinfra.runs.records import NodeState
from dlinfra.runs.reports import run_cost, run_details, run_status, stored_stacks
from dlinfra.runs.results import cost_line, input_bound, restart_lines, result_rows
from dlinfra.runs.run import Run
from dlinfra.runs.startup import training_node
from dlinfra.watching import Outcome, recorded_outcome

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:960px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}td.v{text-align:right}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
.status{font-weight:bold;padding:1px 6px;border-radius:3px;color:#fff}.DONE{background:#2a7}
.FAILED{background:#c33}.STOPPED{background:#c90}.other{background:#68a}
.verdict{border:2px solid #c33;padding:8px 12px;background:#fff5f5}.none{color:#777}
svg text{font:11px system-ui,sans-serif;fill:#333}.grid{stroke:#eee}.life{fill:#cfe3f5}
.tick{stroke:#555}.checkpoint .shape{fill:#2ca02c}.fault .shape{stroke:#d62728;stroke-width:2.5;fill:#d62728}
.restart .shape{fill:#ff7f0e}.resumed .shape{fill:#1f77b4}.done .shape{fill:#333}
.straggler .shape{fill:#9467bd}.incident .shape{fill:#ff7f0e;fill-opacity:.45}.bar{fill:#9cc3e6}
.median{stroke:#d62728;stroke-dasharray:4 3}
.legend-key span{margin-right:14px}.runs{display:grid;grid-template-columns:1fr;gap:8px}
"""
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
LEGEND = (
    '<p class="legend-key"><span>| phase</span><span style="color:#2ca02c">■ checkpoint</span>'
    '<span style="color:#d62728">✕ fault</span><span style="color:#ff7f0e">● restart</span>'
    '<span style="color:#1f77b4">▶ training again</span><span>▮ done</span>'
    '<span style="color:#9467bd">● straggler</span><span style="color:#ff7f0e">▬ lived through (a pause, '
    "the store out)</span> (hover a mark for what and when)</p>"
)


def run_page(ref: str | None) -> str:
    """The page of one run."""
    run = Run.open(ref)
    outcome = recorded_outcome(run)
    return _page(f"dlinfra report: {run.id}", _run_sections(run, outcome))


def compare_page(refs: list[str]) -> str:
    """Runs side by side: compare's table, their throughput on one chart, then each run's timeline."""
    rows = compare.compare(refs)
    cells = [compare.cells(r) for r in rows]
    table = _table(
        [("", *(r["label"] for r in rows))]
        + [(name, *(c[i] for c in cells)) for i, name in enumerate(compare.COLUMNS) if i]
    )
    legend = "".join(f"<li>{escape(r['label'])} = {escape(r['run'])}</li>" for r in rows)
    notes = "".join(
        f"<li>packages, {escape(r['label'])} against {escape(rows[0]['label'])}: "
        f"{escape(', '.join(r['packages_vs_first']))}</li>"
        for r in rows[1:]
        if r["packages_vs_first"]
    )
    series = [
        (r["label"], [(t - r["series"][0][0], eps) for t, eps in r["series"]]) for r in rows if r["series"]
    ]
    parts = [
        f"<h1>dlinfra report: {len(rows)} runs side by side</h1>",
        f"<ul>{legend}</ul>{table}<ul>{notes}</ul>",
        "<h2>Throughput</h2>",
        charts.line_chart(series, "seconds since the first step", "examples/s"),
    ]
    for r in rows:
        run = Run.open(r["run"])
        outcome = recorded_outcome(run)
        parts.append(f'<section class="run" data-run="{escape(run.id)}">')
        parts.append(f"<h2>{escape(r['label'])}: {_badge(outcome.state)} timeline</h2>")
        parts.append(charts.timeline(lanes(run, outcome), outcome.wall_seconds) + "</section>")
    return _page(f"dlinfra report: {', '.join(r['run'] for r in rows)}", [LEGEND, *parts])


def _page(title: str, sections: list[str]) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(sections)
        + "</body></html>\n"
    )


def _badge(state: str) -> str:
    css = state if state in ("DONE", "FAILED", "STOPPED") else "other"
    return f'<span class="status {css}">{escape(state)}</span>'


def _table(rows: list[tuple[str, ...]], css: str = "") -> str:
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=v' if i else ''}>{escape(str(c))}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f'<table class="{css}">{body}</table>'


def _pre(lines: list[str]) -> str:
    return f"<pre>{escape(chr(10).join(lines))}</pre>" if lines else ""


def _run_sections(run: Run, outcome: Outcome) -> list[str]:
    details = run_details(run.id)
    status = run_status(run.id)
    manifest = run.manifest()
    metrics = run.store().metrics()
    mode = metrics.mode if metrics else ("script" if run.spec().training.command else "program")
    head = (
        f"<h1>run {escape(run.id)} {_badge(outcome.state)}</h1><p>target {escape(manifest.target)} · "
        f"{escape(manifest.strategy)} · {escape(mode)} mode · created {escape(manifest.created)}</p>"
    )
    sections = [head]
    if outcome.state == "FAILED":  # what went wrong comes first: the verdict, then the stacks
        sections.append(_failure(run, outcome))
    sections += [
        "<h2>Result</h2>",
        _table([(k, v) for k, v in result_rows(outcome)], "result"),
        _pre(restart_lines(outcome)),
        "<h2>Timeline</h2>",
        LEGEND,
        charts.timeline(lanes(run, outcome), outcome.wall_seconds),
        "<h2>Throughput and loss</h2>",
        _series(metrics.examples_per_sec_series if metrics else [], manifest.command_started, outcome),
        charts.line_chart(
            [("loss", [(float(s), v) for s, v in (metrics.loss_series if metrics else [])])], "step", "loss"
        ),
        "<h2>Input wait</h2>",
        _input_wait(metrics.input_wait if metrics else None, status["nodes"]),
        "<h2>Preflight</h2>",
        _preflight(run, details.get("preflight")),
        "<h2>Stragglers</h2>",
        _pre([s.says() for s in outcome.stragglers]) or '<p class="none">no straggler named</p>',
        "<h2>Cost</h2>",
        _cost(run),
        "<h2>Environment</h2>",
        _environment(details),
        "<h2>Model and TensorBoard events</h2>",
        _links(details),
    ]
    return sections


def _failure(run: Run, outcome: Outcome) -> str:
    """The verdict, where each node waits, the traceback and stacks: masked as deploy masks a log."""
    marker, mask = run.store().marker(), masker()
    verdict = marker.verdict if marker and marker.verdict else "failed"
    parts = [
        f'<section class="verdict"><h2>Verdict: {escape(verdict)}</h2>',
        f"<p>node {escape(outcome.failed_node or '-')}: {escape(mask(outcome.error or ''))}</p>",
    ]
    if marker and marker.stacks:
        parts.append("<h3>Where each node waits</h3>")
        parts.append(_table([(node, mask(said)) for node, said in sorted(marker.stacks.items())]))
    if marker and marker.traceback:
        parts.append("<h3>Traceback</h3>" + _pre(mask(marker.traceback).splitlines()))
    parts.append("<h3>Stacks</h3>" + _pre([mask(line) for line in stored_stacks(run.id, None)]))
    if outcome.log_tail:
        parts.append(f"<h3>Last lines of {escape(outcome.failed_node or '')}'s log</h3>")
        parts.append(_pre(outcome.log_tail))
    return "".join(parts) + "</section>"


def lanes(run: Run, outcome: Outcome) -> list[Lane]:
    """Each node's lane on the command's clock: its lives, startup phases, the latest checkpoint,
    faults, restarts, what it lived through and its end, where the run's records put them."""
    manifest, store = run.manifest(), run.store()
    t0 = manifest.command_started or 0.0
    statuses = store.statuses(manifest.nodes)
    out = {name: _lane(name, st, t0, outcome.wall_seconds) for name, st in statuses.items()}
    for r in outcome.restarts:
        if r.node in out:
            out[r.node].marks.append(Mark(r.failed_at - t0, "fault", r.cause))
            out[r.node].marks.append(Mark(r.restarted_at - t0, "restart", f"life {r.life} began"))
            if r.resumed_at is not None:
                out[r.node].marks.append(Mark(r.resumed_at - t0, "resumed", "training again"))
    marker = store.marker()
    if marker and marker.marker == "FAILED" and marker.node in out:
        out[marker.node].marks.append(
            Mark(marker.time - t0, "fault", f"FAILED: {marker.verdict or 'failed'}")
        )
    pointer = store.latest_checkpoint()
    chief = training_node(manifest.strategy)
    if pointer and pointer.time and chief in out:
        out[chief].marks.append(
            Mark(pointer.time - t0, "checkpoint", f"latest checkpoint, step {pointer.step}")
        )
    for s in outcome.stragglers:
        if s.node in out:
            out[s.node].marks.append(Mark(s.since - t0, "straggler", f"straggler {s.ratio:.1f}x"))
    for i in outcome.incidents:  # lived through in the same life: a span, not a cross
        if i.node in out:
            out[i.node].marks.append(Mark(i.at - t0, "incident", f"{i.kind} {i.seconds:.1f} s", i.seconds))
    return list(out.values())


def _lane(name: str, st: NodeState | None, t0: float, end: float) -> Lane:
    if st is None:
        return Lane(name, None, None)
    lane = Lane(name, st.first_started - t0, (st.heartbeat - t0) if st.finished else end)
    lane.marks = [Mark(at - t0, "phase", phase) for phase, at in st.phases.items()]
    if st.finished:
        lane.marks.append(Mark(st.heartbeat - t0, "done", st.state))
    return lane


def _series(series: list[tuple[float, int, float]], t0: float | None, outcome: Outcome) -> str:
    start = t0 if t0 is not None else (series[0][0] if series else 0.0)
    return charts.line_chart(
        [("examples/s", [(t - start, eps) for t, _, eps in series])],
        "seconds after the command",
        "examples/s",
        x_max=outcome.wall_seconds if t0 is not None else 0.0,
    )


def _input_wait(wait: float | None, nodes: dict[str, dict[str, Any] | None]) -> str:
    per_node = {
        n: 100 * st["input_wait"] for n, st in nodes.items() if st and st.get("input_wait") is not None
    }
    overall = f"<p>the run's steps waited {wait:.0%} of their time for input</p>" if wait is not None else ""
    advice = f"<p><b>{escape(said)}</b></p>" if (said := input_bound(wait)) else ""
    drawn = charts.bars(per_node, "% of step time", "bars input-wait")
    return overall + advice + drawn or '<p class="none">no input wait recorded</p>'


def _preflight(run: Run, found: dict[str, Any] | None) -> str:
    if not found:
        return '<p class="none">no preflight round (cluster.preflight off, or a run from before it)</p>'
    store = run.store()
    records, verdict = store.preflight_round(found["round"])
    rows = preflight_table(list(records.values()), verdict)
    parts = [
        f"<p>round {found['round']}: {escape(found['says'] or 'no verdict')}</p>",
        _table([tuple(r) for r in rows]),
    ]
    for figure, (label, unit) in JUDGED.items():
        values = {n: f[figure] for n, f in found["nodes"].items() if f.get(figure) is not None}
        if len(values) >= 2:
            median = statistics.median(values.values())
            parts.append(f"<h3>{escape(label)} against the fleet's median ({median:.3g} {escape(unit)})</h3>")
            parts.append(charts.bars(values, unit, f"bars preflight-{figure}"))
    return "".join(parts)


def _cost(run: Run) -> str:
    said = cost_line(run_cost(run, run.manifest()))
    estimate = compare.row(run)
    cells = compare.cells(estimate)
    return (
        (f"<p>{escape(said)}</p>" if said else '<p class="none">nothing billed (a local run)</p>')
        + f"<p>compare's estimate: ${escape(cells[compare.COLUMNS.index('cost $')])} "
        f"(instance-hours x on-demand prices of {escape(estimate['price_table'])})</p>"
    )


def _environment(details: dict[str, Any]) -> str:
    manifest = details["manifest"]
    parts = []
    if details.get("versions"):
        parts.append(f"<p>versions: {escape(str(details['versions']))}</p>")
    for flavor, pin in sorted(manifest.get("environment", {}).items()):
        parts.append(
            f"<h3>{escape(flavor)}: lock {escape(pin['sha256'][:12])} ({escape(pin['file'])}, "
            f"{escape(pin['platform'])})</h3>"
        )
        parts.append(_table(sorted(pin["packages"].items()), "packages"))
    return "".join(parts) or '<p class="none">no environment lock recorded</p>'


def _links(details: dict[str, Any]) -> str:
    rows = [
        ("model", details.get("model") or details.get("no_model") or "-"),
        ("TensorBoard events", details["tensorboard"]),
        ("open them with", details["tensorboard_command"]),
        ("store", details["store"]),
        ("run dir", details["run_dir"]),
    ]
    body = "".join(f"<tr><td>{escape(k)}</td><td>{_link(v)}</td></tr>" for k, v in rows)
    return f'<table class="links">{body}</table>'


def _link(value: str) -> str:
    """A file:// URI as a link a browser opens; anything else (s3://, a command) as text to copy."""
    if value.startswith("file://"):
        return f'<a href="{escape(value, quote=True)}">{escape(value)}</a>'
    return f"<code>{escape(value)}</code>"

"""The sizing advice as text: one summary for plan and validate, the whole curve for `advise`."""

from __future__ import annotations

from typing import Any

from dlinfra.sizing.advice import Advice
from dlinfra.sizing.predict import Point

SHOWN_ROWS = 16  # workers shown in the curve; past it, powers of two and the spec's own count
BOUNDS = {
    "compute": "C",
    "this machine's cores": "M",
    "worker NIC": "W",
    "ps NIC": "P",
    "TCP flow": "F",
    "all-reduce": "R",
}


def point_text(point: Point, known: bool) -> str:
    shape = f"{point.workers} worker{'s' * (point.workers != 1)}" + (f", {point.ps} ps" if point.ps else "")
    up_to = "" if known else "at most "
    cost = point.usd_per_1000_steps
    dollars = f", ${cost:.3g} per 1000 steps (${point.usd_per_hour:.2f}/h)" if cost is not None else ""
    return (
        f"{shape}: {up_to}{point.steps_per_s:,.3g} steps/s, {up_to}{point.examples_per_s:,.0f} examples/s, "
        f"bound: {point.bound}{dollars}"
    )


def summary(advice: Advice) -> list[str]:
    """A few lines: the prediction, the knee warning and a cheaper shape, where the figures come from."""
    lines = [f"sizing: {point_text(advice.spec, advice.compute_known)}"]
    if advice.past_knee and advice.better:
        lines.append(f"warning: {advice.past_knee}")
        lines.append(f"  cheapest within 10% of the best: {point_text(advice.better, True)}")
    lines.extend(f"  {line}" for line in advice.assumptions)
    return lines


def curve_table(advice: Advice) -> list[str]:
    """Rows: workers; columns: parameter servers (one column under mirrored)."""
    ps_counts = sorted({p.ps for p in advice.curve})
    by_shape = {(p.workers, p.ps): p for p in advice.curve}
    workers = sorted({p.workers for p in advice.curve})
    if len(workers) > SHOWN_ROWS:
        keep = {w for w in workers if w & (w - 1) == 0} | {advice.spec.workers, workers[-1]}
        workers = [w for w in workers if w in keep]
    width = 24 if advice.spec.usd_per_hour is not None else 14
    head = "workers  " + "".join(f"{f'{p} ps' if p else 'examples/s':<{width}}" for p in ps_counts)
    lines = [head]
    for w in workers:
        cells = []
        for p in ps_counts:
            point = by_shape[(w, p)]
            cost = point.usd_per_1000_steps
            mark = "*" if (w, p) == (advice.spec.workers, advice.spec.ps) else " "
            text = f"{point.examples_per_s:>9,.0f} {BOUNDS[point.bound]}" + (f" ${cost:.3g}" if cost else "")
            cells.append(f"{mark}{text:<{width - 1}}")
        lines.append(f"{w:>7}  " + "".join(cells))
    lines.append(
        "examples/s, the bound (C compute, M this machine's cores, W worker NIC, P ps NIC, F one TCP flow, "
        "R all-reduce)"
        + (", $ per 1000 steps" if advice.spec.usd_per_hour is not None else "")
        + "; * the spec"
    )
    return lines


def history_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Each recorded run: measured against predicted examples/s, and the error."""
    if not runs:
        return ["no runs recorded yet: every run of this model records its throughput beside the prediction"]
    lines = [f"{'run':<44} {'shape':<20} {'measured':>10} {'predicted':>10} {'error':>7}"]
    errors = []
    for r in runs:
        shape = f"{r['workers']} workers, {r['ps']} ps" if r.get("ps") else f"{r['workers']} mirrored"
        predicted = r.get("predicted_examples_per_s")
        error = (r["examples_per_s"] / predicted - 1) if predicted else None
        if error is not None:
            errors.append(abs(error))
        err = f"{error:+.0%}" if error is not None else "-"
        lines.append(
            f"{r['run_id']:<44} {shape:<20} {r['examples_per_s']:>10,.0f} {predicted or 0:>10,.0f} {err:>7}"
        )
    if errors:
        lines.append(f"mean absolute error {sum(errors) / len(errors):.0%} over {len(errors)} runs")
    return lines

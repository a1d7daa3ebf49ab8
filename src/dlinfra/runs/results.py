"""A run's result as rows of text: what deploy's result table prints and the report page shows, from
one Outcome (watching), so the terminal and the page can never disagree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlinfra.runs import incidents, restarts
from dlinfra.runs.cells import mean_sd, num
from dlinfra.runs.records import NO_MODEL_SAVED, Metrics
from dlinfra.runs.reports import run_cost
from dlinfra.runs.startup import describe

if TYPE_CHECKING:
    from dlinfra.watching import Outcome


def result_rows(outcome: Outcome) -> list[tuple[str, str]]:
    """(metric, value) rows of the result: a Program's figures, or what a script reported."""
    m = outcome.metrics
    if m is not None and m.mode == "script":
        return _script_rows(outcome, m)
    return [
        ("strategy", m.strategy if m else "-"),
        ("workers / ps", f"{m.workers} / {m.ps}" if m else "- / -"),
        ("replicas · global batch", f"{num(m.replicas)} · {num(m.global_batch)}" if m else "-"),
        *([("loss", m.loss), ("optimizer", m.optimizer or "-")] if m and m.loss else []),
        ("learning rate", _learning_rate(m)),
        ("precision", ("mixed_float16" if m.mixed_precision else "float32") if m else "-"),
        ("steps", num(m.steps if m else None)),
        ("global steps/s", mean_sd(m.global_steps_per_sec if m else None)),
        ("examples/s", mean_sd(m.examples_per_sec if m else None, "{:.0f}")),
        ("input wait", num(m.input_wait if m else None, "{:.0%} of step time")),
        ("training time", num(m.train_seconds if m else None, "{:.1f} s")),
        ("total time", f"{outcome.wall_seconds:.1f} s"),
        ("command to first step", num(outcome.seconds_to_first_step, "{:.1f} s")),
        ("startup (s after the command)", describe(outcome.startup) or "-"),
        ("restarts", restarts.summary(outcome.restarts)),
        *_lived_through(outcome),
        *([("cost", spent)] if (spent := outcome_cost(outcome)) else []),
        *_evaluation(m),
    ]


def outcome_cost(outcome: Outcome) -> str | None:
    """The run's cost at its plan's prices (see cost_line), for its result."""
    line = cost_line(run_cost(outcome.run, outcome.run.manifest()))
    return line.removeprefix("cost: ") if line else None


def cost_line(cost: dict[str, Any]) -> str | None:
    """What a run has cost so far at its plan's prices, and its cap: None where nothing is billed."""
    if cost.get("usd_spent") is None:
        return None
    cap = f"; cluster.max_cost ${cost['max_cost']:g}" if cost.get("max_cost") else ""
    return f"cost: ${cost['usd_spent']:.4f} at ${cost['usd_per_hour']:.3f}/h since the nodes started{cap}"


def _learning_rate(m: Metrics | None) -> str:
    if m is None:
        return "-"
    if m.learning_rate is None:
        return "the optimizer's schedule" if m.optimizer else "-"
    return f"{m.learning_rate:g}, scaling {m.lr_scaling}"


def _evaluation(m: Metrics | None) -> list[tuple[str, str]]:
    """The program's eval loss and metrics by its names (an older run's: its accuracy alone)."""
    if m is None or not m.scalars:
        return [("eval accuracy", num(m.eval_accuracy if m else None, "{:.4f}"))]
    return [(name.replace("eval_", "eval ", 1), f"{value:.4f}") for name, value in m.scalars.items()]


def _script_rows(outcome: Outcome, m: Metrics) -> list[tuple[str, str]]:
    """A script run: what it reported, under its own names; what it did not report is said so."""
    if m.steps is None:
        steps = "unknown (the script reported none: dlinfra.report)"
    else:
        steps = f"{m.steps}" + (" (from its TensorBoard scalars)" if m.progress == "tensorboard" else "")
    return [
        ("strategy", m.strategy),
        ("workers / ps", f"{m.workers} / {m.ps}"),
        ("steps", steps),
        ("model", NO_MODEL_SAVED if m.no_model else ", ".join(m.models) or "-"),
        *((name, f"{value:.6g}") for name, value in sorted(m.scalars.items())),
        ("script time", f"{m.train_seconds:.1f} s"),
        ("total time", f"{outcome.wall_seconds:.1f} s"),
        ("command to first step", num(outcome.seconds_to_first_step, "{:.1f} s")),
        ("restarts", restarts.summary(outcome.restarts)),
        *_lived_through(outcome),
        *([("cost", spent)] if (spent := outcome_cost(outcome)) else []),
    ]


def _lived_through(outcome: Outcome) -> list[tuple[str, str]]:
    """Only for a run that met such a fault: a run without one keeps the README's table of rows."""
    return [("lived through", incidents.summary(outcome.incidents))] if outcome.incidents else []


def restart_lines(outcome: Outcome) -> list[str]:
    """Each restart of the run, one line each (the from-scratch ones loudly, on a line of their own),
    then each fault it lived through without a restart."""
    return [
        *(restarts.scratch_line(r) for r in outcome.restarts if r.from_scratch),
        *(f"restart: {restarts.line(r)}" for r in outcome.restarts),
        *map(incidents.line, outcome.incidents),
    ]


INPUT_BOUND = 0.10  # a share of step time waiting on input above which input is the bottleneck


def input_bound(wait: float | None) -> str | None:
    """What to say of a run whose steps waited on input for more than INPUT_BOUND of their time."""
    if wait is None or wait <= INPUT_BOUND:
        return None
    return (
        f"input-bound: steps waited {wait:.0%} of their time for data, so faster accelerators would idle "
        "too. Fix: more, smaller shards per worker (`dlinfra data pack --shards`), cheaper parsing in "
        "train_data (decode once, at pack time), or an instance type with more CPUs for the pipeline"
    )

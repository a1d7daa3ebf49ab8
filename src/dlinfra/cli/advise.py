"""`dlinfra advise`: how many workers and parameter servers, predicted from the spec; `dlinfra
profile`: the step time the prediction needs, measured here (the only one of the two that loads
TensorFlow)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dlinfra.cli.console import err, out
from dlinfra.cli.loading import load_checked
from dlinfra.cli.options import ALL_OVERRIDES, JsonOpt, SpecArg, with_overrides
from dlinfra.errors import DlinfraError, SpecError

if TYPE_CHECKING:
    from dlinfra.runs.layout.sizing import SizingHistory
    from dlinfra.sizing.advice import Advice
    from dlinfra.spec.loading import Overrides
    from dlinfra.spec.model import Spec


def readable_history(spec: Spec, remote: bool = True) -> SizingHistory | None:
    """The sizing history, or None (with a warning) where it cannot be read: advice never needs it.
    `remote`: an s3:// one too (not for `validate`, which reaches no network)."""
    from dlinfra.runs.run import home
    from dlinfra.sizing.advisor import history_of

    history = history_of(spec, home())
    if not remote and not history.uri.startswith("file://"):
        return None
    try:
        history.runs("-")  # one read: a bucket without credentials fails here, not mid-advice
    except DlinfraError as exc:
        err.print(f"warning: the sizing history at {history.uri} was not read: {exc}", markup=False)
        return None
    return history


def advice_for(spec: Spec, remote: bool = True) -> Advice | str:
    from dlinfra.sizing.advisor import sizing_advice

    return sizing_advice(spec, readable_history(spec, remote))


def summary_lines(spec: Spec, remote: bool = True) -> list[str]:
    """plan's and validate's few lines (a history that cannot be read stops here: exit 2)."""
    from dlinfra.cli.advise_view import summary

    advice = advice_for(spec, remote)
    return [advice] if isinstance(advice, str) else summary(advice)


def print_summary(spec: Spec, remote: bool = True) -> None:
    for line in summary_lines(spec, remote):
        out.print(line, markup=False, highlight=False)


@with_overrides(*ALL_OVERRIDES)
def advise(
    spec: SpecArg = None,
    history: Annotated[
        bool, typer.Option("--history", help="The model's recorded runs: measured against predicted.")
    ] = False,
    as_json: JsonOpt = False,
    *,
    overrides: Overrides,
) -> None:
    """Predicted throughput, its bound and its cost for the spec's workers and ps, and the curve
    around them (1..2N workers, 1..4 ps): where one more worker stops paying."""
    from dlinfra.cli.advise_view import curve_table, history_lines, summary
    from dlinfra.sizing.advisor import model_key

    resolved = load_checked(spec, overrides)
    if history:
        found = readable_history(resolved)
        runs = found.runs(model_key(resolved)) if found else []
        if as_json:
            sys.stdout.write(json.dumps(runs, indent=2) + "\n")
            return
        for line in history_lines(runs):
            out.print(line, markup=False, highlight=False)
        return
    advice = advice_for(resolved)
    if isinstance(advice, str):
        raise DlinfraError(advice)
    if as_json:
        from dataclasses import asdict

        sys.stdout.write(json.dumps(asdict(advice), indent=2) + "\n")
        return
    for line in [*summary(advice), "", *curve_table(advice)]:
        out.print(line, markup=False, highlight=False)


@with_overrides(*ALL_OVERRIDES)
def profile(
    spec: SpecArg = None,
    seconds: Annotated[
        float, typer.Option("--seconds", min=1, max=600, help="How long to time steps.")
    ] = 5.0,
    *,
    overrides: Overrides,
) -> None:
    """Time one worker's training step on this machine (one process, random examples of the model's
    input for a built-in model) and record it in the sizing history, where `advise`, `plan` and
    `validate` find it for this model on this machine."""
    from dlinfra.runs.run import home
    from dlinfra.sizing.advisor import history_of, model_key, this_machine
    from dlinfra.sizing.model_size import input_of
    from dlinfra.training import profiling
    from dlinfra.training.program import load_entrypoint

    resolved = load_checked(spec, overrides)
    t = resolved.training
    if t.command:
        raise SpecError(
            [
                "training.command: a script builds its model its own way, which dlinfra cannot time alone. "
                "Fix: profile a spec with the same model as training.entrypoint (a Program)"
            ]
        )
    if t.entrypoint:
        from dlinfra.runs.bundle import entrypoint_file

        base = spec.absolute().parent if spec else Path.cwd()
        program = load_entrypoint(
            f"{entrypoint_file(t.entrypoint, base)}:{t.entrypoint.rpartition(':')[2]}", t
        )
    else:
        shaped = input_of(t.dataset)
        if shaped is None:
            raise SpecError(
                ["training.dataset.format files: the built-in model needs a shape. Fix: use a Program"]
            )
        program = profiling.random_program(t, *shaped)
    device = this_machine()  # measured here, whatever the target
    err.print(f"profiling {model_key(resolved)} on {device} for about {seconds:g} s", markup=False)
    measured = profiling.measure(program, t, seconds)
    history = history_of(resolved, home())
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device,
        "parameters": measured.parameters,
        "trainable": measured.trainable,
        "gradient_elements": measured.gradient_elements,
        "variables": list(measured.variables),
        "step_seconds": measured.step_seconds,
        "steps": measured.steps,
        "batch_size": t.batch_size,
    }
    history.put_profile(model_key(resolved), device, record)
    out.print(
        f"{measured.step_seconds * 1000:.3g} ms a step (median of {measured.steps}), "
        f"{measured.parameters:,} parameters; recorded in {history.uri}",
        markup=False,
    )

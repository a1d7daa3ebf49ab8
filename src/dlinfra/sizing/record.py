"""Each run checks the advisor: its prediction is stored when it deploys, and its measured
throughput is put beside it in the sizing history when it ends (`advise --history`, `compare`)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from dlinfra.runs.layout import RunStore
from dlinfra.sizing.advisor import device_key, history_of, model_key, sizing_advice
from dlinfra.sizing.model_size import FLOAT32
from dlinfra.spec.model import Spec
from dlinfra.targets import uses_instance_types


def predict_run(spec: Spec, store: RunStore, home: Path) -> None:
    """Before the nodes start: the prediction for the run's own shape, if the advisor has one."""
    advice = sizing_advice(spec, history_of(spec, home))
    if isinstance(advice, str):
        return
    point, size = advice.spec, advice.size
    store.put_sizing(
        {
            "model": model_key(spec),
            "device": device_key(spec),
            "parameter_bytes": size.parameter_bytes if size else None,
            "gradient_bytes": size.gradient_bytes if size else None,
            "strategy": spec.strategy,
            "workers": point.workers,
            "ps": point.ps,
            "predicted_examples_per_s": point.examples_per_s,
            "predicted_steps_per_s": point.steps_per_s,
            "bound": point.bound,
            "compute_known": advice.compute_known,
            "assumptions": advice.assumptions,
        }
    )


def record_run(spec: Spec, store: RunStore, run_id: str, home: Path) -> None:
    """After a run that finished: its measured throughput beside its prediction."""
    predicted, marker = store.sizing(), store.marker()
    metrics = store.metrics() if marker is not None and marker.marker == "DONE" else None
    measured = metrics.steady_examples_per_sec() if metrics else None
    if not predicted or metrics is None or measured is None:
        return
    entry: dict[str, Any] = {
        **{k: v for k, v in predicted.items() if k != "assumptions"},
        "run_id": run_id,
        "time": time.time(),
        "examples_per_s": measured,
        "steps_per_s": metrics.global_steps_per_sec.mean if metrics.global_steps_per_sec else None,
    }
    history = history_of(spec, home)
    history.add_run(predicted["model"], entry)
    seconds = _compute_seconds(store, predicted, shared=not uses_instance_types(spec.target))
    if seconds is not None and predicted.get("gradient_bytes"):
        # a mirrored worker times its own forward and backward pass in its steps (runs.stragglers):
        # the step time of this model on this device, which the next plan of it on the same type
        # then uses (a profile's own figures of the model, its variables and sparse gradient, are kept)
        earlier = history.profile(predicted["model"], predicted["device"]) or {
            "parameters": predicted["parameter_bytes"] // FLOAT32,
            "trainable": predicted["gradient_bytes"] // FLOAT32,
        }
        history.put_profile(
            predicted["model"],
            predicted["device"],
            {
                **earlier,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "device": predicted["device"],
                "step_seconds": seconds,
                "source": f"run {run_id}",
            },
        )


def _compute_seconds(store: RunStore, predicted: dict[str, Any], shared: bool) -> float | None:
    """The median over the workers of the compute each last timed in its steps (mirrored runs only).
    None where several workers `shared` one machine: each timed its pass beside the others', not
    what this machine does for one (which a plan of this machine assumes, as `dlinfra profile`
    measures it)."""
    if predicted["strategy"] != "multi_worker_mirrored" or (shared and predicted["workers"] > 1):
        return None
    states = store.statuses([f"worker-{i}" for i in range(predicted["workers"])]).values()
    timed = [s.compute_seconds for s in states if s is not None and s.compute_seconds]
    return statistics.median(timed) if timed else None

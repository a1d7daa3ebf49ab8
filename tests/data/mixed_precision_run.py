"""Train the built-in digits program for 30 steps under multi_worker_mirrored (one worker, no
TF_CONFIG: no server, no port) with training.mixed_precision, and print what a test checks."""

import json
import sys
import tempfile
from pathlib import Path

import keras
from one_worker import lone_worker

from dlinfra.spec.training import TrainingSpec
from dlinfra.training import export, loop
from dlinfra.training.program import builtin_program

work = Path(tempfile.mkdtemp())
training = TrainingSpec(steps=30, mixed_precision=True, log_every=10, checkpoint_every=30)
cfg = lone_worker(training, work)
program = builtin_program(training, work / "data")
losses: list[float] = []
hooks = loop.Hooks(work_dir=work, on_progress=lambda step, loss, eps, wait, **figures: losses.append(loss))
outcome = loop.train_mirrored(cfg, program, hooks, loop.make_mirrored_strategy())
results, _ = export.export(outcome.model, program, outcome.objective, work / "model")
json.dump(
    {
        "policy": keras.mixed_precision.global_policy().name,
        "compute_dtype": outcome.model.layers[0].compute_dtype,
        "variable_dtype": outcome.model.trainable_variables[0].dtype,
        "step": outcome.step,
        "losses": losses,
        "accuracy": results["accuracy"],
    },
    sys.stdout,
)

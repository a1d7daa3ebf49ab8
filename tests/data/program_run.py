"""Train one program of contract_programs.py (named on the command line) under multi_worker_mirrored
(one worker, no TF_CONFIG: no server, no port) or, with a third argument `parameter_server`, as the
chief of an in-process parameter-server cluster (two workers, one ps); export it, load the export in
plain TensorFlow, and print what a test checks, or the refusal."""

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from one_worker import in_process_chief, lone_worker

from dlinfra.spec.training import TrainingSpec
from dlinfra.training import export, loop, parameter_servers
from dlinfra.training.objective import ProgramError
from dlinfra.training.program import load_entrypoint

work = Path(tempfile.mkdtemp())
training = TrainingSpec(steps=int(sys.argv[2]), batch_size=32, log_every=50, checkpoint_every=10_000)
ps = sys.argv[3:] == ["parameter_server"]
cfg = in_process_chief(training, work) if ps else lone_worker(training, work)
program = load_entrypoint(f"{Path(__file__).parent / 'contract_programs.py'}:{sys.argv[1]}", training)
losses: list[float] = []
reports: list[dict[str, float]] = []  # each report's step seconds and the figures it gave


def on_progress(step: int, loss: float, eps: float, wait: float | None, **figures: float) -> None:
    losses.append(loss)
    reports.append({"step_seconds": training.batch_size / eps, **figures})


hooks = loop.Hooks(work_dir=work, on_progress=on_progress)
try:
    if ps:
        outcome = parameter_servers.train_parameter_server(cfg, program, hooks)
    else:
        outcome = loop.train_mirrored(cfg, program, hooks, loop.make_mirrored_strategy())
except ProgramError as exc:
    print(json.dumps({"refused": str(exc)}))
    sys.exit(0)
# the workers' iterators, alive through the export: their deletion stalled the evaluation's first batch
outliving = [type(kept).__name__ for kept in parameter_servers.OUTLIVING]
results, plain = export.export(outcome.model, program, outcome.objective, work / "model")
served = tf.saved_model.load(str(work / "model" / "saved_model"))
features, labels, *_ = next(iter(program.eval_data().batch(1024)))  # all of it
predicted = served.serve(features)
kernels = [w for w in outcome.model.get_weights() if w.ndim == 2]
json.dump(
    {
        "results": results,
        "loss": outcome.objective.loss_name,
        "optimizer": outcome.optimizer,
        "learning_rate": outcome.scale.learning_rate,
        "lr_scaling": outcome.scale.lr_scaling,
        "losses": losses,
        "reports": reports,
        "kernel_norm": float(sum(np.square(k).sum() for k in kernels)),
        "served_matches_keras": bool(np.allclose(predicted, plain(features, training=False), atol=1e-4)),
        "predictions": np.asarray(predicted)[:, 0].tolist(),
        "classes": np.argmax(np.asarray(predicted), -1).tolist(),
        "labels": np.asarray(labels).tolist(),
        "outliving": outliving,
    },
    sys.stdout,
)
sys.stdout.flush()
os._exit(0)  # as the node's trainer leaves: in-process servers hold the interpreter's exit

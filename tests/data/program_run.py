"""Train one program of contract_programs.py (named on the command line) under multi_worker_mirrored
(one worker, no TF_CONFIG: no server, no port), export it, load the export in plain TensorFlow, and
print what a test checks, or the refusal."""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from one_worker import lone_worker

from dlinfra.spec.training import TrainingSpec
from dlinfra.training import export, loop
from dlinfra.training.objective import ProgramError
from dlinfra.training.program import load_entrypoint

work = Path(tempfile.mkdtemp())
training = TrainingSpec(steps=int(sys.argv[2]), batch_size=32, log_every=50, checkpoint_every=10_000)
cfg = lone_worker(training, work)
program = load_entrypoint(f"{Path(__file__).parent / 'contract_programs.py'}:{sys.argv[1]}", training)
losses: list[float] = []
hooks = loop.Hooks(work_dir=work, on_progress=lambda step, loss, eps, wait, **figures: losses.append(loss))
try:
    outcome = loop.train_mirrored(cfg, program, hooks, loop.make_mirrored_strategy())
except ProgramError as exc:
    print(json.dumps({"refused": str(exc)}))
    sys.exit(0)
results, plain = export.export(outcome.model, program, outcome.objective, work / "model")
served = tf.saved_model.load(str(work / "model" / "saved_model"))
features, labels = next(iter(program.eval_data().batch(64)))
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
        "kernel_norm": float(sum(np.square(k).sum() for k in kernels)),
        "served_matches_keras": bool(np.allclose(predicted, plain(features, training=False), atol=1e-4)),
        "predictions": np.asarray(predicted)[:, 0].tolist(),
        "labels": np.asarray(labels).tolist(),
    },
    sys.stdout,
)

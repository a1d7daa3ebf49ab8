"""The first trace of the parameter-server loop's step function (training.parameter_servers.
counted_steps), side by side in one run: with a Keras loss, where AutoGraph converts nothing of the
loop (training.tracing), and with a loss callable of the program's own, where it converts the step
function and the loss's way to the user's code. Each rep is a fresh process (AutoGraph caches its
conversions per process), the digits model and batch of the README's run, under the default
strategy; interleaved reps, median ± sd of the trace and of the first call.

    python bench/bench_first_trace.py [--reps 5]

Figures go in BENCHMARKS.md; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PROGRAM = """
import json, os, sys, time
import keras, tensorflow as tf
from dlinfra.contract import WORKER_INDEX_FILE
from dlinfra.spec.training import TrainingSpec
from dlinfra.training.loop import batched
from dlinfra.training.meter import InputClock
from dlinfra.training.objective import resolve
from dlinfra.training.parameter_servers import counted_steps
from dlinfra.training.profiling import random_program

def own_loss(labels, outputs):  # the user's callable: AutoGraph converts what leads to it
    return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)

open(WORKER_INDEX_FILE, "w").write("0")
training = TrainingSpec()
program = random_program(training, (8, 8, 1), 10)
model = program.build_model()
optimizer = keras.optimizers.Adam(0.003)
optimizer.build(model.trainable_variables)  # as choose_optimizer does before the loop
goal = resolve(program, model) if sys.argv[1] == "keras" else resolve(
    type(program)(program.build_model, program.train_data, program.eval_data, loss=own_loss), model)
applied = tf.Variable(0, dtype=tf.int64)
tally = tf.Variable(tf.zeros([1, 2], tf.float64))
steps = counted_steps(tf.distribute.get_strategy(), model, optimizer, goal, applied, tally, InputClock())
batches = iter(batched(program.train_data(None), training.batch_size, shuffle_seed=None).repeat())
t0 = time.perf_counter()
concrete = steps.get_concrete_function(batches, tf.constant(10))
traced = time.perf_counter() - t0
t0 = time.perf_counter()
concrete(batches, tf.constant(10))[0].numpy()
print(json.dumps({"trace": traced, "first call": time.perf_counter() - t0}))
"""

VARIANTS = {
    "keras": "a Keras loss (the built-in's): nothing converted",
    "own": "the program's own loss callable: converted",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {v: {"trace": [], "first call": []} for v in VARIANTS}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "first_trace.py")  # a file: AutoGraph reads the source it converts
        with open(script, "w", encoding="utf-8") as out:
            out.write(PROGRAM)
        for _ in range(args.reps):
            for variant in VARIANTS:
                argv = [sys.executable, script, variant]
                done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-2000:])
                for name, value in json.loads(done.stdout.strip().splitlines()[-1]).items():
                    figures[variant][name].append(value)
    print(f"{'':55} {'trace s':>14} {'first call s':>14}  (median ± sd, {args.reps} reps)")
    for variant, label in VARIANTS.items():
        cells = [
            f"{statistics.median(v):.3f} ± {statistics.stdev(v) if len(v) > 1 else 0:.3f}"
            for v in figures[variant].values()
        ]
        print(f"{label:55} {cells[0]:>14} {cells[1]:>14}")


if __name__ == "__main__":
    main()

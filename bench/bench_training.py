"""Training throughput, side by side in one run: plain single-process Keras (custom loop, no
strategy) vs the local cluster (1 worker + 1 ps; 2 workers + 1 ps; mirrored 2 workers) on the same
model (built-in CNN), batch (64 per worker) and data (digits); plus time from `dlinfra deploy` to
the first step with 3 workers. Goals: 1-worker cluster >= 0.9x plain; first step <= 30 s."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS = 1500
BATCH = 64


def plain_examples_per_sec() -> float:
    import keras
    import tensorflow as tf

    from dlinfra.spec.training import TrainingSpec
    from dlinfra.training.program import Shard, builtin_program

    program = builtin_program(TrainingSpec(), Path(tempfile.mkdtemp()))
    model = program.build_model()
    optimizer = keras.optimizers.Adam(0.003)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ds = program.train_data(Shard(0, 1)).shuffle(4096).repeat().batch(BATCH, drop_remainder=True)
    it = iter(ds.prefetch(tf.data.AUTOTUNE))

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for _ in range(50):  # trace and warm up
        step(*next(it))
    rates = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(STEPS // 5):
            loss = step(*next(it))
        float(loss)
        rates.append(STEPS // 5 * BATCH / (time.perf_counter() - t0))
    return statistics.median(rates)


def cluster(*args: str) -> tuple[dict, float]:
    home = tempfile.mkdtemp()
    env = dict(os.environ, DLINFRA_HOME=home)
    started = time.time()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "dlinfra",
            "deploy",
            "--steps",
            str(STEPS),
            "--set",
            f"training.batch_size={BATCH}",
            "--set",
            "training.log_every=50",
            *args,
        ],
        check=True,
        capture_output=True,
        env=env,
        cwd=home,
    )
    run_dir = next((Path(home) / "runs").iterdir())
    metrics = json.loads((run_dir / "store" / "metrics.json").read_text())
    return metrics, metrics["first_step_at"] - started


def main() -> None:
    plain = plain_examples_per_sec()
    print(f"{'configuration':<34} {'examples/s':>11} {'x plain':>8} {'to first step s':>16}")
    print(f"{'plain single process':<34} {plain:11.0f} {1.0:8.2f} {'-':>16}")
    for name, args in [
        ("ps: 1 worker + 1 ps", ["--workers", "1"]),
        ("ps: 2 workers + 1 ps", ["--workers", "2"]),
        ("ps: 3 workers + 1 ps", ["--workers", "3"]),
        ("mirrored: 2 workers", ["--strategy", "multi_worker_mirrored", "--workers", "2"]),
    ]:
        metrics, first = cluster(*args)
        eps = metrics["examples_per_sec"]["mean"]
        print(f"{name:<34} {eps:11.0f} {eps / plain:8.2f} {first:16.1f}")


if __name__ == "__main__":
    main()

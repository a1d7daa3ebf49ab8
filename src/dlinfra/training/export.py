"""The trained model, out of its training strategy: evaluated and saved as a plain single-process
model that loads without dlinfra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlinfra.training.objective import Objective
from dlinfra.training.program import Program


def evaluate(model: Any, program: Program, goal: Objective, batch: int = 256) -> dict[str, float]:
    """The eval loss and each of the program's metrics over eval_data, by name."""
    import keras
    import tensorflow as tf

    loss = keras.metrics.Mean(name="loss")
    metrics: list[Any] | None = None
    for x, y, *weights in program.eval_data().batch(batch):  # weights: the loss's, as in Keras
        outputs = model(x, training=False)
        if metrics is None:
            metrics = goal.metrics(y, outputs)
        values = goal.values(y, outputs, *weights)
        if values.shape.rank == 0:  # the batch's mean: weighed by the batch's examples
            loss.update_state(values, sample_weight=tf.shape(tf.nest.flatten(y)[0])[0])
        else:
            loss.update_state(
                tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
                if values.shape.rank > 1
                else values
            )
        for metric in metrics:
            metric.update_state(y, outputs)
    return {"loss": float(loss.result())} | {m.name: float(m.result()) for m in metrics or []}


def accuracy_of(results: dict[str, float]) -> float | None:
    """The run's accuracy, where its program measured one: named so, or the one metric named *accuracy."""
    if "accuracy" in results:
        return results["accuracy"]
    named = [value for name, value in results.items() if name.endswith("accuracy")]
    return named[0] if len(named) == 1 else None


def export(trained: Any, program: Program, goal: Objective, out_dir: Path) -> tuple[dict[str, float], Any]:
    """Copy the trained weights into a plain single-process model, evaluate it, and save it as a
    SavedModel (loads in plain TensorFlow: ``tf.saved_model.load(dir).serve(x)``) and as .keras."""
    plain = program.build_model()
    plain.set_weights(trained.get_weights())
    results = evaluate(plain, program, goal)
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.export(str(out_dir / "saved_model"), format="tf_saved_model", verbose=False)
    plain.save(str(out_dir / "model.keras"))
    return results, plain

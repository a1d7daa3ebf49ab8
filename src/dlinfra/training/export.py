"""The trained model, out of its training strategy: evaluated and saved as a plain single-process
model that loads without dlinfra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlinfra.training.program import Program


def evaluate(model: Any, program: Program, batch: int = 256) -> float:
    import tensorflow as tf

    correct = total = 0
    for x, y in program.eval_data().batch(batch):
        pred = tf.argmax(model(x, training=False), axis=-1, output_type=y.dtype)
        correct += int(tf.reduce_sum(tf.cast(pred == y, tf.int64)))
        total += int(tf.shape(y)[0])
    return correct / max(total, 1)


def export(trained: Any, program: Program, out_dir: Path) -> tuple[float, Any]:
    """Copy the trained weights into a plain single-process model, evaluate it, and save it as a
    SavedModel (loads in plain TensorFlow: ``tf.saved_model.load(dir).serve(x)``) and as .keras."""
    plain = program.build_model()
    plain.set_weights(trained.get_weights())
    accuracy = evaluate(plain, program)
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.export(str(out_dir / "saved_model"), format="tf_saved_model", verbose=False)
    plain.save(str(out_dir / "model.keras"))
    return accuracy, plain

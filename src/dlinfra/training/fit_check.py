"""A program's first batch, tried on a plain copy of its model before the cluster trains: a model
whose outputs its loss cannot mean anything for is refused here, naming the field to set, instead
of training for hours on a loss that means nothing (or reporting an accuracy above 1)."""

from __future__ import annotations

from typing import Any

from dlinfra.training.objective import Objective, ProgramError, refuse_what_the_loop_ignores, resolve
from dlinfra.training.program import Program, Shard

CHECKED_EXAMPLES = 64
REGRESSION = 'Program.loss (e.g. "mse" and metrics=["mae"] for a regression)'
ONE_HOT = "Program.loss=keras.losses.CategoricalCrossentropy(from_logits=True)"
BINARY = "Program.loss=keras.losses.BinaryCrossentropy(from_logits=True) for a yes/no classifier"


def first_batch(program: Program, batch_size: int, shard: Shard = Shard(0, 1)) -> Objective:
    """The program's objective, once its first batch (of `shard`) has been seen to fit it."""
    import tensorflow as tf

    model = program.build_model()
    refuse_what_the_loop_ignores(model)
    objective = resolve(program, model)
    data = program.train_data(shard)
    spec = data.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ProgramError(
            f"train_data yields {_structure(spec)}, not (features, label) pairs or (features, label, "
            "sample_weight) triples: return dataset.map(lambda example: (features, label))"
        )
    for batch in data.batch(min(batch_size, CHECKED_EXAMPLES)).take(1):
        features, labels, *weights = batch
        outputs = model(features, training=False)
        if objective.default_loss:
            _fits_classifier(labels, outputs)
        try:
            values = tf.convert_to_tensor(objective.values(labels, outputs, *weights))
        except Exception as exc:  # the user's loss, on the user's data: any error is theirs
            raise ProgramError(
                f"the loss ({objective.loss_name}) fails on the first batch{_shapes(labels, outputs)}: {exc}"
            ) from None
        if weights and values.shape.rank == 0:
            raise ProgramError(
                f"train_data gives sample weights, but the loss ({objective.loss_name}) returns its batch's "
                "mean, which no weight can reach: return one loss per example from Program.loss"
            )
        _fits_loss(objective, values, labels, outputs)
        try:
            for metric in objective.metrics(labels, outputs):
                metric.update_state(labels, outputs)
        except ProgramError:
            raise
        except Exception as exc:
            raise ProgramError(
                f"Program.metrics fail on the first batch{_shapes(labels, outputs)}: {exc}"
            ) from None
        return objective
    raise ProgramError("train_data yields no examples (shard 0 of 1)")


def _fits_classifier(labels: Any, outputs: Any) -> None:
    """The default loss wants integer class ids, one per example, below the number of outputs."""
    import tensorflow as tf

    shapes = _shapes(labels, outputs)
    units = outputs.shape[-1]
    if units > 1 and labels.shape.rank == outputs.shape.rank and labels.shape[-1] == units:
        raise ProgramError(
            f"the labels are one-hot, shaped {_shape(labels)}, but the default loss wants one class id per "
            f"example{shapes}: set {ONE_HOT}, or give class ids (dataset.map(lambda x, y: (x, tf.argmax(y, "
            "-1))))"
        )
    if labels.dtype.is_floating:
        raise ProgramError(
            f"the labels are {labels.dtype.name} but the loss is the default classifier's, which wants "
            f"integer class ids{shapes}: set {REGRESSION}, or cast the labels to int64"
        )
    if units == 1:
        raise ProgramError(
            f"the model has one output unit, and the default loss is a softmax over its units: one class "
            f"learns nothing{shapes}. Set {REGRESSION}, or {BINARY}"
        )
    if labels.shape.rank == outputs.shape.rank:
        fix = (
            "squeeze them in train_data and eval_data (dataset.map(lambda x, y: (x, tf.squeeze(y, -1))))"
            if labels.shape[-1] == 1
            else f"for one-hot labels set {ONE_HOT}"
        )
        raise ProgramError(
            f"the labels are shaped {_shape(labels)}, but the default loss wants one class id per example, "
            f"shaped (batch,){shapes}: {fix}, or set Program.loss"
        )
    low, high = int(tf.reduce_min(labels)), int(tf.reduce_max(labels))
    if low < 0 or high >= units:
        raise ProgramError(
            f"a label of the first batch is {low if low < 0 else high}, outside the {units} classes the "
            f"model outputs (0..{units - 1}): give the last layer one unit per class, or set Program.loss"
        )


def _fits_loss(objective: Objective, values: Any, labels: Any, outputs: Any) -> None:
    import tensorflow as tf

    # labels (N,) against outputs (N, 1), subtracted by hand, broadcast to (N, N): no error, no sense
    count = values.shape.num_elements()
    if isinstance(outputs, tf.Tensor) and count is not None and count > outputs.shape.num_elements():
        raise ProgramError(
            f"the loss ({objective.loss_name}) gives {values.shape.num_elements()} values for "
            f"{outputs.shape.num_elements()} outputs{_shapes(labels, outputs)}: the labels broadcast "
            "against the outputs. Shape the labels as the outputs in train_data, or reshape in the loss"
        )
    if not bool(tf.reduce_all(tf.math.is_finite(tf.cast(values, tf.float32)))):
        raise ProgramError(
            f"the loss ({objective.loss_name}) is not finite on the first batch{_shapes(labels, outputs)}: "
            "check the data for NaN and the loss for log(0)"
        )


def _shape(tensor: Any) -> str:
    dims = ["batch" if i == 0 else str(d) for i, d in enumerate(tensor.shape)]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _shapes(labels: Any, outputs: Any) -> str:
    out = _shape(outputs) if hasattr(outputs, "shape") else type(outputs).__name__
    return (
        f" (labels {_shape(labels)} {labels.dtype.name}, outputs {out})" if hasattr(labels, "shape") else ""
    )


def _structure(spec: Any) -> str:
    if isinstance(spec, dict):
        return "dicts (" + ", ".join(spec) + ")"
    if isinstance(spec, tuple):
        return f"tuples of {len(spec)}"
    return "single tensors"

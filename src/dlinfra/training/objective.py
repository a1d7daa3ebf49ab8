"""What a program is trained for and measured by: its loss, its metrics and its optimizer.

Each comes from the Program's field, else from the model's own `compile()`, else from dlinfra's
default: a classifier on logits (sparse categorical cross-entropy, accuracy) and the spec's
optimizer. The model's own losses (`model.losses`: weight penalties, `add_loss`) always join the
loss, as they do in Keras' `fit`.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.training.program import Program
from dlinfra.training.staging import TRAIN_DIR

DEFAULT_LOSS = "sparse categorical cross-entropy (default)"
# compile() settings the loop does not use, with the value that means "not set"
UNUSED_COMPILE = {
    "loss_weights": None,
    "weighted_metrics": None,
    "run_eagerly": False,
    "steps_per_execution": 1,
}


class ProgramError(DlinfraError):
    """A Program dlinfra cannot train as written; the message names the field to set."""


# TensorFlow's words for a mistake in a program, and what to do about it
IN_SETUP = (
    "make lookup tables and preprocessing layers in Program.setup, not in build(): setup runs in the "
    "strategy's scope on every training process"
)
HINTS = {
    # a table made in build(): before the cluster was joined, on a device the cluster does not have
    "Client for target /job:localhost": IN_SETUP,  # used on a worker
    "job:localhost/replica:0/task:0/device:CPU:0 unknown device": IN_SETUP,  # used on the chief
    # a parameter-server worker's stream stopped: the chief sees only the local path it could not read
    f"{TRAIN_DIR}/": "a node's train files are not on its disk; streamed through cache_gb, its log says "
    "why (`data: streaming stopped: …`, the worker whose files these are)",
}


def hint(error: str) -> str:
    """What to do about `error`, when it is one TensorFlow gives for a known mistake ("" if not)."""
    return "".join(f" (dlinfra: {advice})" for words, advice in HINTS.items() if words in error)


@dataclass(frozen=True)
class Objective:
    loss: Callable[[Any, Any], Any]  # (labels, outputs) -> per-example losses, or their batch mean
    loss_name: str
    default_loss: bool  # the classifier default: the first batch must fit it (see fit_check)
    given_metrics: tuple[Any, ...]
    warnings: tuple[str, ...] = ()  # what the program says that the loop does not do (node status)
    user_code: bool = False  # the loss is the program's own callable, not a Keras loss (training.tracing)

    def mean_loss(self, model: Any, labels: Any, outputs: Any, weights: Any = None) -> Any:
        """One worker's batch, applied alone (parameter servers): its mean loss and the model's own."""
        import tensorflow as tf

        loss = tf.reduce_mean(self.values(labels, outputs, weights))
        return loss + _own_losses(model)

    def replica_loss(
        self, model: Any, labels: Any, outputs: Any, global_batch: int, replicas: int, weights: Any = None
    ) -> Any:
        """One replica's share of a synchronous step: the all-reduce sums the replicas' shares."""
        import tensorflow as tf

        values = self.values(labels, outputs, weights)
        if values.shape.rank == 0:  # the callable returned its batch's mean
            share = values / replicas
        else:
            if values.shape.rank > 1:  # e.g. a loss per token: each example weighs the same
                values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
            share = tf.nn.compute_average_loss(values, global_batch_size=global_batch)
        return share + tf.nn.scale_regularization_loss(_own_losses(model))

    def values(self, labels: Any, outputs: Any, weights: Any = None) -> Any:
        """The loss's values, each times its example's weight when train_data gives (x, y, weight)
        triples: the batch's mean is then Keras' weighted loss (the weighted sum over the batch's size)."""
        import tensorflow as tf

        values = tf.cast(self.loss(labels, outputs), tf.float32)
        if weights is None or values.shape.rank == 0:  # a batch mean: refused with weights (fit_check)
            return values
        weights = tf.cast(weights, tf.float32)
        if weights.shape.rank is None or values.shape.rank is None:  # shapes unknown: Keras' broadcast
            return values * weights
        if weights.shape.rank == values.shape.rank + 1 and weights.shape[-1] == 1:  # (N, 1) for (N,)
            weights = tf.squeeze(weights, -1)
        while weights.shape.rank < values.shape.rank:  # a weight per example, over its values
            weights = tf.expand_dims(weights, -1)
        return values * weights

    def metrics(self, labels: Any, outputs: Any) -> list[Any]:
        """Fresh Keras metric objects, named as the program named them; `labels` and `outputs` (one
        batch) settle what "accuracy" means, as Keras' compile does."""
        given = self.given_metrics or (("accuracy",) if self.default_loss else ())
        return [_metric(m, labels, outputs, self.loss_name) for m in given]


def _own_losses(model: Any) -> Any:
    import tensorflow as tf

    own = [tf.cast(loss, tf.float32) for loss in model.losses]
    return tf.add_n(own) if own else tf.constant(0.0)


def resolve(program: Program, model: Any) -> Objective:
    """The loss and the metrics of `program`, whose model `model` is (a fresh one, for its compile())."""
    compiled = compile_settings(model)
    given = program.loss if program.loss is not None else compiled.get("loss")
    metrics = tuple(program.metrics) or tuple(compiled.get("metrics") or ())
    warnings = tuple(filter(None, [unused_compile(model)]))
    if given is None:
        import keras

        default = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        return Objective(default, DEFAULT_LOSS, True, metrics, warnings)
    field = "Program.loss" if program.loss is not None else "the model's compile(loss=...)"
    if isinstance(given, dict | list | tuple):
        raise ProgramError(
            f"{field}: a loss per output is not taken; set Program.loss to one callable(labels, outputs) "
            "that returns the combined per-example loss"
        )
    import keras

    loss = _per_example(given, field)
    own = not isinstance(loss, keras.losses.Loss)
    return Objective(loss, _name(given), False, metrics, warnings, user_code=own)


def _per_example(given: Any, field: str) -> Callable[[Any, Any], Any]:
    import keras

    if isinstance(given, str):
        given = _named(keras.losses.get, given, field)
    if isinstance(given, keras.losses.Loss):
        unreduced = copy.copy(given)  # the user's object keeps its reduction
        unreduced.reduction = "none"
        return unreduced
    if not callable(given):
        raise ProgramError(
            f"{field}: {given!r} is not a Keras loss, a loss's name or a callable(labels, outputs)"
        )

    def per_example(labels: Any, outputs: Any) -> Any:
        if isinstance(outputs, dict | list | tuple):
            return given(labels, outputs)
        return given(*_same_rank(labels, outputs))

    return per_example


def _same_rank(labels: Any, outputs: Any) -> tuple[Any, Any]:
    """As compile() does: labels (N,) against outputs (N, 1) are brought to one rank, not broadcast."""
    import tensorflow as tf

    labels = tf.convert_to_tensor(labels)
    difference = outputs.shape.rank - labels.shape.rank
    if difference == 1 and outputs.shape[-1] == 1:
        labels = tf.expand_dims(labels, -1)
    elif difference == -1 and labels.shape[-1] == 1:
        labels = tf.squeeze(labels, -1)
    return (tf.cast(labels, outputs.dtype) if labels.dtype.is_floating else labels), outputs


def _named(get: Callable[[str], Any], name: str, field: str) -> Any:
    """Keras' object of that name; a name Keras does not know is the program's error, by field."""
    try:
        return get(name)
    except ValueError as exc:
        raise ProgramError(f"{field}: {exc}") from None


def _name(thing: Any) -> str:
    if isinstance(thing, str):
        return thing
    return str(getattr(thing, "name", None) or getattr(thing, "__name__", None) or type(thing).__name__)


def _metric(given: Any, labels: Any, outputs: Any, loss_name: str) -> Any:
    import keras

    if isinstance(given, keras.metrics.Metric):
        # Made in build(), before the cluster was joined: its variables live on a device the cluster
        # does not have (parameter servers: "Client for target /job:localhost"). A copy made here, where
        # the metric is used, has its own.
        try:
            return type(given).from_config(given.get_config())
        except Exception:  # a metric of the user's that cannot be copied: it serves where it was made
            given.reset_state()
            return given
    if given in ("accuracy", "acc"):
        return _accuracy(labels, outputs, loss_name)(name="accuracy")
    if isinstance(given, str):
        found = _named(keras.metrics.get, given, "Program.metrics")
        if isinstance(found, keras.metrics.Metric):
            try:
                return type(found)(name=given)  # reported as the program wrote it: "mae"
            except TypeError:
                return found
        return keras.metrics.MeanMetricWrapper(found, name=given)
    if callable(given):
        return keras.metrics.MeanMetricWrapper(given, name=_name(given))
    raise ProgramError(f"Program.metrics: {given!r} is not a Keras metric, a metric's name or a callable")


def _accuracy(labels: Any, outputs: Any, loss_name: str) -> Any:
    """The accuracy that fits the outputs, as Keras' compile picks it for "accuracy"."""
    import keras

    if "binary" in loss_name or outputs.shape[-1] == 1:
        return keras.metrics.BinaryAccuracy
    if labels.shape.rank == outputs.shape.rank and labels.shape[-1] == outputs.shape[-1]:
        return keras.metrics.CategoricalAccuracy  # one-hot labels
    return keras.metrics.SparseCategoricalAccuracy


def compile_settings(model: Any) -> dict[str, Any]:
    """What the model's compile() was given (empty when it was not compiled)."""
    if not getattr(model, "compiled", False):
        return {}
    config = getattr(getattr(model, "_compile_config", None), "config", None)  # Keras 3 keeps it raw
    return dict(config or {})


def refuse_what_the_loop_ignores(model: Any) -> None:
    """dlinfra's loop runs its own step: a custom train_step would be skipped, so it is refused;
    compile() settings the loop does not use are named in the log."""
    import keras

    if type(model).train_step is not keras.Model.train_step:
        raise ProgramError(
            f"the model ({type(model).__name__}) overrides train_step, which dlinfra's loop does not "
            "call: put its loss in Program.loss (and its optimizer in Program.optimizer), or run the "
            "program as it is with training.command"
        )
    if unused := unused_compile(model):
        print(f"warning: {unused}", file=sys.stderr)


def unused_compile(model: Any) -> str | None:
    """The model's compile() settings that dlinfra's loop does not use, in words (None: none)."""
    settings = compile_settings(model)
    unused = [k for k, unset in UNUSED_COMPILE.items() if settings.get(k, unset) != unset]
    if not unused:
        return None
    return f"compile() settings dlinfra's loop does not use, without effect on this run: {', '.join(unused)}"


def optimizer(program: Program, model: Any, spec_optimizer: Callable[[], Any]) -> tuple[Any, str]:
    """The optimizer (made in the strategy's scope) and where it came from."""
    import keras

    if program.optimizer is not None:
        given = program.optimizer  # an instance is a copy of itself by now (Program.__post_init__)
        if not callable(given):
            raise ProgramError(
                f"Program.optimizer: {given!r} is neither a Keras optimizer nor a function returning one "
                "(optimizer=lambda: keras.optimizers.SGD(0.1))"
            )
        made = given()
        if not isinstance(made, keras.optimizers.Optimizer):
            raise ProgramError(
                f"Program.optimizer returned {type(made).__module__}.{type(made).__name__}, not a Keras 3 "
                "optimizer (keras.optimizers...)"
            )
        return made, "Program.optimizer"
    if compile_settings(model).get("optimizer") is not None:
        return model.optimizer, "the model's compile()"
    return spec_optimizer(), "training.optimizer"

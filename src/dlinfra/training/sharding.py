"""Variables split over the parameter servers (Program.variable_partitioner), trained with Keras 3.

A Keras 3 variable made under a partitioner wraps a ShardedVariable, which neither the gradient tape
nor Keras' optimizer update nor Keras' checkpointing can take (measured with Keras 3.15 and TF
2.21: "'ShardedVariable' object has no attribute 'handle'"). The loop therefore trains each shard as
a variable of its own, and checkpoints the weights TensorFlow holds rather than the Keras wrappers;
without a partitioner both lists are the model's own variables.
"""

from __future__ import annotations

from typing import Any


def _sharded(variable: Any) -> Any:
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    inner = getattr(variable, "value", variable)
    return inner if isinstance(inner, ShardedVariable) else None


def trained(variables: list[Any]) -> list[Any]:
    """What the tape differentiates and the optimizer updates: each shard on its own."""
    out: list[Any] = []
    for variable in variables:
        sharded = _sharded(variable)
        out.extend(sharded.variables if sharded is not None else [variable])
    return out


def saved(model: Any) -> list[Any]:
    """The model's weights as TensorFlow holds them (a ShardedVariable saves its shards itself)."""
    return [getattr(v, "value", v) for v in model.weights]


def describe(model: Any) -> str | None:
    """The model's variables split over the ps, with their shard counts (None: none is split)."""
    split = [(v.name, len(sharded.variables)) for v in model.weights if (sharded := _sharded(v)) is not None]
    return ", ".join(f"{name} ({shards} shards)" for name, shards in split) or None

"""Training: data sets, built-in models, the user program contract and the strategy loops.

Everything here imports TensorFlow lazily; only node processes pay for it.
"""

from dlinfra.training.program import Program, Shard

__all__ = ["Program", "Shard"]

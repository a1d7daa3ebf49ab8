"""dlinfra: one experiment file, a transient distributed TensorFlow cluster, a model in the store."""

from dlinfra.progress import report

__version__ = "0.1.0"
__all__ = ["__version__", "report"]

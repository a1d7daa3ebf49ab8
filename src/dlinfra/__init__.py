"""dlinfra: one experiment file, a transient distributed TensorFlow cluster, a model in the store."""

__version__ = "0.1.0"

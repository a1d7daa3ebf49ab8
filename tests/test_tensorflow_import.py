"""A training node imports TensorFlow without scikit-learn (node.tensorflow_import), and the built-in
digits are scikit-learn's own, read without importing it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

CHECK = """
import sys
from dlinfra.node import devices
from dlinfra.training import data
found = devices.probe()
digits = data._digits(0.2)
print("sklearn after tensorflow:", "sklearn" in sys.modules)
import sklearn.preprocessing
print("sklearn importable:", sklearn.preprocessing.StandardScaler().fit([[1.0], [3.0]]).mean_[0])
print("keras:", "keras" in sys.modules, "CPU:0" in found.names)
"""


def test_a_training_node_loads_tensorflow_without_scikit_learn_and_may_import_it_after() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "sklearn after tensorflow: False",
        "sklearn importable: 2.0",
        "keras: True True",
    ], done.stdout


def test_the_built_in_digits_are_scikit_learns_own() -> None:
    from sklearn.datasets import load_digits

    from dlinfra.training import data

    reference = load_digits()
    ours = data._digits(0.2)
    expected = data._split((reference.images / 16.0).astype("float32")[..., None], reference.target, 0.2)
    for part in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(ours, part), getattr(expected, part)), part
    assert ours.x_train.dtype == np.float32 and ours.y_train.dtype == np.int64

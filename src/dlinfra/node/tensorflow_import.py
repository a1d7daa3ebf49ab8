"""`import tensorflow` for a node that trains, without loading scikit-learn on the way.

Keras imports its scikit-learn wrappers with TensorFlow, and through them scikit-learn and SciPy's
statistics: 3.0 of the 10.3 CPU-seconds `import tensorflow` took here (2026-11-27), paid by every
training node at every start, and 15-20x that on an emulated VM. A node's training loop never uses
those wrappers, so scikit-learn is hidden while TensorFlow loads: Keras then defines its wrappers
without it. Afterwards scikit-learn imports as usual (a user's Program may use it); only Keras's
scikit-learn wrappers (`keras.wrappers.SKLearnClassifier` and kin) stay unusable in that process.
Script mode runs the user's own process and is untouched."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

HIDDEN = "sklearn"


class _Hidden(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == HIDDEN or fullname.startswith(HIDDEN + "."):
            raise ModuleNotFoundError(f"{HIDDEN} is not loaded with TensorFlow on a node", name=fullname)
        return None


def import_tensorflow() -> Any:
    """TensorFlow, imported once per process; scikit-learn stays out unless something loaded it first."""
    if "tensorflow" in sys.modules or HIDDEN in sys.modules:
        import tensorflow as tf

        return tf
    hidden = _Hidden()
    sys.meta_path.insert(0, hidden)
    try:
        import tensorflow as tf
    finally:
        sys.meta_path.remove(hidden)
    return tf

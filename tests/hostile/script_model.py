"""Issue 56, build 2: training.require_model, the one switch of what a finished script must leave.
What counts as a model is tests/test_model_check.py; the real runs are tests/e2e/test_script_mode.py
and tests/e2e/test_script_failures.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hostile import Case, training_field

FIELD = "training.require_model"


def _require(value: str, command: bool = True) -> Callable[[Path], list[str]]:
    return training_field("require_model", value, command)


CASES = [
    Case("require-model-words", _require("maybe"), expected=(FIELD, "valid boolean")),
    Case("require-model-number", _require("3"), expected=(FIELD, "valid boolean")),
    Case("require-model-list", _require("[true]"), expected=(FIELD, "valid boolean")),
    Case(
        "require-model-without-a-script",
        _require("true", command=False),
        expected=("experiment.yaml", "require_model", "Fix: remove require_model, or set command"),
    ),
]

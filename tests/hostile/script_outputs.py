"""Issue 55, class 1 (a script's outputs uploaded as what they point to): its one CLI surface, the
cap on what a script's directories upload, training.outputs_max_gb. What a script plants on its node
(links out, FIFOs, sparse files, daemons: class 4) needs a real run: tests/e2e/test_script_failures.py
and tests/test_script_outputs.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hostile import Case, training_field

FIELD = "training.outputs_max_gb"


def _cap(value: str, command: bool = True) -> Callable[[Path], list[str]]:
    return training_field("outputs_max_gb", value, command)


CASES = [
    Case("outputs-cap-zero", _cap("0"), expected=(FIELD, "greater than 0", "Fix:")),
    Case("outputs-cap-negative", _cap("-5"), expected=(FIELD, "greater than 0", "Fix:")),
    Case("outputs-cap-words", _cap("lots"), expected=(FIELD, "valid number", "Fix:")),
    Case("outputs-cap-nan", _cap(".nan"), expected=(FIELD, "finite number", "Fix:")),
    Case("outputs-cap-infinite", _cap(".inf"), expected=(FIELD, "finite number", "Fix:")),
    Case("outputs-cap-past-any-disk", _cap("1e9"), expected=(FIELD, "less than or equal", "Fix:")),
    Case("outputs-cap-a-list", _cap("[1, 2]"), expected=(FIELD, "valid number", "Fix:")),
    Case(
        "outputs-cap-without-a-script",
        _cap("3", command=False),
        expected=("experiment.yaml", "outputs_max_gb", "Fix: remove outputs_max_gb, or set command"),
    ),
]

"""Issue 56: code that imports what the run's environment lacks is refused at `validate`, before
anything starts, naming the import, its file:line and the requirement to add (not 27 s in, on every
node). The real project is the suite's Keras regression, which loads its data with scikit-learn."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from hostile import Case

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "scripts"


def _regression(requirements: str = "", command: str = "validate") -> Callable[[Path], list[str]]:
    def args(work: Path) -> list[str]:
        shutil.copy(SCRIPTS / "keras_regression.py", work / "train.py")
        spec = work / "experiment.yaml"
        spec.write_text(f"name: imports\ntraining:\n  command: [python, train.py]\n{requirements}")
        return [command, str(spec)]

    return args


def _optional(work: Path) -> list[str]:
    (work / "train.py").write_text(
        "import tensorflow as tf\ntry:\n    import wandb\nexcept ImportError:\n    pass\n"
    )
    spec = work / "experiment.yaml"
    spec.write_text("name: imports\ntraining:\n  command: [python, train.py]\n")
    return ["validate", str(spec)]


CASES = [
    Case(
        "script-imports-a-package-it-does-not-require",
        _regression(),
        expected=("train.py:11: imports sklearn", "Fix: add 'scikit-learn' to training.requirements"),
        absent=("Traceback",),
    ),
    Case(  # deploy resolves anew and checks again, before the run exists (the suite checks no run dir)
        "deploy-of-a-script-importing-a-package-it-does-not-require",
        _regression(command="deploy"),
        expected=("train.py:11: imports sklearn", "Fix: add 'scikit-learn' to training.requirements"),
    ),
    Case(
        "script-that-requires-what-it-imports",
        _regression("  requirements: [scikit-learn]\n"),
        expected=("valid", "environment: training.requirements (1) + dlinfra's agent"),
        code=0,
    ),
    Case("script-with-an-optional-import", _optional, expected=("valid", "nothing else"), code=0),
]

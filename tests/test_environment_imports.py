"""The code's imports against the run's lock (environment/imports.py), scanned by the real deptry."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlinfra.environment.imports import Missing, check, scan
from dlinfra.environment.lock import Lock
from dlinfra.errors import SpecError

LOCK = Lock("numpy==2.1.0\npyyaml==6.0.2\ntensorflow-cpu==2.21.0\nkeras==3.15.1\n")


def project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_an_import_the_lock_lacks_is_named_with_its_file_line_and_the_requirement(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        {
            "train.py": "import os\nimport numpy as np\nimport tensorflow as tf\n"
            "from sklearn.datasets import load_diabetes\nimport yaml\nfrom lib import data\n",
            "lib/__init__.py": "",
            "lib/data.py": "def load():\n    import cv2\n    from PIL import Image\n",
        },
    )
    assert scan(root, [LOCK]) == [
        Missing("lib/data.py", 2, "cv2"),
        Missing("lib/data.py", 3, "PIL"),
        Missing("train.py", 4, "sklearn"),
    ]
    with pytest.raises(SpecError) as refused:
        check(root, [LOCK])
    text = str(refused.value)
    assert "train.py:4: imports sklearn" in text and "add 'scikit-learn' to training.requirements" in text
    assert "add 'opencv-python'" in text and "add 'pillow'" in text


def test_a_package_whose_module_has_another_name_is_found_through_the_lock(tmp_path: Path) -> None:
    root = project(tmp_path, {"train.py": "import sklearn\nimport cv2\nimport absl.flags\n"})
    lock = Lock(LOCK.text + "scikit-learn==1.6.1\nopencv-python-headless==4.10.0.84\nabsl-py==2.1.0\n")
    assert scan(root, [lock]) == []
    # every flavor's lock must hold it: the GPU nodes run theirs
    missing = [
        Missing("train.py", 1, "sklearn"),
        Missing("train.py", 2, "cv2"),
        Missing("train.py", 3, "absl"),
    ]
    assert scan(root, [lock, LOCK]) == sorted(missing)


def test_an_import_guarded_by_import_error_is_optional_and_not_refused(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        {
            "train.py": "try:\n    import wandb\nexcept ImportError:\n    wandb = None\n"
            "try:\n    import mlflow\nexcept (ValueError, ModuleNotFoundError):\n    pass\n"
            "try:\n    import comet_ml\nfinally:\n    pass\n"
        },
    )
    assert scan(root, [LOCK]) == [Missing("train.py", 10, "comet_ml")]  # a try without the guard


def test_dlinfra_itself_and_the_code_s_own_modules_are_provided(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        {
            "train.py": "import sys\nsys.path.insert(0, 'lib')\nimport dlinfra, helpers, tools\n",
            "lib/helpers.py": "import json\n",
            "lib/tools/__init__.py": "",
        },
    )
    assert scan(root, [LOCK]) == []


def test_only_what_the_run_packs_is_judged(tmp_path: Path) -> None:
    """DLINFRA_HOME under the project, .dlinfraignore's lines: not packed, so not refused."""
    from dlinfra.runs.bundle import code_files

    root = project(
        tmp_path,
        {
            "train.py": "import numpy\nfrom lib.util import f\n",
            "lib/util.py": "import sklearn\n",
            "scratch/old.py": "import cv2\n",
            ".dlinfraignore": "scratch/*\n",
            "home/runs/r/work/train.py": "import torch\n",
        },
    )
    packed = [p for p in code_files(root, root / "home") if p.suffix == ".py"]
    assert scan(root, [LOCK], packed) == [Missing("lib/util.py", 1, "sklearn")]
    assert {m.module for m in scan(root, [LOCK])} == {"sklearn", "cv2", "torch"}  # all of root

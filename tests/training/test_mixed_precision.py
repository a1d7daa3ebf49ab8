"""Mixed precision, on this GPU-less machine: the code path a GPU worker runs, on CPU (TensorFlow
computes float16 on CPU too, slowly). The spec refuses mixed_precision without GPUs; this test calls
the training loop directly, in a fresh process so the global Keras policy does not leak."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "data" / "mixed_precision_run.py"


@pytest.mark.slow
def test_mixed_float16_loop_trains_on_cpu_standing_in_for_a_gpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["policy"] == "mixed_float16"
    assert (result["compute_dtype"], result["variable_dtype"]) == ("float16", "float32")
    assert result["step"] == 30
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert result["losses"][-1] < result["losses"][0], "it learns"
    assert result["accuracy"] > 0.5

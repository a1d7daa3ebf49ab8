"""Issue 56's restart acceptance, small: bench/bench_restarts.py's kill -9 of a random worker of a
2-worker script-mode run, twice per strategy; each run ends DONE with its restart in the result table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.full]


@pytest.mark.parametrize("strategy", ["mwms", "ps"])
def test_two_kills_of_a_random_worker_end_done_with_the_restart_shown(strategy: str) -> None:
    bench = [
        sys.executable,
        str(ROOT / "bench" / "bench_restarts.py"),
        "--kills",
        "2",
        "--strategy",
        strategy,
    ]
    done = subprocess.run(bench, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{strategy}, seed 56: 2/2 DONE, 2/2 with the restart in the result table" in done.stdout

"""Issue 57's soak in the slow tier: bench/bench_chaos.py, smaller (7 runs of 3 faults, one run of each
local cell after its fault-free run), must end with 0 wrong outcomes. The full soak (200 faults, both
targets) is a benchmark: BENCHMARKS.md, "Chaos"."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.full]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_chaos.py"


def test_twenty_one_random_faults_over_seven_local_runs_leave_no_wrong_outcome() -> None:
    soak = ["--runs", "7", "--faults-per-run", "3", "--seed", "300", "--target", "local"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *soak], capture_output=True, text=True, timeout=3600, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "wrong outcomes: 0" in out, out[-6000:]
    rows = re.findall(r"^\| (local/\S+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", done.stdout, re.M)
    assert len(rows) == 4, f"every local cell ran: {rows}"
    injected = sum(int(faults) for _, _, faults, *_ in rows)
    assert injected >= 20, f"{injected} faults injected (a fault on a node that never came up is not)"
    assert all(int(wrong) == 0 for *_, wrong in rows)

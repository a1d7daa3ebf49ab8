"""The import check's cost (issue 56: "refused at validate in under 5 s, naming the import").

Times, in fresh processes, `dlinfra validate` of a real project (the suite's Keras regression, which
imports scikit-learn without requiring it: exit 2), with the network and, where `unshare -rn` is
allowed, without it (the lock from uv's cache); and the scan alone (deptry) in this process.
Prints one row per measure: median and worst of --repeat runs, in seconds."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from dlinfra.environment.imports import scan  # noqa: E402
from dlinfra.environment.lock import Lock  # noqa: E402

SCRIPT = ROOT / "tests" / "data" / "scripts" / "keras_regression.py"
GOAL = 5.0


def validate(project: Path, home: str, offline: bool) -> float:
    command = [sys.executable, "-m", "dlinfra", "validate", str(project / "experiment.yaml")]
    if offline:
        command = ["unshare", "-rn", *command]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, DLINFRA_HOME=home))
    seconds = time.perf_counter() - start
    if result.returncode != 2 or "train.py:11: imports sklearn" not in result.stderr:
        raise SystemExit(f"unexpected: exit {result.returncode}: {result.stderr[-600:]}")
    return seconds


def row(label: str, figures: list[float]) -> None:
    worst = max(figures)
    print(f"{label:<44} median {statistics.median(figures):5.2f}s  worst {worst:5.2f}s  (goal < {GOAL:.0f}s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-imports-") as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        shutil.copy(SCRIPT, project / "train.py")
        (project / "experiment.yaml").write_text("name: imports\ntraining:\n  command: [python, train.py]\n")
        validate(project, tmp, offline=False)  # warms uv's cache, as a user's first validate does
        row("validate, index reachable", [validate(project, tmp, False) for _ in range(args.repeat)])
        if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"]).returncode == 0:
            row(
                "validate, no network (uv's cache)",
                [validate(project, tmp, True) for _ in range(args.repeat)],
            )
        lock = Lock("numpy==2.1.0\ntensorflow-cpu==2.21.0\nkeras==3.15.1\n")
        scans = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            assert scan(project, [lock])
            scans.append(time.perf_counter() - start)
        row("the scan alone (deptry)", scans)


if __name__ == "__main__":
    main()

"""CLI latency: `dlinfra --help` and `dlinfra render` for 3 and 100 workers (wall time, best and
median of N runs, fresh processes). Goals: --help <= 0.3 s, render 3 <= 0.5 s, render 100 <= 2 s.

`--baseline DIR` also times another checkout's source (e.g. a `git worktree` of an older commit)
in the same run, interleaved case by case, so the two columns see the same machine load."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 7


def wall(args: list[str], source: Path | None = None) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(source / "src")) if source else None
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dlinfra", *args], check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another checkout to time side by side")
    baseline = parser.parse_args().baseline
    out = tempfile.mkdtemp()
    cases = [
        ("dlinfra --help", ["--help"], 0.3),
        (
            "dlinfra render (3 workers, aws)",
            ["render", "--out", out, "--workers", "3", "--target", "aws"],
            0.5,
        ),
        (
            "dlinfra render (100 workers, aws)",
            [
                "render",
                "--out",
                out,
                "--workers",
                "100",
                "--target",
                "aws",
                "--set",
                "aws.subnet_cidr=10.42.0.0/23",
            ],
            2.0,
        ),
    ]
    header = f"{'case':<36} {'best s':>8} {'median s':>9} {'goal s':>7}"
    print(header + (f" {'baseline best':>14} {'baseline median':>16}" if baseline else ""))
    for name, args, goal in cases:
        t = wall(args)
        line = f"{name:<36} {min(t):8.3f} {statistics.median(t):9.3f} {goal:7.1f}"
        if baseline:
            b = wall(args, baseline)
            line += f" {min(b):14.3f} {statistics.median(b):16.3f}"
        print(line)


if __name__ == "__main__":
    main()

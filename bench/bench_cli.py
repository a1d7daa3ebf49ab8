"""CLI latency: `dlinfra --help` and `dlinfra render` for 3 and 100 workers (wall time, best and
median of N runs, fresh processes). Goals: --help <= 0.3 s, render 3 <= 0.5 s, render 100 <= 2 s."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

RUNS = 7


def wall(args: list[str]) -> list[float]:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dlinfra", *args], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
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
    print(f"{'case':<36} {'best s':>8} {'median s':>9} {'goal s':>7}")
    for name, args, goal in cases:
        t = wall(args)
        print(f"{name:<36} {min(t):8.3f} {statistics.median(t):9.3f} {goal:7.1f}")


if __name__ == "__main__":
    main()

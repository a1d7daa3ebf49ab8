"""The sizing advisor, side by side in one run:

- `dlinfra advise` on a built-in model, as a user runs it (a fresh process each time): its wall
  time (goal: at most 1 s) and whether TensorFlow was imported (it must not be);
- the thesis's scaling figure on shaped local clusters: an MLP whose variables dominate its compute
  (1.1 M parameters, 4.5 MB, batch 16; bench/programs/sharded_mlp.py, whose partitioner spreads its
  variables over the ps) trained with parameter servers at 1-4 workers and 1-2 ps, and
  with multi_worker_mirrored at 2-4 workers, every node's link shaped to 100 Mb/s (c5.4xlarge's
  5 Gb/s baseline x 0.02); the step time `dlinfra profile` measured first. Each run's measured
  examples/s beside the advisor's prediction for it (goal: every point within 25 %), as a Markdown
  table, and the plot `dlinfra compare --scaling` draws.

    python bench/bench_sizing.py [--reps 5] [--steps 120] [--plot FILE.png] [--advise-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPERIMENT = """\
name: ps-curve
cluster:
  chief: {instance_type: c5.4xlarge}
  workers: {count: 1, instance_type: c5.4xlarge}
  ps: {count: 1, instance_type: c5.4xlarge}
  local_network: shaped
  local_link_scale: 0.02
training:
  entrypoint: sharded_mlp.py:program
  batch_size: 16
  steps: STEPS
  log_every: 10
  # one step a call: a call's steps all end at once, and 4 workers x 10 in flight would swamp a
  # short run's count
  steps_per_execution: 1
  checkpoint_every: 100000
"""
PROGRAM = Path(__file__).with_name("programs") / "sharded_mlp.py"
SHAPES = [("parameter_server", w, p) for p in (1, 2) for w in (1, 2, 3, 4)] + [
    ("multi_worker_mirrored", w, 0) for w in (2, 3, 4)
]


def dlinfra(*args: str, env: dict[str, str], cwd: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dlinfra", *args], env=env, cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"dlinfra {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def advise_seconds(reps: int, env: dict[str, str], cwd: str) -> tuple[list[float], bool]:
    code = (
        "import sys; sys.argv = ['dlinfra', 'advise', '--set', 'target=aws', '--workers', '8']\n"
        "from dlinfra.cli.app import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        "print('TF-IMPORTED' if 'tensorflow' in sys.modules else 'no-tf', file=sys.stderr)"
    )
    times, clean = [], True
    for _ in range(reps):
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - began)
        clean = clean and "no-tf" in done.stderr
    return times, clean


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--advise-only", action="store_true", help="Only time `dlinfra advise`.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, DLINFRA_HOME=f"{tmp}/home")
        spec = Path(tmp, "experiment.yaml")
        spec.write_text(EXPERIMENT.replace("STEPS", str(args.steps)))
        shutil.copy(PROGRAM, tmp)
        times, clean = advise_seconds(args.reps, env, tmp)
        print(
            f"advise (fresh process): median {statistics.median(times):.2f} s, range "
            f"{min(times):.2f}-{max(times):.2f} s over {args.reps}; TensorFlow imported: {not clean}"
        )
        if args.advise_only:
            return
        print(dlinfra("profile", str(spec), env=env, cwd=tmp).strip())
        ids = []
        for strategy, workers, ps in SHAPES:
            sets = ["--strategy", strategy, "--workers", str(workers)]
            sets += ["--set", f"cluster.ps.count={max(ps, 1)}"]
            dlinfra("deploy", str(spec), *sets, env=env, cwd=tmp)
            run_id = sorted(Path(tmp, "home", "runs").iterdir(), key=lambda p: p.stat().st_mtime)[-1].name
            ids.append(run_id)
            print(f"  {strategy} {workers}w {ps}ps: {run_id}", flush=True)
        compared = ["compare", *ids, "--json"]
        if args.plot:
            compared += ["--scaling", str(args.plot.absolute())]
        rows = json.loads(dlinfra(*compared, env=env, cwd=tmp))
    print("\n| strategy | workers | ps | measured examples/s | predicted | error | bound |")
    print("|---|---|---|---|---|---|---|")
    errors = []
    for row, (_, workers, ps) in zip(rows, SHAPES, strict=True):
        measured, predicted = row["steady_examples_per_sec"], row["predicted_examples_per_s"]
        error = measured / predicted - 1
        errors.append(abs(error))
        name = "parameter servers" if ps else "mirrored"
        shape = f"| {name} | {workers} | {ps or '-'} |"
        print(f"{shape} {measured:.1f} | {predicted:.1f} | {error:+.0%} | {row['predicted_bound']} |")
    print(
        f"\nworst error {max(errors):.0%}, mean {statistics.mean(errors):.0%} (goal: every point within 25 %)"
    )


if __name__ == "__main__":
    main()

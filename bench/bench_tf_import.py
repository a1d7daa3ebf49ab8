"""A trainer's `import tensorflow` in a local run's environment, side by side in one run: the lock as
dlinfra resolves it (environment.lock.PREFERRED: ml-dtypes 0.6.0) against the same lock with the
newest ml-dtypes (0.7.0, which a lock took before the preference), each environment made as a local
run makes it (environment.venvs, bytecode compiled). Interleaved reps; CPU-seconds and wall seconds
of one process that imports TensorFlow as a node does (node.tensorflow_import), and of one that
imports only numpy and ml_dtypes (the cause, alone).

    python bench/bench_tf_import.py [--reps 5] [--newest 0.7.0]

Figures go in BENCHMARKS.md; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from dlinfra.environment import venvs
from dlinfra.environment.lock import PREFERRED, Index, Platform, resolve
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.wheel import node_wheel

PROGRAMS = {
    "import tensorflow (a trainer's)": "from dlinfra.node.tensorflow_import import import_tensorflow\n"
    "import_tensorflow()",
    "import numpy, ml_dtypes": "import numpy, ml_dtypes",
}


def _timed(python: Path, program: str, code: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one process running `program`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=str(code), TF_CPP_MIN_LOG_LEVEL="3")
    t0 = time.perf_counter()
    done = subprocess.run([str(python), "-c", program], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--newest", default="0.7.0", help="the ml-dtypes release to compare against")
    args = parser.parse_args()
    wheel = node_wheel()
    index = Index.of(None, None, os.environ)
    here = Platform.here()
    locks = {
        f"dlinfra's lock ({', '.join(PREFERRED)})": resolve(str(wheel), [], "cpu", here, index),
        f"the same, ml-dtypes=={args.newest}": resolve(
            str(wheel), [f"ml-dtypes=={args.newest}"], "cpu", here, index
        ),
    }
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tf-import-") as tmp:
        os.environ["DLINFRA_CACHE"] = tmp  # environments made here, from uv's cache: nothing downloaded
        code = venvs.code(wheel, file_sha256(wheel))
        made = {name: venvs.python_of(venvs.ensure(lock, index)) for name, lock in locks.items()}
        for name, lock in locks.items():
            print(f"{name}: ml-dtypes {lock.pins()['ml-dtypes']}, numpy {lock.pins()['numpy']}")
        for _ in range(args.reps):
            for what, program in PROGRAMS.items():
                for name, python in made.items():
                    rows.setdefault(f"{what}, {name}", []).append(_timed(python, program, code))
    width = max(map(len, rows))
    print(f"{'':<{width}}  {'CPU s':>11}  {'wall s':>11}  (median ± sd)")
    for name, figures in rows.items():
        cpu, wall = zip(*figures, strict=True)
        print(
            f"{name:<{width}}  {statistics.median(cpu):5.2f} ± {statistics.stdev(cpu):4.2f}"
            f"  {statistics.median(wall):5.2f} ± {statistics.stdev(wall):4.2f}  ({len(cpu)} reps)"
        )


if __name__ == "__main__":
    main()

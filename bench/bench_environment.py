"""A node's install, side by side in one run, on this machine (what a node's install.sh does, minus
the boot): today's way before locks (pip resolves `dlinfra[train,aws]` from the index) against the
run's lock (pip `--require-hashes`, and uv `pip sync --require-hashes`), each into a fresh venv with
a cold cache (nothing downloaded yet) and a warm one (the same files already in the installer's
cache); then what a local run spends on its nodes' environment (environment.venvs: see _local_rows;
`--local-only` measures that alone); and what a trainer's
`import tensorflow` costs in CPU where PYTHONDONTWRITEBYTECODE is set (CI machines, many container
images), in the local run's environment against uv's plain sync of the same lock (no bytecode).

    python bench/bench_environment.py [--reps 2] [--local-only]

Cold runs download every wheel (TensorFlow CPU is about 250 MB): they measure the index's network
as much as the installer. Figures go in BENCHMARKS.md; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dlinfra.environment import venvs
from dlinfra.environment.lock import Index, Lock, Platform, resolve, uv
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.wheel import node_wheel

Rows = dict[str, list[float]]  # a row's name: its figure of each rep


def _timed(step: Callable[..., object], *args: object) -> float:
    t0 = time.perf_counter()
    step(*args)
    return time.perf_counter() - t0


def _run(cmd: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}: {result.stderr[-1500:]}")


def _import_cpu(venv: Path, code: Path | None = None) -> float:
    """CPU seconds of a trainer's TensorFlow import in `venv` (dlinfra from `code`: PYTHONPATH), as a
    node imports it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    program = "from dlinfra.node.tensorflow_import import import_tensorflow; import_tensorflow()"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TF_CPP_MIN_LOG_LEVEL="3")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    python = str(venv / "bin" / "python")
    done = subprocess.run([python, "-c", program], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _local_rows(lock: Lock, wheel: Path, index: Index, root: Path, rows: Rows, reps: int) -> None:
    """What a local run spends on its nodes' environment, from this machine's uv cache (the one the
    CLI's own environment was installed from): a new one (its bytecode the CLI's where the files are
    the same, the rest compiled), the same with every file compiled (before bytecode was taken), the
    run's dlinfra beside it (venvs.code), and a cached one."""
    sha = file_sha256(wheel)
    for rep in range(reps):
        os.environ["DLINFRA_CACHE"] = str(root / f"dlinfra-local-{rep}")
        rows.setdefault("local run's environment, new", []).append(_timed(venvs.ensure, lock, index))
        made = venvs.ensure(lock, index)
        rows.setdefault("local run's environment, cached", []).append(_timed(venvs.ensure, lock, index))
        rows.setdefault("the run's dlinfra beside it (new wheel)", []).append(_timed(venvs.code, wheel, sha))
        every = [str(p) for p in made.glob("lib/python*/site-packages/**/*.py")]
        for cached in made.glob("lib/python*/site-packages/**/__pycache__"):
            shutil.rmtree(cached)
        rows.setdefault("  its bytecode all compiled instead (before)", []).append(
            _timed(venvs._compile, venvs.python_of(made), every)
        )
        rows.setdefault("trainer's TensorFlow import CPU-s, local run's env", []).append(
            _import_cpu(made, venvs.code(wheel, sha))
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--local-only", action="store_true", help="only a local run's environment")
    args = parser.parse_args()
    wheel = node_wheel()
    assert wheel is not None, "run from a dlinfra checkout"
    index = Index()
    t0 = time.perf_counter()
    lock = resolve(str(wheel), [], "cpu", Platform.here(), index)
    print(f"lock: {len(lock.pins())} packages, resolved in {time.perf_counter() - t0:.1f}s")
    rows: Rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-env-") as tmp:
        root = Path(tmp)
        (root / "env.lock").write_text(lock.text)
        if args.local_only:
            _local_rows(lock, wheel, index, root, rows, args.reps)
            args.reps = 0
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        base |= {"PIP_CONFIG_FILE": os.devnull, "UV_PYTHON_DOWNLOADS": "never"}
        for rep in range(args.reps):
            for cache in ("cold", "warm"):
                # each installer its own cache: cold is empty, warm holds what its cold run fetched
                env = base | {"UV_CACHE_DIR": str(root / f"uv-{rep}")}
                for way, (name, install) in enumerate(
                    (
                        ("pip, resolving (before locks)", [f"{wheel}[train,aws]"]),
                        (
                            "pip --require-hashes, the lock",
                            ["--no-deps", "--require-hashes", "-r", str(root / "env.lock")],
                        ),
                    )
                ):
                    venv = root / f"v-{rep}-{cache}-{way}"
                    pip_env = env | {"PIP_CACHE_DIR": str(root / f"pip-{rep}-{way}")}
                    _run([sys.executable, "-m", "venv", str(venv)], pip_env)
                    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
                    rows.setdefault(f"{name}, {cache}", []).append(_timed(_run, [*pip, *install], pip_env))
                venv = root / f"u-{rep}-{cache}"
                sync = [
                    uv(),
                    "pip",
                    "sync",
                    "--quiet",
                    "--python",
                    str(venv / "bin" / "python"),
                    "--require-hashes",
                ]
                _run([uv(), "venv", "--quiet", "--python", sys.executable, str(venv)], env)
                rows.setdefault(f"uv pip sync, the lock, {cache}", []).append(
                    _timed(_run, [*sync, str(root / "env.lock")], env)
                )
            # the plain sync has no dlinfra: the wheel, as the local environment has it
            plain = root / f"u-{rep}-warm"
            _run([uv(), "pip", "install", "--quiet", "--python", str(plain / "bin" / "python"), "--no-deps",
                  str(wheel)], env)  # fmt: skip
            rows.setdefault("trainer's TensorFlow import CPU-s, plain uv sync", []).append(_import_cpu(plain))
        _local_rows(lock, wheel, index, root, rows, args.reps)
    width = max(map(len, rows))
    for name, seconds in rows.items():
        spread = f" ± {statistics.stdev(seconds):.2f}" if len(seconds) > 1 else ""
        print(f"{name:<{width}}  {statistics.mean(seconds):7.2f}s{spread}  ({len(seconds)} reps)")


if __name__ == "__main__":
    main()

"""Local nodes run in a virtual environment made from the run's lock, not in the CLI's own: a local
run and a cloud run of one experiment run the same versions, and a user's requirement never lands
in the CLI's environment.

Environments are content-addressed (the lock's sha256 and the dlinfra wheel's) in a cache shared by
every run of this machine, and made from uv's cache: a cached one costs nothing; a new one costs
about a second of uv plus its bytecode, compiled once (about 40 s on two cores: BENCHMARKS.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dlinfra.environment.lock import Index, Lock, uv, uv_environ
from dlinfra.errors import DlinfraError

DONE = "dlinfra-env.json"  # written last: an environment without it is half made and made again


def cache_home() -> Path:
    """$DLINFRA_CACHE, else $XDG_CACHE_HOME/dlinfra (~/.cache/dlinfra): keyed by content, shared."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("DLINFRA_CACHE") or Path(base) / "dlinfra").absolute()


def key(lock: Lock, wheel_sha256: str | None) -> str:
    return hashlib.sha256(f"{lock.sha256}\0{wheel_sha256 or ''}".encode()).hexdigest()[:20]


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def ensure(lock: Lock, wheel: Path | None, wheel_sha256: str | None, index: Index) -> Path:
    """The environment of `lock` plus this `wheel` (None: dlinfra is in the lock), made once."""
    root = cache_home() / "envs"
    root.mkdir(parents=True, exist_ok=True)
    env = root / key(lock, wheel_sha256)
    if (env / DONE).is_file():
        return env
    with open(root / f"{env.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # two deploys of one lock make it once
        if (env / DONE).is_file():
            return env
        shutil.rmtree(env, ignore_errors=True)
        _make(env, lock, wheel, index)
    return env


def _make(env: Path, lock: Lock, wheel: Path | None, index: Index) -> None:
    with tempfile.TemporaryDirectory(prefix="dlinfra-env-") as tmp:
        scratch = Path(tmp)
        (scratch / "env.lock").write_text(lock.text, encoding="utf-8")
        environ = uv_environ(index, scratch)
        python = str(python_of(env))
        # Compiled once, here: uv writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set no node
        # ever would, so every trainer compiled TensorFlow's ~2000 modules again (measured: its import
        # 15.4 CPU-s against 5.8; a 5-node local run 52 -> 38 CPU-s, for about 50 CPU-s once here).
        steps = [
            [uv(), "venv", "--quiet", "--python", sys.executable, str(env)],
            [uv(), "pip", "sync", "--quiet", "--python", python, "--require-hashes", "--compile-bytecode",
             *index.uv_args(), str(scratch / "env.lock")],
        ]  # fmt: skip
        if wheel is not None:
            steps.append(
                [uv(), "pip", "install", "--quiet", "--python", python, "--no-deps", "--compile-bytecode",
                 str(wheel)]
            )  # fmt: skip
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True, env=environ)
            if result.returncode != 0:
                raise DlinfraError(
                    f"could not make the run's environment in {env} ({' '.join(step[1:3])}): "
                    f"{result.stderr.strip()[-1500:]}\nFix: check that the package index "
                    f"({index.shown()}) is reachable and holds every locked file"
                )
    (env / DONE).write_text(
        json.dumps({"lock_sha256": lock.sha256, "packages": lock.pins()}, indent=1), encoding="utf-8"
    )

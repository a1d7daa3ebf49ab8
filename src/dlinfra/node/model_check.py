"""Whether the model a script left is one TensorFlow can load: node.model_probe, run by the run's
own python (the agent's, the run's environment) as a short subprocess, so its TensorFlow reads the
files and the agent imports none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dlinfra.node.checkpoint_state import MAX_STATE_BYTES, STATE_FILE, parse_state
from dlinfra.node.model_probe import NOTHING

PROBE_SECONDS = 120.0  # it reads a graph and configs, never weights: seconds, even under load


@dataclass(frozen=True)
class ModelFound:
    models: list[str]  # what loads, by kind and path in the model directory: "SavedModel export/17"
    why_none: str | None  # none loads: what the directory held instead


def check(directory: Path, python: str = sys.executable) -> ModelFound:
    if not any(p.is_file() for p in directory.rglob("*")):
        return ModelFound([], NOTHING)
    try:
        done = subprocess.run(
            [python, "-m", "dlinfra.node.model_probe", str(directory)],
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return ModelFound([], f"could not check it: the check took over {PROBE_SECONDS:.0f} s")
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return ModelFound(list(found["models"]), found["why_none"])
    except (IndexError, ValueError, KeyError, TypeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return ModelFound([], f"could not check it: the check exited {done.returncode}: {last[:300]}")


def latest_checkpoint(directory: Path) -> str | None:
    """The checkpoint TensorFlow's `checkpoint` state file names (relative to `directory`), if any."""
    for state in sorted(directory.rglob(STATE_FILE)):
        try:
            if state.is_symlink() or not state.is_file() or state.stat().st_size > MAX_STATE_BYTES:
                continue
            text = state.read_bytes()
        except OSError:  # removed meanwhile
            continue
        if (latest := parse_state(state.relative_to(directory).as_posix(), text).latest) is not None:
            return latest
    return None

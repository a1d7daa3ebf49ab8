"""What a node really runs, read from its own interpreter (importlib.metadata), against the lock it
was told to run. A node off its lock (a package missing or at another version) fails the run at
once, naming itself and the packages: the same run on two environments is not the run it claims
to be, and a restart cannot fix an install."""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path

from dlinfra.contract import LOCK_PATH
from dlinfra.environment.lock import TENSORFLOW_NAMES, normalize, pins_of

# What a run's record names of its environment (`versions`): the packages a result depends on most
SHOWN = ("keras", "tf-keras", "numpy")


def versions_of(packages: dict[str, str], python: str, lock_sha256: str | None) -> dict[str, str]:
    """{tensorflow, keras, numpy, python, lock} of an environment's packages (a node's installed
    ones, or a lock's pins for what is planned): what `versions` in a run's manifest says."""
    out = {"python": python}
    if tensorflow := next((packages[n] for n in TENSORFLOW_NAMES if n in packages), None):
        out["tensorflow"] = tensorflow
    out |= {name: packages[name] for name in SHOWN if name in packages}
    if lock_sha256:
        out["lock"] = lock_sha256
    return out


def node_versions(packages: dict[str, str], lock_sha256: str | None) -> dict[str, str]:
    """What this interpreter (the run's environment, which the node's agent runs in) runs."""
    return versions_of(packages, platform.python_version(), lock_sha256)


def installed() -> dict[str, str]:
    """{normalized name: version} of every distribution this interpreter sees."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist.version)
    return found


def drift(lock_file: Path, lock_sha256: str, have: dict[str, str]) -> list[str]:
    """What differs between the node's lock and `have` (empty: the node runs its lock exactly)."""
    if not lock_file.is_file():
        return [f"its lock {lock_file} is missing"]
    text = lock_file.read_text(encoding="utf-8")
    if hashlib.sha256(text.encode()).hexdigest() != lock_sha256:
        return [f"its lock {lock_file} is not the run's (sha256 {lock_sha256[:12]})"]
    out = []
    for name, version in sorted(pins_of(text).items()):
        if name not in have:
            out.append(f"{name} {version} is not installed")
        elif have[name] != version:
            out.append(f"{name} {have[name]} (the lock has {version})")
    return out


def check(node: str, lock_sha256: str) -> tuple[dict[str, str], str | None]:
    """What this interpreter runs of the lock's packages (a node's status reports it), and why the
    node is off its lock (None: it runs the lock exactly). The lock is at $DLINFRA_LOCK_FILE (a
    local node's, set by its launcher), else where install.sh put it."""
    lock_file = Path(os.environ.get("DLINFRA_LOCK_FILE") or LOCK_PATH)
    have = installed()
    locked = pins_of(lock_file.read_text(encoding="utf-8")) if lock_file.is_file() else {}
    runs = {name: have[name] for name in sorted(locked) if name in have}
    problems = drift(lock_file, lock_sha256, have)
    if not problems:
        return runs, None
    shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
    return runs, (
        f"node {node} does not run the run's environment (lock {lock_sha256[:12]}): {shown}. "
        "Fix: a node's environment must come from the run's lock alone: rebuild the image (dlinfra "
        "image build) or let the node install at boot"
    )

"""Locks resolved before, by their inputs: what this machine last resolved for the same requirements,
dlinfra build, platform and index. `validate`, `render`, `plan` and `deploy` take it, about a second
sooner and without the network, as a lock file keeps an environment until its inputs change;
`--refresh-lock` resolves anew (the newest releases the requirements allow) and leaves its lock here.
Offline, when uv's own cache cannot lock it either, a refresh takes this one and says so."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from dlinfra.environment.lock import Flavor, Index, IndexUnreachable, Lock, Platform, resolve
from dlinfra.environment.venvs import cache_home


def locked(
    dlinfra: str,
    requirements: list[str],
    flavor: Flavor,
    target: Platform,
    index: Index,
    script: bool,
    fresh: bool,
) -> Lock:
    """resolve(...), from the cache unless `fresh` and the index answers; a fresh lock is cached for
    the next call. A lock from the cache says when it was resolved (Lock.note)."""
    path = cache_home() / "locks" / f"{_key(dlinfra, requirements, flavor, target, index, script)}.lock"
    if not fresh and path.is_file():
        note = f"{_resolved_on(path)} (--refresh-lock resolves anew)"
        return Lock(path.read_text(encoding="utf-8"), flavor, target, note)
    try:
        lock = resolve(dlinfra, requirements, flavor, target, index, script)
    except IndexUnreachable:
        if not path.is_file():
            raise
        note = (
            f"the package index did not answer ({index.shown()}), nor could uv's cache lock it: "
            f"{_resolved_on(path)}, as it was"
        )
        return Lock(path.read_text(encoding="utf-8"), flavor, target, note)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(lock.text, encoding="utf-8")
    scratch.replace(path)  # whole or absent: two deploys at once each write their own first
    return lock


def _resolved_on(path: Path) -> str:
    when = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return f"the lock this machine resolved for the same inputs on {when:%Y-%m-%d %H:%M} UTC"


def _key(
    dlinfra: str, requirements: list[str], flavor: Flavor, target: Platform, index: Index, script: bool
) -> str:
    # a wheel by its content (its dependencies are in it), a release by its pin
    build = hashlib.sha256(Path(dlinfra).read_bytes()).hexdigest() if dlinfra.endswith(".whl") else dlinfra
    inputs = [build, requirements, flavor, repr(target), index.url, list(index.extra), index.extra_ca, script]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:32]

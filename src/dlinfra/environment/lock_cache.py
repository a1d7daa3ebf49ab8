"""Locks resolved before, by their inputs: what this machine last resolved for the same requirements,
dlinfra build, platform and index. `validate`, `render`, `plan` and `deploy` take it, about a second
sooner and without the network, as a lock file keeps an environment until its inputs change;
`--refresh-lock` resolves anew (the newest releases the requirements allow) and leaves its lock here.
Offline, when uv's own cache cannot lock it either, a refresh takes this one and says so."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from datetime import UTC, datetime
from pathlib import Path

from dlinfra.environment.declared import Declared
from dlinfra.environment.lock import PREFERRED, Flavor, Index, IndexUnreachable, Lock, Platform, resolve
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
    if dlinfra.endswith(".whl"):
        build = _dependencies(Path(dlinfra))
    elif dlinfra.endswith("pyproject.toml"):
        build = Declared.read(Path(dlinfra)).key()
    else:
        build = dlinfra  # a release, by its pin
    inputs = [
        build, requirements, flavor, repr(target), index.url, list(index.extra), index.extra_ca, script,
        list(PREFERRED),
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:32]


def _dependencies(wheel: Path) -> str:
    """What of a wheel its lock depends on: its name, version and dependency metadata. A checkout's
    wheel changes with every edit; its lock only when pyproject.toml's dependencies do."""
    with zipfile.ZipFile(wheel) as zipped:
        (name,) = [n for n in zipped.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        text = zipped.read(name).decode("utf-8")
    fields = ("Name:", "Version:", "Requires-Python:", "Requires-Dist:", "Provides-Extra:")
    head = text.split("\n\n", 1)[0]  # the headers; the body is the README
    return "\n".join(line for line in head.splitlines() if line.startswith(fields))

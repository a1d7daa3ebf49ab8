"""Reruns: a recorded run deployed again from what its manifest pinned.

The spec comes from the run's spec.lock.yaml and the code from the bundle in its store (not from
the working tree, which may have moved on). What the manifest could not pin is refused, naming the
gap, unless the user accepts it with --allow-unpinned; the new run records what it lacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlinfra.environment.lock import Flavor, Lock
from dlinfra.errors import SpecError
from dlinfra.runs.bundle import Bundle
from dlinfra.runs.manifest import Manifest, WheelPin
from dlinfra.runs.run import Run, home
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.model import Spec
from dlinfra.targets import hardware_problems


@dataclass(frozen=True)
class Origin:
    spec: Spec
    code: Bundle | None
    pins: dict[str, Any]  # manifest fields of the new run: rerun_of, the original's git state, gaps
    wheel: Path | None  # the dlinfra wheel the original nodes installed
    locks: dict[Flavor, Lock] | None  # the original's environment (None: resolve anew, --refresh-lock)


def unpinned(manifest: Manifest) -> list[str]:
    """What a rerun of this manifest could not reproduce exactly, each with its fix."""
    gaps = []
    git = manifest.git or {}
    if git.get("dirty"):
        gaps.append(
            f"the original run came from a git tree with uncommitted changes (commit {git['commit'][:12]}), "
            "so its commit does not describe it. Fix: commit, then deploy anew"
        )
    dataset = manifest.dataset
    if dataset is None:
        gaps.append("the original run's manifest names no dataset pin (recorded by an older dlinfra)")
    elif not dataset.get("pinned"):
        gaps.append(
            f"training.dataset.uri {dataset.get('uri')} has no recorded sha256, so the data may have "
            "changed. Fix: set training.dataset.sha256 in the experiment and deploy anew"
        )
    return gaps


def load_origin(
    run_id: str, overrides: Overrides, allow_unpinned: bool, refresh_lock: bool = False
) -> Origin:
    run = Run.open(run_id)
    manifest = run.manifest()
    gaps = unpinned(manifest)
    if gaps and not allow_unpinned:
        raise SpecError(
            [f"rerun {run_id}: {gap}" for gap in gaps]
            + ["Or accept the difference: dlinfra rerun RUN --allow-unpinned"]
        )
    spec = load_spec(run.dir / "spec.lock.yaml", overrides, check=hardware_problems)
    code = None
    if pin := manifest.bundle:
        code = Bundle(run.store().bundle(pin.sha256), pin.entrypoint)
    elif spec.training.entrypoint or spec.training.command:
        field = "entrypoint" if spec.training.entrypoint else "command"
        raise SpecError([f"rerun {run_id}: the run used training.{field} but recorded no code bundle"])
    wheel = _original_wheel(run, manifest.wheel) if manifest.wheel else None
    pins = {"rerun_of": run.id, "unpinned": gaps, "git": manifest.git, "spec_path": manifest.spec_path}
    # the images the original booted: its target boots them again (see the target's plan)
    pins |= {"images": manifest.images, "ami_id": manifest.ami_id}
    locks = None if refresh_lock else original_locks(run, manifest)
    if refresh_lock:
        pins["lock_changes"] = []  # filled in once the new locks exist (see lock_changes)
    return Origin(spec, code, pins, wheel, locks)


def original_locks(run: Run, manifest: Manifest) -> dict[Flavor, Lock] | None:
    """The locks the original run's nodes installed, from its run dir or store, checked against
    their pins (None: a run recorded before locks, whose rerun resolves anew)."""
    if not manifest.environment:
        return None
    locks: dict[Flavor, Lock] = {}
    for flavor, pin in manifest.environment.items():
        local = run.dir / "code" / pin.file
        text = (
            local.read_text(encoding="utf-8") if local.is_file() else run.store().lock(pin.file, pin.sha256)
        )
        lock = Lock(text, flavor)  # type: ignore[arg-type]
        if lock.sha256 != pin.sha256:
            raise SpecError([f"rerun {run.id}: {local} does not match its pinned sha256 {pin.sha256[:12]}"])
        locks[flavor] = lock  # type: ignore[index]
    return locks


def _original_wheel(run: Run, pin: WheelPin) -> Path:
    """The original run's wheel, checked against its pin, in the local wheel cache."""
    path = home() / "wheels" / f"pinned-{pin.sha256[:16]}" / pin.name
    if not path.is_file():
        data = run.store().wheel(pin.name, pin.sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return path

"""Reruns: a recorded run deployed again from what its manifest pinned.

The spec comes from the run's spec.lock.yaml and the code from the bundle in its store (not from
the working tree, which may have moved on). What the manifest could not pin is refused, naming the
gap, unless the user accepts it with --allow-unpinned; the new run records what it lacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlinfra.errors import SpecError
from dlinfra.runs.bundle import Bundle
from dlinfra.runs.records import Manifest, WheelPin
from dlinfra.runs.run import Run, home
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.model import Spec
from dlinfra.targets import hardware_problems


@dataclass(frozen=True)
class Origin:
    spec: Spec
    code: Bundle | None
    pins: dict[str, Any]  # manifest fields of the new run: rerun_of, the original's git state, gaps
    wheel: Path | None  # aws: the dlinfra wheel the original nodes installed


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


def load_origin(run_id: str, overrides: Overrides, allow_unpinned: bool) -> Origin:
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
    elif spec.training.entrypoint:
        raise SpecError([f"rerun {run_id}: the run used training.entrypoint but recorded no code bundle"])
    wheel = _original_wheel(run, manifest.wheel) if manifest.wheel else None
    pins = {"rerun_of": run.id, "unpinned": gaps, "git": manifest.git, "spec_path": manifest.spec_path}
    # the images the original booted: its target boots them again (see the target's plan)
    pins |= {"images": manifest.images, "ami_id": manifest.ami_id}
    return Origin(spec, code, pins, wheel)


def _original_wheel(run: Run, pin: WheelPin) -> Path:
    """The original run's wheel, checked against its pin, in the local wheel cache."""
    path = home() / "wheels" / f"pinned-{pin.sha256[:16]}" / pin.name
    if not path.is_file():
        data = run.store().wheel(pin.name, pin.sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return path

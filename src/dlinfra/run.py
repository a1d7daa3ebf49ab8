"""Runs: readable ids, the run directory, spec.lock.yaml and the manifest that pins a run."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import shlex
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from dlinfra import __version__
from dlinfra.errors import RunNotFound
from dlinfra.spec import Spec

TERMINAL_STATES = ("DONE", "FAILED", "STOPPED")


def home() -> Path:
    """Where run dirs live: $DLINFRA_HOME, else ./.dlinfra (next to the experiment, like .terraform)."""
    return Path(os.environ.get("DLINFRA_HOME") or ".dlinfra").absolute()


def new_run_id(name: str, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def package_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def git_state(path: Path) -> dict[str, Any] | None:
    """Commit and dirty flag of the repo holding `path`, or None outside git."""
    where = path if path.is_dir() else path.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


@dataclass(frozen=True)
class Run:
    """One deployment of a spec, recorded under ``home()/runs/<id>``."""

    id: str
    dir: Path

    @classmethod
    def create(cls, spec: Spec, spec_path: Path | None = None, argv: list[str] | None = None) -> Run:
        run_id = new_run_id(spec.name)
        run_dir = home() / "runs" / run_id
        run_dir.mkdir(parents=True)
        lock = spec.to_yaml()
        (run_dir / "spec.lock.yaml").write_text(lock, encoding="utf-8")
        run = cls(run_id, run_dir)
        manifest = {
            "run_id": run_id,
            "name": spec.name,
            "target": spec.target,
            "strategy": spec.strategy,
            "status": "CREATED",
            "created": utc_now(),
            "store_url": run.default_store_url(spec),
            "spec_sha256": hashlib.sha256(lock.encode()).hexdigest(),
            "spec_path": str(spec_path.absolute()) if spec_path else None,
            "command": shlex.join(argv if argv is not None else sys.argv),
            "git": git_state(spec_path.absolute()) if spec_path else None,
            "versions": {
                "dlinfra": __version__,
                "python": platform.python_version(),
                "tensorflow": package_version("tensorflow-cpu", "tensorflow"),
                "keras": package_version("keras"),
                "tf-keras": package_version("tf-keras"),
                "numpy": package_version("numpy"),
                "scikit-learn": package_version("scikit-learn"),
            },
        }
        run.write_manifest(manifest)
        return run

    @classmethod
    def open(cls, run_id: str | None = None) -> Run:
        """The named run, or the newest one when `run_id` is None."""
        runs_dir = home() / "runs"
        if run_id is None:
            runs = list_runs()
            if not runs:
                raise RunNotFound(f"no runs under {runs_dir}. Fix: start one with `dlinfra deploy`")
            return runs[0]
        run_dir = runs_dir / run_id
        if not (run_dir / "manifest.json").is_file():
            raise RunNotFound(f"run {run_id!r} not found under {runs_dir}. Fix: `dlinfra runs` lists them")
        return cls(run_id, run_dir)

    def default_store_url(self, spec: Spec) -> str:
        if spec.storage.url:
            return f"{spec.storage.url}/{self.id}"
        return f"file://{self.dir / 'store'}"

    def spec(self) -> Spec:
        return Spec.model_validate(yaml.safe_load((self.dir / "spec.lock.yaml").read_text(encoding="utf-8")))

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.dir / "manifest.json").read_text(encoding="utf-8"))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        tmp = self.dir / "manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.dir / "manifest.json")

    def update_manifest(self, **fields: Any) -> dict[str, Any]:
        manifest = self.manifest() | fields
        self.write_manifest(manifest)
        return manifest

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"


def list_runs() -> list[Run]:
    """Every recorded run, newest first."""
    runs_dir = home() / "runs"
    if not runs_dir.is_dir():
        return []
    found = [Run(p.name, p) for p in runs_dir.iterdir() if (p / "manifest.json").is_file()]
    return sorted(found, key=lambda r: r.manifest().get("created", ""), reverse=True)

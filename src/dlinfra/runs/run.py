"""Runs: readable ids, the run directory, spec.lock.yaml and the manifest that pins a run."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from dlinfra import __version__
from dlinfra.contract import StoreConfig
from dlinfra.errors import RunNotFound, StoreError
from dlinfra.runs.layout import MANIFEST, RunStore, parse
from dlinfra.runs.manifest import Manifest
from dlinfra.spec.grammar import RUN_ID_RE
from dlinfra.spec.input import shown
from dlinfra.spec.model import Spec

SPEC_LOCK = "spec.lock.yaml"
LAST_RE = re.compile(r"@last(?:~(\d{1,6}))?")
SHORT_REF_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")  # lower-case names, digits, dashes: never a path
AMBIGUOUS_SHOWN = 10


def home() -> Path:
    """Where run dirs live: $DLINFRA_HOME, else ./.dlinfra (next to the experiment, like .terraform)."""
    return Path(os.environ.get("DLINFRA_HOME") or ".dlinfra").absolute()


def new_run_id(name: str, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def utc_now(timestamp: float | None = None) -> str:
    when = datetime.now(UTC) if timestamp is None else datetime.fromtimestamp(timestamp, UTC)
    return when.isoformat(timespec="seconds")


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
        (run_dir / SPEC_LOCK).write_text(lock, encoding="utf-8")
        run = cls(run_id, run_dir)
        store_url = f"{spec.storage.url}/{run_id}" if spec.storage.url else f"file://{run_dir / 'store'}"
        manifest = Manifest(
            run_id=run_id,
            name=spec.name,
            target=spec.target,
            strategy=spec.strategy,
            status="CREATED",
            created=utc_now(),
            store=StoreConfig.for_run(spec, store_url),
            spec_sha256=hashlib.sha256(lock.encode()).hexdigest(),
            spec_path=str(spec_path.absolute()) if spec_path else None,
            command=shlex.join(argv if argv is not None else sys.argv),
            git=git_state(spec_path.absolute()) if spec_path else None,
            # what the nodes run: planned from the lock at prepare, then what they report (runs.versions)
            versions={"dlinfra": __version__},
        )
        run.write_manifest(manifest)
        return run

    @classmethod
    def open(cls, ref: str | None = None) -> Run:
        """The run `ref` names (a whole id, a unique prefix, its 4-hex suffix, @last or @last~N), or
        the newest one when `ref` is None."""
        runs_dir = home() / "runs"
        if ref is None:
            ref = "@last"
        if RUN_ID_RE.fullmatch(ref):  # a whole id: no need to list every run
            if not (runs_dir / ref / MANIFEST).is_file():
                raise RunNotFound(
                    f"run {shown(ref)} not found under {runs_dir}. Fix: `dlinfra runs` lists them"
                )
            return cls(ref, runs_dir / ref)
        run_id = resolve_run_ref(ref, [run.id for run in list_runs()])
        return cls(run_id, runs_dir / run_id)

    def spec(self) -> Spec:
        path = self.dir / SPEC_LOCK
        try:
            return Spec.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, yaml.YAMLError) as exc:  # pydantic's ValidationError is a ValueError
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreError(
                f"{path} cannot be read as this dlinfra's spec ({first}). "
                "Fix: restore it, or remove the run dir"
            ) from None

    def select_nodes(self, node: str | None) -> list[str]:
        """`node` when the run has it, else every node of the run."""
        nodes = self.manifest().nodes
        if node is not None and node not in nodes:
            fix = (
                f"use one of {', '.join(nodes)}" if nodes else "it started no node; `dlinfra show` tells why"
            )
            raise RunNotFound(f"run {self.id} has no node {shown(node)}. Fix: {fix}")
        return [node] if node else nodes

    def manifest(self) -> Manifest:
        path = self.dir / MANIFEST
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # not JSON, not UTF-8, unreadable
            raise StoreError(f"{path} is not JSON ({exc}). Fix: restore it, or remove the run dir") from None
        return parse(Manifest, raw, str(path))

    def write_manifest(self, manifest: Manifest) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{MANIFEST}.")  # each writer its own
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(manifest.model_dump_json(indent=2) + "\n")
        os.replace(tmp, self.dir / MANIFEST)

    def update_manifest(self, **fields: Any) -> Manifest:
        """Set manifest fields (validated: an unknown field or a wrong type is an error). The read and
        the write are one step for every writer (a heal's supervisor thread records pids while the
        watcher records the heal), so no field another writer set is lost."""
        with open(self.dir / f".{MANIFEST}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a lock per open file: threads of one process wait too
            manifest = Manifest.model_validate(self.manifest().model_dump() | fields)
            self.write_manifest(manifest)
        return manifest

    def store(self) -> RunStore:
        """The run's store, configured as its nodes were."""
        return RunStore.open(self.manifest().store)

    def node_log(self, node: str) -> list[str]:
        """A node's log: from the run dir when the node ran here, else from the store."""
        local = self.dir / "logs" / f"{node}.log"
        if local.is_file():
            return local.read_text(encoding="utf-8", errors="replace").splitlines()
        return self.store().log_lines(node)

    def vm_dir(self, node: str) -> Path:
        """Where a node's VM keeps its disk, seed, console.log and shell socket (--emulate-instances=vm)."""
        return self.dir / "vms" / node

    def publish_manifest(self) -> None:
        """The manifest travels with the results: a run can be rerun from its store alone."""
        self.store().put_manifest(self.manifest())


def resolve_run_ref(ref: str, ids: list[str]) -> str:
    """The one id of `ids` (newest first) that `ref` names, the way git takes short commit ids:
    @last, @last~N (N runs before it), a unique prefix, or the 4-hex suffix."""
    last = LAST_RE.fullmatch(ref)
    if not last and not SHORT_REF_RE.fullmatch(ref):
        raise RunNotFound(
            f"run {shown(ref)} not found: a run id looks like digits-cnn-20261122-074449-713b; a unique "
            "prefix of one, its last 4 hex digits (713b), @last and @last~N name a run too. "
            "Fix: `dlinfra runs` lists them"
        )
    if not ids:
        raise RunNotFound(f"no runs under {home() / 'runs'}. Fix: start one with `dlinfra deploy`")
    if last:
        back = int(last.group(1) or 0)
        if back >= len(ids):
            raise RunNotFound(f"{ref}: there are only {len(ids)} runs. Fix: `dlinfra runs` lists them")
        return ids[back]
    matches = [i for i in ids if i.startswith(ref) or i.rpartition("-")[2] == ref]
    if not matches:
        raise RunNotFound(
            f"run {shown(ref)} not found: no run id under {home() / 'runs'} starts with it or ends in it. "
            "Fix: `dlinfra runs` lists them"
        )
    if len(matches) > 1:
        listed = ", ".join(matches[:AMBIGUOUS_SHOWN])
        more = f" and {len(matches) - AMBIGUOUS_SHOWN} more" if len(matches) > AMBIGUOUS_SHOWN else ""
        raise RunNotFound(
            f"run {shown(ref)} is ambiguous: it matches {len(matches)} runs: {listed}{more}. "
            "Fix: give more of the id"
        )
    return matches[0]


def short_labels(run_ids: list[str]) -> list[str]:
    """Labels for runs shown side by side: the experiment name and the id's 4-hex suffix
    (digits-cnn:713b); the whole ids when two of those would read alike."""
    labels = [f"{i.rsplit('-', 3)[0]}:{i.rpartition('-')[2]}" for i in run_ids]
    return labels if len(set(labels)) == len(labels) else list(run_ids)


def list_runs() -> list[Run]:
    """Every recorded run, newest first."""
    runs_dir = home() / "runs"
    if not runs_dir.is_dir():
        return []
    found = [Run(p.name, p) for p in runs_dir.iterdir() if (p / MANIFEST).is_file()]
    return sorted(found, key=lambda r: _created(r.dir), reverse=True)


def seconds_per_step(name: str, target: str) -> float | None:
    """How long a step took in the newest finished run of experiment `name` on `target`, if any."""
    for run in list_runs():
        try:
            m = run.manifest()
        except StoreError:  # another dlinfra's record: it times nothing of ours
            continue
        done = m.metrics or {}
        timed = done.get("steps") and done.get("train_seconds")  # a script's steps may be unknown
        if m.name == name and m.target == target and m.status == "DONE" and timed:
            return float(done["train_seconds"]) / int(done["steps"])
    return None


def _created(run_dir: Path) -> str:
    """Sort key that survives a manifest of another schema version (listed, not read)."""
    try:
        return str(json.loads((run_dir / MANIFEST).read_text(encoding="utf-8")).get("created", ""))
    except (OSError, ValueError, AttributeError):
        return ""

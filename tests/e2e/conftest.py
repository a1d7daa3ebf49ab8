"""Shared cluster runs: each real TensorFlow cluster is deployed once per module and inspected by
many tests (deploying is the expensive part; 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support import run_cli


@dataclass
class Deployed:
    result: subprocess.CompletedProcess[str]
    home: Path
    run_dir: Path

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "manifest.json").read_text())

    @property
    def store(self) -> Path:
        return self.run_dir / "store"

    @property
    def metrics(self) -> dict[str, Any]:
        return json.loads((self.store / "metrics.json").read_text())


def deploy(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Deployed:
    home = tmp / "home"
    full_env = dict(os.environ, DLINFRA_HOME=str(home), **(env or {}))
    result = run_cli("deploy", *args, env=full_env, cwd=tmp, timeout=600)
    runs = sorted((home / "runs").iterdir()) if (home / "runs").exists() else []
    assert runs, result.stdout + result.stderr
    return Deployed(result, home, runs[-1])


@pytest.fixture(scope="session")
def ps_run(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    """The README's main job: built-in digits example, 1 chief + 3 workers + 1 ps."""
    return deploy(tmp_path_factory.mktemp("ps"), "--workers", "3")


@pytest.fixture(scope="session")
def mirrored_run(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    return deploy(tmp_path_factory.mktemp("mwms"), "--strategy", "multi_worker_mirrored", "--workers", "2")

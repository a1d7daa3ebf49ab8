"""Reruns on real local clusters: the original's locked spec and code bundle, deterministic losses,
and refusal of what the manifest could not pin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DATA = Path(__file__).parent.parent / "data"
EXPERIMENT = """\
name: det-digits
strategy: multi_worker_mirrored
cluster: {workers: {count: 1}}
training:
  entrypoint: code/user_program.py:build
  deterministic: true
  steps: 200
  log_every: 10
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
    )


def _repo(root: Path) -> Path:
    """An experiment repo: the spec plus its training code, committed."""
    (root / "code").mkdir(parents=True)
    shutil.copy(DATA / "user_program.py", root / "code" / "user_program.py")
    (root / "experiment.yaml").write_text(EXPERIMENT)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "experiment")
    return root


class Home:
    def __init__(self, root: Path):
        self.root, self.env = root, dict(os.environ, DLINFRA_HOME=str(root / "home"))

    def cli(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=self.env, cwd=cwd, timeout=600)

    def run_dir(self, run_id: str) -> Path:
        return self.root / "home" / "runs" / run_id

    def newest(self) -> Path:
        return max((self.root / "home" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)

    def manifest(self, run_dir: Path) -> dict[str, Any]:
        return json.loads((run_dir / "manifest.json").read_text())

    def metrics(self, run_dir: Path) -> dict[str, Any]:
        return json.loads((run_dir / "store" / "metrics.json").read_text())


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Home, Path, Path]:
    root = tmp_path_factory.mktemp("rerun")
    repo = _repo(root / "repo")
    home = Home(root)
    result = home.cli("deploy", "experiment.yaml", cwd=repo)
    assert result.returncode == 0, result.stdout + result.stderr
    return home, repo, home.newest()


def test_rerun_repeats_the_locked_spec_the_bundled_code_and_the_losses(
    original: tuple[Home, Path, Path],
) -> None:
    home, repo, first = original
    pins = home.manifest(first)
    assert pins["git"]["dirty"] is False and pins["bundle"]["entrypoint"] == "user_program.py:build"
    assert pins["dataset"]["pinned"] and pins["seeds"] == {"seed": 42, "deterministic": True}
    assert json.loads((first / "store" / "manifest.json").read_text())["bundle"] == pins["bundle"]
    # The tree moves on after the run; the rerun must still run the original code.
    (repo / "code" / "user_program.py").write_text("raise SystemExit('the edited code must not run')\n")
    result = home.cli("rerun", first.name, cwd=repo)
    assert result.returncode == 0, result.stdout + result.stderr
    second = home.newest()
    assert second != first
    again = home.manifest(second)
    assert again["rerun_of"] == first.name and again["status"] == "DONE"
    assert (second / "spec.lock.yaml").read_bytes() == (first / "spec.lock.yaml").read_bytes()
    assert again["bundle"]["sha256"] == pins["bundle"]["sha256"]
    bundle = f"code/bundle-{pins['bundle']['sha256']}.tar.gz"
    assert (second / "store" / bundle).read_bytes() == (first / "store" / bundle).read_bytes()
    losses = home.metrics(first)["loss_series"]
    assert len(losses) == 20 and losses == home.metrics(second)["loss_series"], "deterministic sync run"
    assert home.metrics(first)["eval_accuracy"] == home.metrics(second)["eval_accuracy"]


def test_rerun_refuses_a_dirty_tree_unless_allowed(original: tuple[Home, Path, Path]) -> None:
    home, repo, _ = original
    _git(repo, "checkout", "--", "code")
    (repo / "experiment.yaml").write_text(EXPERIMENT.replace("steps: 200", "steps: 20"))  # uncommitted
    result = home.cli("deploy", "experiment.yaml", cwd=repo)
    assert result.returncode == 0, result.stdout + result.stderr
    dirty = home.newest()
    assert home.manifest(dirty)["git"]["dirty"] is True
    runs_before = sorted(p.name for p in (home.root / "home" / "runs").iterdir())
    refused = home.cli("rerun", dirty.name, cwd=repo)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "uncommitted changes" in refused.stderr and "--allow-unpinned" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert sorted(p.name for p in (home.root / "home" / "runs").iterdir()) == runs_before, "nothing created"
    allowed = home.cli("rerun", dirty.name, "--allow-unpinned", cwd=repo)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    manifest = home.manifest(home.newest())
    assert manifest["rerun_of"] == dirty.name and "uncommitted changes" in manifest["unpinned"][0]


def test_rerun_of_an_unknown_run_exits_2(original: tuple[Home, Path, Path]) -> None:
    home, repo, _ = original
    result = home.cli("rerun", "no-such-run", cwd=repo)
    assert result.returncode == 2 and "no-such-run" in result.stderr and "Traceback" not in result.stderr

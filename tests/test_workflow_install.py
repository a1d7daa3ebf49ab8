"""Which dlinfra the generated workflows install, and a dlinfra installed the normal way (a wheel in a
fresh venv, not this checkout) planning through them.

`dlinfra init --github` pins the dlinfra that ran it (a git commit, a hosted wheel by sha256), or
refuses without --install. The plan job's own steps then run for real from a venv that holds only
a wheel of this worktree: the workflow's `Install dlinfra` step pip-installs it, the plan ships
that running dlinfra to the nodes as a wheel repacked from the installed distribution (pinned by
sha256 in the manifest, never asked of the index), and a failing plan fails the job. What stands in:
setup-python (the fresh venv first on PATH), setup-terraform (the provider mirror), the
dependencies uv puts into the venv beforehand (PyPI's downloads), and the artifact upload."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dlinfra.github import PLAN
from dlinfra.github.install import pinned
from support import REPO, git, review_repo
from workflow_steps import run_job

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GIT_PIN = f"dlinfra[aws,emulator] @ git+https://github.com/octo/dlinfra@{COMMIT}"


# ---------------------------------------------------------------- init --github's default install


@pytest.mark.parametrize(
    ("direct_url", "expected"),
    [
        (
            {"url": "https://github.com/octo/dlinfra", "vcs_info": {"vcs": "git", "commit_id": COMMIT}},
            GIT_PIN,
        ),
        (
            {
                "url": "https://h.example/dlinfra-0.1.0-py3-none-any.whl",
                "archive_info": {"hash": "sha256=" + "e" * 64},
            },
            "dlinfra[aws,emulator] @ https://h.example/dlinfra-0.1.0-py3-none-any.whl#sha256=" + "e" * 64,
        ),
        ({"url": "https://h.example/dlinfra.whl", "archive_info": {}}, None),  # no hash: it could move
        ({"url": "file:///home/me/dlinfra-0.1.0-py3-none-any.whl", "archive_info": {}}, None),
        ({}, None),  # an index: which one is not recorded, and the name may be anyone's there
    ],
)
def test_default_install_is_the_running_dlinfra_pinned_or_none(
    direct_url: dict[str, object], expected: str | None
) -> None:
    assert pinned(direct_url)[0] == expected


def test_default_install_of_a_checkout_is_its_commit_only_when_clean_and_public(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    checkout = {"url": tmp_path.as_uri(), "dir_info": {"editable": True}}
    assert pinned(checkout) == (None, f"the checkout {tmp_path}, which has no `origin` remote")
    git(tmp_path, "remote", "add", "origin", "git@github.com:octo/dlinfra.git")
    assert pinned(checkout)[0] == f"dlinfra[aws,emulator] @ git+https://github.com/octo/dlinfra.git@{head}"
    git(tmp_path, "add", "f")  # staged, not committed: HEAD is not the code that runs
    assert pinned(checkout)[0] is None
    git(tmp_path, "remote", "set-url", "origin", "https://x:ghp_0123456789abcdefABCDEF@github.com/o/d")
    git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "f")
    found, how = pinned(checkout)
    assert found is None and "ghp_" not in how, "a token in the remote is never written, nor shown"


# ---------------------------------------------------------------- a dlinfra installed from a wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv's bin holding dlinfra's dependencies (uv, from this venv's pins): no dlinfra yet."""
    root = tmp_path_factory.mktemp("installed")
    uv = Path(sys.executable).with_name("uv")
    wheels = root / "dist"
    subprocess.run([uv, "build", "--wheel", "-q", "-o", wheels, REPO], check=True, capture_output=True)
    subprocess.run([uv, "venv", "-q", "--seed", "-p", sys.executable, root / "venv"], check=True)
    pins = subprocess.run([uv, "pip", "freeze", "--python", sys.executable], capture_output=True, text=True)
    (root / "pins.txt").write_text("".join(f"{p}\n" for p in pins.stdout.splitlines() if "==" in p))
    # dlinfra's dependencies, as pip would fetch them from PyPI; dlinfra itself is the workflow's step
    [wheel] = wheels.glob("dlinfra-*.whl")
    python = root / "venv" / "bin" / "python"
    deps = [uv, "pip", "install", "-q", "--python", python, "-c", root / "pins.txt"]
    subprocess.run([*deps, f"{wheel}[aws,emulator]"], check=True, capture_output=True)
    subprocess.run([uv, "pip", "uninstall", "-q", "--python", python, "dlinfra"], check=True)
    return root


def test_init_github_from_an_installed_wheel_refuses_without_install_and_names_the_choices(
    installed: Path, tmp_path: Path
) -> None:
    """A dlinfra installed from a local wheel has no pin a runner could install: no version guessed."""
    bin_dir = installed / "venv" / "bin"
    [wheel] = (installed / "dist").glob("dlinfra-*.whl")
    pip = [bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)]
    subprocess.run(pip, check=True, capture_output=True)
    result = subprocess.run(
        [bin_dir / "dlinfra", "init", "--github"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stdout + result.stderr
    message = " ".join(result.stderr.split())
    assert "--install" in message and "git+https://github.com/ORG/dlinfra@COMMIT" in message
    assert "#sha256=" in message and "Traceback" not in message
    assert not (tmp_path / ".github").exists()


@pytest.mark.terraform
@pytest.mark.slow
def test_plan_workflow_from_a_pip_installed_dlinfra_ships_its_wheel_and_a_failed_plan_is_red(
    installed: Path, tmp_path: Path, tf_cli_config: Path
) -> None:
    [wheel] = (installed / "dist").glob("dlinfra-*.whl")
    user = tmp_path / "user"
    user.mkdir()
    install = f"dlinfra[aws,emulator] @ {wheel.as_uri()}"
    written = subprocess.run(
        [sys.executable, "-m", "dlinfra", "init", "--github", "--install", install],
        cwd=user,
        capture_output=True,
    )
    assert written.returncode == 0, written.stderr
    repo = tmp_path / "repo"
    base, head = review_repo(repo)
    bin_dir = installed / "venv" / "bin"
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "VIRTUAL_ENV", "PYTHON"))}
    env |= {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",  # setup-python's stand-in: the fresh venv
        "HOME": str(home),
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "TF_CLI_CONFIG_FILE": str(tf_cli_config),  # setup-terraform's: the provider mirror
        "PIP_NO_INDEX": "1",  # pip installs the wheel; its dependencies are in the venv already
        "DLINFRA_CACHE": str(tmp_path / "cache"),  # the repacked wheel is made by this very run
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
    }
    github = {
        "github.event.pull_request.base.sha": base,
        "github.event.pull_request.head.sha": head,
        "github.event.pull_request.number": "7",
    }
    workflow = user / ".github" / "workflows" / PLAN
    job = run_job(workflow, "plan", repo, github, env)
    out = job.outputs["Plan the changed experiments"]
    comment = (repo / "dlinfra-plan" / "comment.md").read_text()
    assert "dlinfra plan failed" not in comment and "| worker | 3 → 5 (+2)" in comment, comment + out.stderr
    located = subprocess.run(
        [bin_dir / "python", "-c", "import dlinfra; print(dlinfra.__file__)"], capture_output=True, text=True
    )
    assert str(bin_dir.parent) in located.stdout, "the plan ran the installed dlinfra, not this checkout"
    runs = sorted((tmp_path / "runner-temp" / "dlinfra-home" / "runs").iterdir())
    assert runs
    for run in runs:
        manifest = json.loads((run / "manifest.json").read_text())
        shipped = run / "code" / manifest["wheel"]["name"]
        assert hashlib.sha256(shipped.read_bytes()).hexdigest() == manifest["wheel"]["sha256"]
        with zipfile.ZipFile(shipped) as zf, zipfile.ZipFile(wheel) as built:
            ours = {n: zf.read(n) for n in zf.namelist() if n.startswith("dlinfra/")}
            assert ours == {n: built.read(n) for n in built.namelist() if n.startswith("dlinfra/")}
        for lock in (run / "code").glob("env-*.lock"):
            assert "dlinfra" not in lock.read_text(), "the lock never asks the index for dlinfra"

    # a pull request that breaks the experiment: its review says why, and the job is red
    (repo / "experiments" / "demo.yaml").write_text("name: demo\ncluster:\n  workers:\n    count: -3\n")
    git(repo, "commit", "-q", "-am", "no workers")
    github["github.event.pull_request.base.sha"] = head
    job = run_job(workflow, "plan", repo, github, env, check=False)
    assert job.failed == "Plan the changed experiments"
    assert "dlinfra plan failed for 1 of 1 experiment file(s)" in job.outputs[job.failed].stderr
    assert "dlinfra plan failed" in (repo / "dlinfra-plan" / "comment.md").read_text()
    assert job.skipped[-1].startswith("actions/upload-artifact"), "the failed review is still uploaded"

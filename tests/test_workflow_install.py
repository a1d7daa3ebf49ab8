"""Which dlinfra the generated workflows install, and a dlinfra installed the normal way (a wheel in a
fresh venv, not this checkout) planning through them under act (tests/act_runner.py).

`dlinfra init --github` pins the dlinfra that ran it (a git commit, a hosted wheel by sha256), or
refuses without --install. The plan workflow then runs under act from a venv that holds dlinfra's
dependencies only: its `Install dlinfra` step pip-installs the wheel, the plan ships that running
dlinfra to the nodes as a wheel repacked from the installed distribution (pinned by sha256, never
asked of the index), the comment workflow posts the review, and a failing plan or a failing API
call makes its job red. What stands in: the actions that need the internet (act_runner.STAND_INS),
GitHub's API, and the dependencies uv puts into the venv beforehand (PyPI's downloads)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from act_runner import run_act

from dlinfra.github import COMMENT, PLAN
from dlinfra.github.install import pinned
from support import REPO, git, review_repo

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
def test_workflows_under_act_plan_from_a_pip_installed_dlinfra_and_go_red_when_they_fail(
    installed: Path, tmp_path: Path, tf_cli_config: Path
) -> None:
    """The plan workflow and the comment workflow under act: a plan from a wheel-installed dlinfra
    ships that dlinfra to the nodes and posts its review; a failing plan and a failing API call each
    make their job red."""
    [wheel] = (installed / "dist").glob("dlinfra-*.whl")
    user = tmp_path / "user"
    user.mkdir()
    install = f"dlinfra[aws,emulator] @ {wheel.as_uri()}"
    init = [sys.executable, "-m", "dlinfra", "init", "--github", "--install", install]  # this checkout's
    assert subprocess.run(init, cwd=user, capture_output=True).returncode == 0
    workflows = user / ".github" / "workflows"
    repo = tmp_path / "repo"
    base, head = review_repo(repo)
    git(repo, "remote", "add", "origin", "https://github.com/octo/experiments.git")  # github.repository
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "VIRTUAL_ENV", "PYTHON"))}
    env |= {
        "STANDIN_PYTHON_BIN": str(installed / "venv" / "bin"),  # setup-python's stand-in puts it first
        "HOME": str(home),
        "TF_CLI_CONFIG_FILE": str(tf_cli_config),  # setup-terraform's: the provider mirror
        "PIP_NO_INDEX": "1",  # the workflow's pip installs the wheel; its dependencies are there
        "DLINFRA_CACHE": str(tmp_path / "cache"),  # the repacked wheel is made by this very run
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
    }
    pull = {
        "number": 7,
        "base": {"sha": base},
        "head": {"sha": head, "repo": {"full_name": "octo/experiments"}},
    }
    plan = run_act(workflows / PLAN, "pull_request", {"pull_request": pull}, repo, tmp_path / "act", env)
    assert plan.returncode == 0 and "Job succeeded" in plan.stdout, plan.stdout[-6000:] + plan.stderr
    review = tmp_path / "act" / "artifacts" / "dlinfra-plan"
    comment = (review / "comment.md").read_text()
    assert "dlinfra plan failed" not in comment and "| worker | 3 → 5 (+2)" in comment, comment
    # the run dirs went with the job's RUNNER_TEMP; the wheel the plan shipped is in dlinfra's cache
    [shipped] = (tmp_path / "cache").glob("wheels/installed-*/dlinfra-*.whl")
    with zipfile.ZipFile(shipped) as zf, zipfile.ZipFile(wheel) as built:
        ours = {n: zf.read(n) for n in zf.namelist() if n.startswith("dlinfra/")}
        assert ours == {n: built.read(n) for n in built.namelist() if n.startswith("dlinfra/")}
    # and the nodes install exactly it, by its sha256 (render: the same prepare, no terraform)
    render = [installed / "venv" / "bin" / "dlinfra", "render", "--target", "aws", "--out", tmp_path / "out"]
    rendered = subprocess.run(render, env=env | {"DLINFRA_HOME": str(tmp_path / "dh")}, capture_output=True)
    assert rendered.returncode == 0, rendered.stderr
    digest = hashlib.sha256(shipped.read_bytes()).hexdigest()
    for user_data in (tmp_path / "out").glob("*.user-data.yaml"):
        assert f"sha256:{digest}" in user_data.read_text()

    # the comment workflow posts it; then the head check fails (a rate limit): red, nothing posted
    state = tmp_path / "github.json"
    state.write_text(
        json.dumps({"repo": "octo/experiments", "pulls": {"7": head}, "comments": [], "calls": []})
    )
    run = {
        "event": "pull_request",
        "conclusion": "success",
        "head_sha": head,
        "name": "dlinfra plan",
        "id": 1,
    }
    run |= {"head_branch": "pr", "head_repository": {"full_name": "octo/experiments"}}
    env["GITHUB_STANDIN_STATE"] = str(state)
    posted = run_act(workflows / COMMENT, "workflow_run", {"workflow_run": run}, repo, tmp_path / "act", env)
    assert posted.returncode == 0 and "Job succeeded" in posted.stdout, posted.stdout[-4000:]
    [ours] = json.loads(state.read_text())["comments"]
    assert "| worker | 3 → 5 (+2)" in ours["body"]
    failing = json.loads(state.read_text()) | {
        "fail": {"GET repos/octo/experiments/pulls/7": "rate limit (HTTP 403)"}
    }
    state.write_text(json.dumps(failing))
    refused = run_act(workflows / COMMENT, "workflow_run", {"workflow_run": run}, repo, tmp_path / "act", env)
    assert refused.returncode != 0 and "Job failed" in refused.stdout, refused.stdout[-4000:]
    assert "could not read pull request #7" in refused.stdout and "forged" not in refused.stdout

    # a pull request that breaks the experiment: red, and its review (saying why) is still uploaded
    (repo / "experiments" / "demo.yaml").write_text("name: demo\ncluster:\n  workers:\n    count: -3\n")
    git(repo, "commit", "-q", "-am", "no workers")
    pull["base"]["sha"], pull["head"]["sha"] = head, git(repo, "rev-parse", "HEAD").strip()
    broken = run_act(workflows / PLAN, "pull_request", {"pull_request": pull}, repo, tmp_path / "act", env)
    assert broken.returncode != 0 and "Job failed" in broken.stdout, broken.stdout[-4000:]
    assert "dlinfra plan failed for 1 of 1 experiment file(s)" in broken.stdout
    assert "dlinfra plan failed" in (review / "comment.md").read_text()

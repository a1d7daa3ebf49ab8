"""Repository promises: workflows are valid, the README opens with the two commands, the test tiers
page names an end-to-end test per capability, the example spec is the defaults, the CLI lists its
commands, HCL ships in the wheel, benchmarks import."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dlinfra.spec.loading import example_text
from dlinfra.spec.model import Spec
from support import assert_valid_workflow

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("workflow", ["ci.yml", "plan.yml"])
def test_workflow_is_valid_for_github_actions(workflow: str) -> None:
    assert_valid_workflow(ROOT / ".github" / "workflows" / workflow)


def test_plan_workflow_uses_oidc_and_no_stored_keys() -> None:
    text = (ROOT / ".github" / "workflows" / "plan.yml").read_text()
    doc = yaml.safe_load(text)
    assert doc["jobs"]["plan"]["permissions"]["id-token"] == "write"
    assert "role-to-assume" in text
    assert "AWS_SECRET_ACCESS_KEY" not in text and "secrets." not in text


def test_plan_workflow_keeps_pr_code_away_from_writes() -> None:
    """PR code runs with the AWS role: behind a protected environment, with no token that can
    write to the repository or the PR, storing nothing; the commenting job runs no PR code."""
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "plan.yml").read_text())
    assert doc["permissions"] == {"contents": "read"}
    jobs = doc["jobs"]
    with_role = [name for name, job in jobs.items() if job.get("permissions", {}).get("id-token") == "write"]
    assert with_role == ["plan"]
    plan = jobs["plan"]
    assert plan["environment"] == "dlinfra-plan"
    assert plan["permissions"] == {"contents": "read", "id-token": "write"}
    runs = "\n".join(step.get("run", "") for step in plan["steps"])
    assert "dlinfra plan" in runs and all(
        "--no-upload" in line for line in runs.splitlines() if "dlinfra plan " in line
    )
    checkout = next(s for s in plan["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["persist-credentials"] is False
    commenting = [name for name, job in jobs.items() if job.get("permissions", {}).get("pull-requests")]
    assert commenting == ["comment"]
    assert not any(s.get("uses", "").startswith("actions/checkout@") for s in jobs["comment"]["steps"])


@pytest.mark.parametrize("workflow", ["ci.yml", "plan.yml"])
def test_every_action_is_pinned_by_commit_sha(workflow: str) -> None:
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / workflow).read_text())
    uses = [step["uses"] for job in doc["jobs"].values() for step in job["steps"] if "uses" in step]
    assert uses
    assert [u for u in uses if not re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u)] == []


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    block = readme[readme.index("```bash") + 1 : readme.index("```bash") + 3]
    assert block[0].endswith("dlinfra deploy --workers 3")
    ci = (ROOT / ".ci" / "run").read_text()
    assert block[1] in ci


def test_commented_example_equals_the_defaults() -> None:
    assert Spec.model_validate(yaml.safe_load(example_text())) == Spec()


def test_help_lists_every_command_with_a_one_line_help() -> None:
    out = subprocess.run([sys.executable, "-m", "dlinfra", "--help"], capture_output=True, text=True).stdout
    for command in (
        "init",
        "validate",
        "schema",
        "render",
        "deploy",
        "plan",
        "setup",
        "status",
        "logs",
        "runs",
        "show",
        "destroy",
        "node",
    ):
        line = next((ln for ln in out.splitlines() if ln.strip().startswith(command + " ")), "")
        assert len(line.split(None, 1)) == 2, f"{command} has no help line"


def test_help_imports_neither_tensorflow_nor_boto3_nor_the_spec_models() -> None:
    code = (
        "import sys, runpy; sys.argv=['dlinfra','--help']\n"
        "try: runpy.run_module('dlinfra', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print('tensorflow' in sys.modules, 'boto3' in sys.modules, 'dlinfra.spec.model' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    # the spec models (pydantic) are most of the rest of the start-up: loaded when a command runs
    assert out.strip().splitlines()[-1] == "False False False"


def test_schema_command_prints_json_schema() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dlinfra", "schema"], capture_output=True, text=True, check=True
    )
    schema = json.loads(out.stdout)
    assert schema["title"] == "dlinfra experiment"
    assert "cluster" in schema["properties"] and "additionalProperties" in json.dumps(schema)


def test_init_writes_an_example_that_validates(tmp_path: Path) -> None:
    target = tmp_path / "exp.yaml"
    run = [sys.executable, "-m", "dlinfra"]
    subprocess.run([*run, "init", str(target)], check=True, capture_output=True)
    again = subprocess.run([*run, "init", str(target)], capture_output=True, text=True)
    assert again.returncode == 2 and "already exists" in again.stderr
    ok = subprocess.run([*run, "validate", str(target)], capture_output=True, text=True)
    assert ok.returncode == 0 and "valid" in ok.stdout


def test_wheel_ships_the_terraform(tmp_path: Path) -> None:
    """`pip install dlinfra` users have no checkout: `dlinfra plan` must find its HCL in the package."""
    import zipfile

    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0 and "hatchling" in build.stderr:
        build = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
            capture_output=True,
            text=True,
        )
    assert build.returncode == 0, build.stderr[-2000:]
    names = zipfile.ZipFile(next(tmp_path.glob("dlinfra-*.whl"))).namelist()
    for required in (
        "dlinfra/infra/stack/main.tf",
        "dlinfra/infra/modules/instance_group/main.tf",
        "dlinfra/infra/bucket/main.tf",
        "dlinfra/render/templates/user-data.yaml.j2",
        "dlinfra/examples/experiment.yaml",
    ):
        assert required in names
    assert not any(".terraform/" in n or n.endswith(".tfstate") for n in names)


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "bench").glob("bench_*.py")))
def test_benchmark_script_imports(script: str) -> None:
    """Benchmarks run by hand, not in CI: at least their imports (the test helpers some of them share)
    must keep up with the code, or a bench breaks unseen."""
    code = (
        "import runpy, sys; sys.path[:0] = [sys.argv[2], sys.argv[3]]; "
        "runpy.run_path(sys.argv[1], run_name='bench_import_check')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "bench" / script), str(ROOT / "tests"), str(ROOT / "bench")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_every_capability_on_the_test_tiers_page_keeps_its_end_to_end_test_in_the_default_tier() -> None:
    """docs/tests.md (the manual's test tiers): each capability names its real end-to-end test; the
    default tier (`-m "not full"`) must still collect every one of them, or the list (or the tier) has
    gone wrong."""
    page = (ROOT / "docs" / "tests.md").read_text()
    section = page[page.index("**Every capability keeps a real end-to-end test") :]
    section = section[: section.index("\n\n", section.index("| capability |"))]
    named = sorted(set(re.findall(r"`(tests/[\w/]+\.py::\w+)`", section)))
    assert len(named) >= 15, named
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    collected = subprocess.run(
        [*collect, "-m", "not full", *named],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        # a -v in PYTEST_ADDOPTS would print the collection as a tree, with no ids to compare
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    missing = [name for name in named if not any(i == name or i.startswith(name + "[") for i in ids)]
    assert missing == [], collected.stdout[-2000:] + collected.stderr[-2000:]

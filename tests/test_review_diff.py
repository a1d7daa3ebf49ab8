"""`dlinfra plan --base REF`: the experiment at a git ref against head, on real git repositories.
Terraform's part (resource counts, the plan text) is given here as the plan's Review; the tests that
run terraform for it are in test_plan_review.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlinfra.spec.catalog import catalog
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.model import Spec
from dlinfra.targets.aws.review_diff import Base, ReviewDiff, load_base
from dlinfra.targets.base import Review
from support import git, review_repo, run_cli

PLANNED = Review("", "", needs_approval=True, counts=(27, 0, 0), details="  + resource x\n```\nfenced\n")


def _load(text: str, source: str) -> Spec:
    return load_spec(None, Overrides(target="aws"), text=text, source=source)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    review_repo(tmp_path / "repo")
    return tmp_path / "repo"


def _diff(repo: Path, name: str = "demo.yaml", ref: str = "main") -> ReviewDiff:
    path = repo / "experiments" / name
    return ReviewDiff(
        f"experiments/{name}", load_base(path, ref, _load), _load(path.read_text(), name), PLANNED
    )


def _usd(kind: str, count: int) -> float:
    price = catalog().get(kind).price("us-east-1")  # type: ignore[union-attr]
    return round(price * count, 2)


def test_review_names_the_added_instances_the_type_change_and_the_cost_delta(repo: Path) -> None:
    text = _diff(repo).markdown()
    before, after = _usd("c5.xlarge", 3), _usd("c5.2xlarge", 5)
    row = next(line for line in text.splitlines() if line.startswith("| worker |"))
    assert "| 3 → 5 (+2) |" in row and "`c5.xlarge` → `c5.2xlarge`" in row
    assert f"${before:.2f}/h → ${after:.2f}/h (+${after - before:.2f}/h)" in row
    assert "| **5 → 7 (+2)** |" in text
    assert "- `cluster.workers.count`: `3` → `5`" in text
    assert "- `cluster.workers.instance_type`: `c5.xlarge` → `c5.2xlarge`" in text
    assert "**27** to add, **0** to change, **0** to destroy" in text
    assert text.startswith(
        f"### `experiments/demo.yaml`: `main` (`{git(repo, 'rev-parse', 'main')[:7]}`) → head"
    )
    assert "Spec changes" in text and "training." not in text, "only the fields that changed"


def test_plan_text_is_collapsed_and_its_backticks_cannot_close_the_block(repo: Path) -> None:
    text = _diff(repo).markdown()
    details = text[text.index("<details>") : text.index("</details>")]
    assert "````\n  + resource x\n```\nfenced\n````" in details


def test_a_file_new_at_head_shows_as_all_new(repo: Path) -> None:
    (repo / "experiments" / "fresh.yaml").write_text("name: fresh\ntarget: aws\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "fresh")
    diff = _diff(repo, "fresh.yaml")
    text = diff.markdown()
    assert "new file (absent at `main`)" in text and "| worker | 2 (new) |" in text
    assert "Spec changes" not in text and diff.base.spec is None


def test_warnings_name_unknown_types_quota_sized_clusters_and_spot_without_checkpoints() -> None:
    spec = Spec.model_validate(
        {
            "target": "aws",
            "cluster": {"workers": {"count": 12, "instance_type": "c5.2xlarge", "spot": True}},
            "training": {"steps": 100, "checkpoint_every": 200},
        }
    )
    warnings = ReviewDiff("x.yaml", Base("main", "0" * 40, spec), spec, PLANNED).warnings()
    assert any("96 vCPUs of All Standard" in w and "Spot Instance Requests" in w for w in warnings)
    assert any(w.startswith("cluster.workers.spot:") and "checkpoint_every (200)" in w for w in warnings)
    odd = spec.model_copy(
        update={
            "cluster": spec.cluster.model_copy(
                update={"ps": spec.cluster.ps.model_copy(update={"instance_type": "x9.huge"})}
            )
        }
    )
    assert any(
        "x9.huge is not in dlinfra's instance catalog" in w
        for w in ReviewDiff("x", Base("main", "", spec), odd, PLANNED).warnings()
    )


def test_a_base_that_no_longer_resolves_is_reviewed_as_new_and_says_why(repo: Path) -> None:
    path = repo / "experiments" / "demo.yaml"
    git(repo, "checkout", "-q", "main")
    path.write_text(path.read_text() + "retired_field: 1\n")
    git(repo, "commit", "-q", "-am", "a field this dlinfra does not know")
    git(repo, "checkout", "-q", "pr")
    diff = _diff(repo)
    assert diff.base.spec is None and any("retired_field" in w for w in diff.warnings())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["experiments/demo.yaml", "--base", "no-such-branch"], "--base no-such-branch: no such branch"),
        (
            ["experiments/demo.yaml", "--base", "no-such-branch", "--emulated"],
            "--base no-such-branch: no such",
        ),
        (["--base", "main"], "--base: needs an experiment file"),
        (["experiments/demo.yaml", "--base", "--evil"], "--base '--evil': not a git ref"),
        (
            ["experiments/demo.yaml", "--emulated", "--endpoint-url", "http://127.0.0.1:1"],
            "--emulated starts",
        ),
    ],
)
def test_bad_review_input_exits_2_with_one_message_and_the_fix(
    repo: Path, args: list[str], needle: str
) -> None:
    home = repo.parent / "dlinfra-home"
    result = run_cli("plan", *args, cwd=repo, env=dict(os.environ, DLINFRA_HOME=str(home)), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert needle in line and "Fix:" in line and "Traceback" not in result.stderr
    assert not home.exists(), "nothing may be planned"

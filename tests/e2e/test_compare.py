"""`dlinfra compare` over three real runs: every column, JSON equal to the runs' metrics, markdown,
and a real PNG plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dlinfra.compare import COLUMNS
from support import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SHAPES = {
    "ps-1w": ("--workers", "1"),
    "ps-2w": ("--workers", "2"),
    "mwms-2w": ("--strategy", "multi_worker_mirrored", "--workers", "2"),
}


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str], Path]:
    tmp = tmp_path_factory.mktemp("compare")
    env = dict(os.environ, DLINFRA_HOME=str(tmp / "home"))
    ids = {}
    for label, args in SHAPES.items():
        result = run_cli("deploy", *args, "--steps", "300", env=env, cwd=tmp, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        ids[label] = max((tmp / "home" / "runs").iterdir(), key=lambda p: p.stat().st_mtime).name
    return ids, env, tmp


def test_table_shows_every_column_for_every_run(three_runs) -> None:
    ids, env, tmp = three_runs
    result = run_cli("compare", *ids.values(), env=dict(env, COLUMNS="400"), cwd=tmp)
    assert result.returncode == 0, result.stderr
    for column in COLUMNS:
        assert column in result.stdout
    for run_id in ids.values():
        assert run_id in result.stdout
    assert "1xchief local, 2xworker local, 1xps local" in result.stdout
    assert "±" in result.stdout and "cost: instance-hours" in result.stdout


def test_json_carries_the_runs_own_metrics(three_runs) -> None:
    ids, env, tmp = three_runs
    result = run_cli("compare", *ids.values(), "--json", env=env, cwd=tmp)
    assert result.returncode == 0, result.stderr
    rows = {r["run"]: r for r in json.loads(result.stdout)}
    for label, run_id in ids.items():
        metrics = json.loads((tmp / "home" / "runs" / run_id / "store" / "metrics.json").read_text())
        row = rows[run_id]
        assert row["examples_per_sec"] == metrics["examples_per_sec"]
        assert row["global_steps_per_sec"] == metrics["global_steps_per_sec"]
        assert (
            row["eval_accuracy"] == metrics["eval_accuracy"]
            and row["train_seconds"] == metrics["train_seconds"]
        )
        assert row["cost_usd"] == 0.0 and row["wall_seconds"] > row["train_seconds"] > 0
        assert row["strategy"] == (
            "multi_worker_mirrored" if label.startswith("mwms") else "parameter_server"
        )


def test_markdown_and_plot(three_runs, tmp_path: Path) -> None:
    ids, env, tmp = three_runs
    png = tmp_path / "throughput.png"
    result = run_cli("compare", *ids.values(), "--markdown", "--plot", str(png), env=env, cwd=tmp)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |" and lines[1].startswith("|---|")
    assert sum(line.startswith("| ") for line in lines) == 1 + len(ids)
    assert png.stat().st_size > 10_000
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 400 and image.shape[1] >= 700
    assert len({tuple(px) for px in image.reshape(-1, image.shape[-1])[::97]}) > 3, "more than a blank canvas"


def test_unknown_run_exits_2(three_runs) -> None:
    ids, env, tmp = three_runs
    result = run_cli("compare", ids["ps-1w"], "no-such-run", env=env, cwd=tmp)
    assert result.returncode == 2 and "no-such-run" in result.stderr and "Traceback" not in result.stderr

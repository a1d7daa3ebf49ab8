"""TensorFlow's three distribute guides as published (tests/data/guides/README.md names the one change
each: where they download data, or stand a cluster up inside one process), run on a local cluster as
a reader would run them. They save no model: the run ends DONE and says so, and where their
checkpoints are, if any; with `training.require_model` it ends FAILED, naming the owner and what it
found. The adapted copies in tests/data/scripts (flags, reports, checkpoints in
$DLINFRA_CHECKPOINT_DIR) are what the restart and progress tests drive."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from support import alive_node_pids, mnist_beside

from .conftest import Deployed
from .script_projects import LEGACY, TF_KERAS, deploy_project, failed_marker

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GUIDES = Path(__file__).resolve().parents[1] / "data" / "guides"

# guide → (strategy and cluster, extra requirements, its owner's last accuracy line, the least that
# shows it trained: chance is 0.1 of ten digits; 0.57 for the ps guide's labels, "no" the more common)
RUNS = {
    # plain SGD at 0.001 for 210 steps, as published: about 0.5 (Keras' progress bar, its epoch's end)
    "keras_fit": (
        "strategy: multi_worker_mirrored\n",
        "",
        r"Epoch 3/3\n(?:.*\n)*.*accuracy: (\d\.\d+)",
        0.25,
    ),
    "custom_loop": ("strategy: multi_worker_mirrored\n", "", r"Epoch: 2, accuracy: (\d\.\d+)", 0.8),
    # two parameter servers: the guide's cell 13 asserts its embedding is sharded over both
    "parameter_server": (
        "strategy: parameter_server\ncluster: {ps: {count: 2}}\n",
        ", portpicker",
        r"Finished epoch 3, accuracy is (\d\.\d+)",
        0.7,
    ),
}


def _run_guide(tmp_path: Path, guide: str, require_model: bool) -> tuple[Deployed, str, str]:
    """The guide's files beside an experiment that runs its main.py as published; the run, its owner
    (the node that judges the end) and the owner's log."""
    cluster, extra, _, _ = RUNS[guide]
    project = tmp_path / "project"
    shutil.copytree(GUIDES / guide, project, ignore=shutil.ignore_patterns("*.md"))
    if guide != "parameter_server":
        mnist_beside(project)
    (project / "experiment.yaml").write_text(
        f"name: guide-{guide.replace('_', '-')}\n{cluster}training:\n"
        + TF_KERAS.replace("]", f"{extra}]")
        + ("  require_model: true\n" if require_model else "")
        + f"  command: [{LEGACY}python, main.py]\n"
    )
    run = deploy_project(tmp_path, project, "--workers", "2")
    owner = "chief-0" if guide == "parameter_server" else "worker-0"
    return run, owner, (run.run_dir / "logs" / f"{owner}.log").read_text()


@pytest.mark.parametrize(
    ("guide", "require_model"),
    [
        ("keras_fit", False),
        ("custom_loop", True),
        ("parameter_server", False),
        pytest.param("keras_fit", True, marks=pytest.mark.full),
        pytest.param("custom_loop", False, marks=pytest.mark.full),
        pytest.param("parameter_server", True, marks=pytest.mark.full),
    ],
)
def test_a_published_guide_runs_unchanged_and_says_it_saved_no_model(
    tmp_path: Path, guide: str, require_model: bool
) -> None:
    run, owner, log = _run_guide(tmp_path, guide, require_model)
    _, _, last_accuracy, least = RUNS[guide]
    trained = re.search(last_accuracy, log.replace("\r", "\n").replace("\b", ""))
    assert trained is not None, log[-3000:]
    assert float(trained.group(1)) > least, "it trained on the stand-in data, to better than chance"
    metrics = run.metrics
    assert metrics["mode"] == "script" and metrics["models"] == []
    assert metrics["no_model"] == "found nothing, no SavedModel/.keras/.h5"
    assert metrics["checkpoint"] is None, "the guides keep no checkpoint past their process"
    assert metrics["steps"] is None, "they report no steps; none is made up"
    if require_model:
        failed = failed_marker(run)
        assert failed["verdict"] == "no model" and failed["node"] == owner, failed
        assert "exited 0 but saved no model TensorFlow can load" in str(failed["error"])
        assert "training.require_model is true" in str(failed["error"])
        assert "no checkpoint either" in str(failed["error"])
    else:
        assert run.result.returncode == 0, run.result.stdout + run.result.stderr
        assert json.loads((run.store / "DONE").read_text())["reason"] == "no model saved"
        saved = "no model saved (found nothing, no SavedModel/.keras/.h5); no checkpoint either"
        assert saved in run.result.stdout, run.result.stdout[-3000:]
        assert alive_node_pids(run.run_id) == []
    if guide == "parameter_server":
        assert re.search(r"Final loss is \d", log) and len(re.findall(r"Evaluation accuracy: \d", log)) == 2

"""What a finished script run says of its model (issue 56, build 2): the model it left, by kind and
path, or plainly "no model saved" with what the directory held and where the checkpoints are, in the
result and in `runs`. Rendered by the CLI's own views, from the records a node writes."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

from rich.console import Console

from dlinfra.cli.tables import runs_table
from dlinfra.cli.views import result_view
from dlinfra.runs.records import Metrics
from dlinfra.runs.run import Run
from dlinfra.spec.model import Spec
from dlinfra.watching import Outcome

STORE = "file:///runs/guide-mwms"


def _script_metrics(**fields: object) -> Metrics:
    base: dict[str, object] = dict(
        mode="script",
        command=["python", "train.py"],
        strategy="multi_worker_mirrored",
        workers=2,
        ps=0,
        train_seconds=20.0,
        finished_at=time.time(),
        model_uri=f"{STORE}/model",
    )
    return Metrics.model_validate(base | fields)


def _printed(home: Path, metrics: Metrics) -> str:
    outcome = Outcome(Run.create(Spec()), "DONE", metrics, wall_seconds=30.0)
    printed = io.StringIO()
    Console(width=200, file=printed, soft_wrap=True).print(result_view(outcome))
    return printed.getvalue()


def test_a_script_that_saved_no_model_says_so_with_its_checkpoints(home: Path) -> None:
    m = _script_metrics(
        no_model="found NOTES.txt (31 bytes), no SavedModel/.keras/.h5",
        checkpoint=f"{STORE}/checkpoints/files",
        latest_checkpoint="ckpt-6",
    )
    output = _printed(home, m)
    assert (
        "model: none: no model saved (found NOTES.txt (31 bytes), no SavedModel/.keras/.h5); its "
        f"checkpoints at {STORE}/checkpoints/files, the latest ckpt-6; what its model directory held at "
        f"{STORE}/model"
    ) in output, output
    assert re.search(r"\| model +\| +no model saved \|", output), "the table's own row says it too"


def test_a_script_that_saved_nothing_and_kept_no_checkpoint_says_both(home: Path) -> None:
    output = _printed(home, _script_metrics(no_model="found nothing, no SavedModel/.keras/.h5"))
    assert "no checkpoint either (nothing in $DLINFRA_CHECKPOINT_DIR)" in output
    assert "what its model directory held" not in output, "it held nothing: no URI to look in"


def test_a_script_that_saved_a_model_names_it(home: Path) -> None:
    output = _printed(home, _script_metrics(models=["SavedModel export/1700000000"]))
    assert f"model: {STORE}/model" in output
    assert re.search(r"\| model +\| +SavedModel export/1700000000 \|", output), output
    assert "no model" not in output


def test_runs_shows_a_done_run_without_a_model(home: Path) -> None:
    row = {
        "run_id": "guide-mwms-20261202-0400-ab12",
        "status": "DONE",
        "note": "no model",
        "age": "3m",
        "target": "local",
        "strategy": "multi_worker_mirrored",
        "eval_accuracy": None,
        "resources_up": False,
        "usd_per_hour": None,
    }
    printed = io.StringIO()
    Console(width=120, file=printed, soft_wrap=True).print(runs_table([row], 120))
    assert "DONE · no model" in printed.getvalue()

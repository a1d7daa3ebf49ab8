"""What the spec's files and records hold, read in process (issue 55, classes 5, 8 and 9): a good
requirements file and sizing history still read as before, and the resolver's long explanation is
cut between its sentences. The refusals themselves are CLI cases in tests/hostile/spec_inputs.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlinfra.environment.lock import Index, Platform, resolve
from dlinfra.errors import SpecError, StoreError
from dlinfra.runs.layout import RunStore
from dlinfra.runs.layout.sizing import SizingHistory
from dlinfra.runs.store_url import open_store
from dlinfra.spec.loading import load_spec
from package_index import PackageIndex


def test_a_requirements_file_reads_as_its_requirements(tmp_path: Path) -> None:
    (tmp_path / "req.txt").write_text("# the program's own\npandas>=2.2  # frames\n\nmytokenizer==1.4\n")
    spec = tmp_path / "experiment.yaml"
    spec.write_text("name: reqs\ntraining:\n  requirements: req.txt\n")
    assert load_spec(spec).training.requirements == ["pandas>=2.2", "mytokenizer==1.4"]


def test_a_bad_requirement_in_the_spec_is_quoted_and_one_in_a_file_is_not(tmp_path: Path) -> None:
    """The spec's own list is the user's text, shown back; a file's line may be anything, and is not."""
    spec = tmp_path / "experiment.yaml"
    spec.write_text("name: reqs\ntraining:\n  requirements: ['not a req!']\n")
    with pytest.raises(SpecError, match=r"\[0\] 'not a req!' is not a requirement"):
        load_spec(spec)
    (tmp_path / "req.txt").write_text("numpy\nnot a req!\n")
    spec.write_text("name: reqs\ntraining:\n  requirements: req.txt\n")
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    assert "req.txt:2: the line is not a requirement" in str(refused.value)
    assert "not a req!" not in str(refused.value)


@pytest.mark.parametrize(("written", "read"), [("3.12", "3.12"), ("'3.10'", "3.10")])
def test_an_aws_python_yaml_cannot_misread_is_taken(tmp_path: Path, written: str, read: str) -> None:
    spec = tmp_path / "experiment.yaml"
    spec.write_text(f"name: py\naws:\n  python: {written}\n")
    assert load_spec(spec).aws.python == read


def test_a_sizing_history_dlinfra_wrote_reads_back_as_written(tmp_path: Path) -> None:
    """Its records are checked for shape on every read: what dlinfra itself writes must pass,
    keys it left out stay out (the advisor tells a profile without gradient_elements by that)."""
    history = SizingHistory.under(f"file://{tmp_path}", None, None)
    profile = {"time": "2026-01-01T00:00:00Z", "parameters": 10, "trainable": 8, "step_seconds": 0.01}
    history.put_profile("m", "d", profile)
    assert history.profile("m", "d") == profile
    run = {"run_id": "r-1", "workers": 2, "ps": 1, "examples_per_s": 100.0, "bound": "compute"}
    history.add_run("m", run)
    history.add_run("m", {**run, "run_id": "r-2", "predicted_examples_per_s": None})
    assert [r["run_id"] for r in history.runs("m")] == ["r-1", "r-2"]
    assert history.runs("m")[0] == run
    (tmp_path / "sizing" / "profiles" / "m" / "e.json").write_text("{}")
    assert not history.profile("m", "e"), "an emptied record reads as none, as it always did"


def test_the_resolvers_explanation_is_cut_between_its_sentences(tmp_path: Path) -> None:
    """A real resolution on a local index: a chain of 40 packages whose last needs a version that
    does not exist, which uv explains in one sentence per two links (about 5 KB)."""
    with PackageIndex(tmp_path / "index") as index:
        index.publish("dlinfra", "0.0.1", {})  # a stand-in for the release: only the chain matters
        for i in range(40):
            index.publish(f"layer{i}", "1.0", {}, requires=[f"layer{i + 1}==1.0" if i < 39 else "base==9.0"])
            index.publish(f"layer{i}", "2.0", {}, requires=[f"gone{i}"])
        with pytest.raises(SpecError) as refused:
            resolve("==0.0.1", ["layer0"], "cpu", Platform.here(), Index(index.url))
    message = str(refused.value)
    why = message.split("): ", 1)[1].rsplit(". Fix: ", 1)[0]
    assert len(message) < 2000
    sentences = re.sub(r" \(and \d+ more of the resolver's sentences\)$", "", why).split("; ")
    assert why.endswith("more of the resolver's sentences)"), why
    for sentence in sentences[1:]:
        assert re.fullmatch(r"(cause: )?(And b|B)ecause .+, we can conclude that .+", sentence), sentence


@pytest.mark.parametrize(
    "content", ["[1, 2]", '{"model": "m"}', '{"model": "m", "device": "d", "strategy": 3}']
)
def test_a_runs_prediction_of_the_wrong_shape_is_a_store_error(tmp_path: Path, content: str) -> None:
    """A run's sizing.json, read by `compare` and by the watcher when the run ends: an error the
    watcher reports as a warning and the CLI as exit 2, never an internal one."""
    store = RunStore(open_store(f"file://{tmp_path}"))
    (tmp_path / "sizing.json").write_text(content)
    with pytest.raises(StoreError, match=r"sizing.json: .*Fix: delete it"):
        store.sizing()

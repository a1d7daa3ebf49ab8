"""The sizing advisor: model bytes counted from the spec as Keras counts them, the throughput model's
bounds, the knee warning and the cheaper shape, and `advise`, `validate` and `profile` as a user
runs them (no TensorFlow where the advice is only arithmetic)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import MeanSd, Metrics
from dlinfra.runs.store_url import open_store
from dlinfra.sizing.advisor import model_key, sizing_advice
from dlinfra.sizing.model_size import size_of
from dlinfra.sizing.predict import ALLREDUCE_EFFICIENCY, PS_TIER_EFFICIENCY, Links, Workload, predict
from dlinfra.sizing.record import predict_run, record_run
from dlinfra.spec.layers import LayerSpec, ModelSpec
from dlinfra.spec.model import Spec
from support import run_cli

MB = 1_000_000
# A model whose variables dominate its compute: 2 x 4096 hidden units on 784 inputs (20 M parameters)
BIG_MLP = {"training": {"model": {"name": "mlp", "hidden_units": [4096, 4096]}}}


def _aws(workers: int, ps: int, **more: object) -> Spec:
    return Spec.model_validate(
        {
            "target": "aws",
            "cluster": {"workers": {"count": workers}, "ps": {"count": ps}},
            **BIG_MLP,
            **more,
        }
    )


@pytest.mark.parametrize(
    ("model", "shape", "classes"),
    [
        (ModelSpec(), (8, 8, 1), 10),
        (ModelSpec(name="resnet20"), (32, 32, 3), 10),
        (ModelSpec(name="mlp", hidden_units=[300, 100]), (28, 28, 1), 10),
        (
            ModelSpec(
                name="layers",
                layers=[
                    LayerSpec(type="conv2d", filters=8, kernel_size=5, strides=2, padding="valid"),
                    LayerSpec(type="batch_norm"),
                    LayerSpec(type="max_pool2d", pool_size=3),
                    LayerSpec(type="dense", units=7),
                    LayerSpec(type="reshape", target_shape=[25, 7]),
                    LayerSpec(type="dense", units=3),
                    LayerSpec(type="dropout", rate=0.1),
                ],
            ),
            (33, 31, 2),
            5,
        ),
        (
            ModelSpec(
                name="layers",
                layers=[LayerSpec(type="conv2d", filters=4), LayerSpec(type="global_avg_pool2d")],
            ),
            (9, 9, 3),
            4,
        ),
    ],
    ids=["cnn", "resnet20", "mlp", "layers", "global-pool"],
)
def test_the_spec_counts_every_weight_keras_builds(
    model: ModelSpec, shape: tuple[int, ...], classes: int
) -> None:
    import numpy as np

    from dlinfra.training.models import build

    built = build(model, shape, classes)
    counted = size_of(model, shape, classes)
    assert counted.parameters == built.count_params()
    assert counted.trainable == sum(int(np.prod(w.shape)) for w in built.trainable_weights)


def test_a_layers_model_that_cannot_be_built_gets_no_advice_and_says_why() -> None:
    spec = Spec.model_validate(
        {
            "training": {
                "model": {
                    "name": "layers",
                    "layers": [{"type": "conv2d", "filters": 4, "kernel_size": 9, "padding": "valid"}],
                }
            }
        }
    )
    assert "cannot be built" in str(sizing_advice(spec, None))


def test_one_ps_is_flat_in_workers_and_a_second_ps_doubles_the_ceiling() -> None:
    work = Workload("parameter_server", 8 * MB, 8 * MB, 32, 0.001, shared_machine=False)
    links = Links(125 * MB, 125 * MB, None)  # 1 Gb/s everywhere
    alone = 1 / (0.001 + 16 / 125)  # one worker: pull then push 8 MB at 125 MB/s, 1 ms of compute
    ceiling = PS_TIER_EFFICIENCY * 125 / 8  # the ps tier, full duplex, at the share many workers reach
    one = [predict(work, links, w, 1) for w in (1, 2, 3, 4, 8)]
    assert one[0].bound == "worker NIC" and 0.9 * alone < one[0].steps_per_s < alone
    assert {p.bound for p in one[1:]} == {"ps NIC"}
    rates = [p.steps_per_s for p in one]
    assert rates == sorted(rates) and rates[-1] < ceiling and rates[-1] > 0.98 * ceiling  # flat past the knee
    many = [predict(work, links, 64, ps).steps_per_s for ps in (1, 2)]
    assert many[1] == pytest.approx(2 * many[0], rel=0.02)


def test_the_blend_of_the_two_bounds_meets_the_notes_independent_runs() -> None:
    """../shared notes: 1 ps at 1 Gb/s, an 8 MB model: 7.8, 8.8, 11.7 steps/s at 1, 2, 4 workers."""
    work = Workload("parameter_server", 8 * MB, 8 * MB, 1, 0.0, shared_machine=False)
    links = Links(125 * MB, 125 * MB, None)
    for workers, measured in ((1, 7.8), (2, 8.8), (4, 11.7)):
        predicted = predict(work, links, workers, 1).steps_per_s
        assert abs(measured / predicted - 1) <= 0.2, (workers, predicted)


def test_variables_placed_whole_in_turn_load_the_ps_with_the_big_kernel() -> None:
    """TensorFlow places each variable whole on the next ps: an MLP's middle kernel (98% of its
    bytes) loads one ps however many there are; split evenly, a second ps doubles the ceiling."""
    size = size_of(ModelSpec(name="mlp", hidden_units=[4096, 4096]), (8, 8, 1), 10)
    assert size.variables == (64 * 4096, 4096, 4096 * 4096, 4096, 4096 * 10, 10)
    placed = Workload(
        "parameter_server", size.parameter_bytes, size.gradient_bytes, 32, 0.001, False, size.variables
    )
    assert placed.busiest_share(2) == pytest.approx((64 * 4096 + 4096 * 4096 + 40960) / size.parameters)
    links = Links(125 * MB, 125 * MB, None)
    one, two = (predict(placed, links, 8, ps) for ps in (1, 2))
    assert two.steps_per_s == pytest.approx(one.steps_per_s, rel=0.01) and two.bound == "ps NIC"
    split = Workload("parameter_server", size.parameter_bytes, size.gradient_bytes, 32, 0.001, False)
    evenly = [predict(split, links, 64, ps).steps_per_s for ps in (1, 2)]
    assert evenly[1] == pytest.approx(2 * evenly[0], rel=0.02)
    advice = sizing_advice(_aws(8, 2), None)
    assert not isinstance(advice, str) and any(
        "busiest of 2 ps would hold 100%" in a for a in advice.assumptions
    )


def test_a_flow_cap_below_the_nic_binds_one_worker_reading_one_ps() -> None:
    work = Workload("parameter_server", 100 * MB, 100 * MB, 32, None, shared_machine=False)
    capped = predict(work, Links(2500 * MB, 2500 * MB, 625 * MB), 1, 1)  # 20 Gb/s NICs, 5 Gb/s a flow
    assert capped.steps_per_s == pytest.approx(625 / 200, rel=0.01) and capped.bound == "TCP flow"
    spread = predict(work, Links(2500 * MB, 2500 * MB, 625 * MB), 1, 4)  # four flows, one to each ps
    assert spread.steps_per_s == pytest.approx(2500 / 200, rel=0.01)


def test_a_ring_all_reduce_moves_two_n_minus_one_over_n_gradients_per_worker() -> None:
    work = Workload("multi_worker_mirrored", 40 * MB, 40 * MB, 64, 0.05, shared_machine=False)
    links = Links(125 * MB, 125 * MB, None)
    alone = predict(work, links, 1, 0)
    assert alone.steps_per_s == pytest.approx(20) and alone.bound == "compute"
    four = predict(work, links, 4, 0)
    assert 1 / four.steps_per_s == pytest.approx(0.05 + 1.5 * 40 / (ALLREDUCE_EFFICIENCY * 125))
    assert four.bound == "all-reduce" and four.examples_per_s == pytest.approx(4 * 64 * four.steps_per_s)


def test_a_spec_past_the_knee_is_warned_with_its_bound_and_a_cheaper_shape() -> None:
    advice = sizing_advice(_aws(8, 1), None)
    assert not isinstance(advice, str)
    assert advice.past_knee and "ps NIC" in advice.past_knee and "worker 8 adds 0%" in advice.past_knee
    better = advice.better
    assert better is not None and (better.workers, better.ps) == (3, 1) and better.usd_per_hour is not None
    assert better.examples_per_s >= 0.9 * advice.best.examples_per_s
    assert advice.spec.usd_per_hour is not None and len(advice.curve) == 16 * 4


def test_a_spec_before_the_knee_gets_no_warning() -> None:
    advice = sizing_advice(_aws(2, 2), None)
    assert not isinstance(advice, str)
    assert advice.past_knee is None and advice.better is None


def test_a_local_cluster_on_one_machine_is_never_warned_but_a_shaped_one_is() -> None:
    shared = sizing_advice(Spec.model_validate({"cluster": {"workers": {"count": 8}}, **BIG_MLP}), None)
    assert not isinstance(shared, str) and shared.past_knee is None
    assert any("share this machine" in line for line in shared.assumptions)
    shaped = Spec.model_validate(
        {"cluster": {"workers": {"count": 8}, "local_network": "shaped", "local_link_scale": 0.01}, **BIG_MLP}
    )
    advice = sizing_advice(shaped, None)
    assert not isinstance(advice, str) and advice.past_knee and advice.spec.usd_per_hour is None
    assert any("x 0.01" in line for line in advice.assumptions)


def test_a_program_without_a_profile_gets_no_figures_but_the_fix() -> None:
    spec = Spec.model_validate({"training": {"entrypoint": "train.py:build"}})
    assert "dlinfra profile" in str(sizing_advice(spec, None))
    script = Spec.model_validate({"training": {"command": ["python", "train.py"]}})
    assert "script" in str(sizing_advice(script, None))


def test_a_run_records_its_throughput_beside_its_prediction(tmp_path: Path) -> None:
    spec = _aws(3, 1).model_copy(update={"target": "local"})
    store = RunStore(open_store(f"file://{tmp_path / 'store'}"))
    predict_run(spec, store, tmp_path / "home")
    predicted = store.sizing()
    assert predicted and predicted["workers"] == 3 and predicted["predicted_examples_per_s"] > 0
    record_run(spec, store, "run-1", tmp_path / "home")  # no DONE yet: nothing to compare
    assert not (tmp_path / "home" / "sizing" / "runs").exists()
    store.put_metrics(_metrics(examples=0.8 * predicted["predicted_examples_per_s"]))
    store.write_marker("DONE")
    record_run(spec, store, "run-1", tmp_path / "home")
    env = {**os.environ, "DLINFRA_HOME": str(tmp_path / "home")}
    overrides = [
        "--set",
        "training.model.hidden_units=[4096, 4096]",
        "--set",
        "training.model.name=mlp",
        "--workers",
        "3",
    ]
    shown = run_cli("advise", "--history", *overrides, env=env, check=True)
    assert "run-1" in shown.stdout and "-20%" in shown.stdout, shown.stdout
    assert model_key(spec) in (tmp_path / "home" / "sizing" / "runs" / f"{model_key(spec)}.json").read_text()


def _metrics(examples: float) -> Metrics:
    return Metrics(
        strategy="parameter_server",
        workers=3,
        ps=1,
        train_seconds=10,
        finished_at=0,
        model_uri="file:///m",
        examples_per_sec=MeanSd(mean=examples, sd=0),
    )


def test_advise_imports_no_tensorflow_and_prints_the_curve(tmp_path: Path) -> None:
    code = (
        "import sys; sys.argv = ['dlinfra', 'advise', '--set', 'target=aws', '--workers', '8'];"
        "from dlinfra.cli.app import app\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'TensorFlow was imported'"
    )
    env = {**os.environ, "DLINFRA_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "sizing: 8 workers, 1 ps" in result.stdout and "* " in result.stdout and "     16  " in result.stdout
    )


def test_validate_shows_the_prediction_and_plan_style_warning_for_a_shaped_spec(tmp_path: Path) -> None:
    env = {**os.environ, "DLINFRA_HOME": str(tmp_path)}
    sets = ["--set", "cluster.local_network=shaped", "--set", "cluster.local_link_scale=0.01"]
    mlp = ["--set", "training.model.name=mlp", "--set", "training.model.hidden_units=[4096, 4096]"]
    past = run_cli("validate", "--workers", "6", *sets, *mlp, env=env, check=True)
    assert "warning: past the knee: worker 6 adds" in past.stdout and "cheapest within 10%" in past.stdout
    before = run_cli("validate", "--workers", "1", *sets, *mlp, env=env, check=True)
    assert "sizing: 1 worker, 1 ps" in before.stdout and "warning: past the knee" not in before.stdout


def test_profile_measures_a_step_here_and_advise_uses_it(tmp_path: Path) -> None:
    env = {**os.environ, "DLINFRA_HOME": str(tmp_path)}
    measured = run_cli("profile", "--seconds", "1", env=env, check=True, timeout=300)
    assert "ms a step" in measured.stdout
    [record] = (tmp_path / "sizing" / "profiles").rglob("*.json")
    figures = json.loads(record.read_text())
    assert figures["parameters"] == 151306 and 0 < figures["step_seconds"] < 5
    advised = run_cli("advise", env=env, check=True)
    assert "compute: measured by `dlinfra profile`" in advised.stdout


EMBEDDING_PROGRAM = """
import keras
import numpy as np
import tensorflow as tf

from dlinfra.training.program import Program


def program(training):
    def examples(shard):
        ids = np.arange(64 * 4).reshape(64, 4) % 50_000
        return tf.data.Dataset.from_tensor_slices((ids, np.arange(64) % 2))

    def model():
        ids = keras.Input(shape=(4,), dtype="int32")
        x = keras.layers.Flatten()(keras.layers.Embedding(50_000, 16)(ids))
        return keras.Model(ids, keras.layers.Dense(2)(x))

    return Program(build_model=model, train_data=examples, eval_data=lambda: examples(None))
"""


def test_profile_counts_an_embeddings_gradient_as_the_rows_a_step_looked_up(tmp_path: Path) -> None:
    """800,000 embedding weights, of which a batch of 8 x 4 ids moves 32 rows of 16."""
    (tmp_path / "embedding_program.py").write_text(EMBEDDING_PROGRAM)
    (tmp_path / "experiment.yaml").write_text(
        "name: sparse\ntraining: {entrypoint: embedding_program.py:program, batch_size: 8}\n"
    )
    env = {**os.environ, "DLINFRA_HOME": str(tmp_path / "home")}
    before = run_cli("advise", "experiment.yaml", env=env, cwd=tmp_path)
    assert before.returncode == 2 and "dlinfra profile" in before.stderr, before.stdout + before.stderr
    run_cli("profile", "experiment.yaml", "--seconds", "1", env=env, cwd=tmp_path, check=True, timeout=300)
    [record] = (tmp_path / "home" / "sizing" / "profiles").rglob("*.json")
    figures = json.loads(record.read_text())
    dense = 4 * 16 * 2 + 2
    assert figures["trainable"] == 50_000 * 16 + dense and figures["gradient_elements"] == 32 * 16 + dense
    advised = run_cli("advise", "experiment.yaml", env=env, cwd=tmp_path, check=True)
    assert f"{(32 * 16 + dense) * 4 / 1e6:.3g} MB of gradient a step" in advised.stdout, advised.stdout


def _mirrored_run(tmp_path: Path, run_id: str, workers: int, compute: tuple[float, ...]) -> Spec:
    """A finished local mirrored run whose workers timed `compute` seconds in their steps."""
    from dlinfra.runs.records import NodeState

    spec = Spec.model_validate(
        {"strategy": "multi_worker_mirrored", "cluster": {"workers": {"count": workers}}}
    )
    store = RunStore(open_store(f"file://{tmp_path / run_id}"))
    predict_run(spec, store, tmp_path / "home")
    for i, seconds in enumerate(compute):
        store.put_status(
            NodeState(node=f"worker-{i}", role="worker", index=i, state="DONE", compute_seconds=seconds,
                      started=0, first_started=0, heartbeat=0)
        )  # fmt: skip
    store.put_metrics(_metrics(examples=1000.0))
    store.write_marker("DONE")
    record_run(spec, store, run_id, tmp_path / "home")
    return spec


def test_a_mirrored_run_leaves_its_workers_step_time_for_the_next_plan_of_its_model(tmp_path: Path) -> None:
    """On one machine, only a lone worker's figure is what this machine does for one; two workers
    timed their passes beside each other's, which no plan of this machine assumes."""
    from dlinfra.sizing.advisor import history_of

    spec = _mirrored_run(tmp_path, "mirrored-2", workers=2, compute=(0.030, 0.034))
    assert "estimated" in str(sizing_advice(spec, history_of(spec, tmp_path / "home")).assumptions)  # type: ignore[union-attr]
    spec = _mirrored_run(tmp_path, "mirrored-1", workers=1, compute=(0.030,))
    advice = sizing_advice(spec, history_of(spec, tmp_path / "home"))
    assert not isinstance(advice, str)
    assert "compute: measured by run mirrored-1" in advice.assumptions[1], advice.assumptions
    assert advice.size is not None and advice.size.parameters == 151306


def test_validate_reads_no_results_bucket_for_its_sizing_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate reaches no network: an s3:// store's profiles are for advise and plan; a file:// one
    (a local run's DLINFRA_HOME) is read by all three."""
    from dlinfra.cli.advise import readable_history

    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path))
    bucket = Spec.model_validate({"target": "aws", "storage": {"url": "s3://no-such-bucket-here/runs"}})
    assert readable_history(bucket, remote=False) is None
    local = readable_history(Spec(), remote=False)
    assert local is not None and local.uri.startswith("file://")

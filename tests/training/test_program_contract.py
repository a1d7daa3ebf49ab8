"""The widened Program contract on ordinary Keras programs (tests/data/contract_programs.py): what
each is trained for and measured by, and the programs refused on their first batch before any
cluster trains. Training runs the real loop (one mirrored worker, in a fresh process each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from dlinfra.spec.training import TrainingSpec
from dlinfra.training import export, fit_check, objective
from dlinfra.training.objective import ProgramError, hint, resolve
from dlinfra.training.program import Program, load_entrypoint

DATA = Path(__file__).parents[1] / "data"


def _program(name: str) -> Program:
    return load_entrypoint(f"{DATA / 'contract_programs.py'}:{name}", TrainingSpec())


def _trained(name: str, steps: int, tmp: Path, strategy: str = "multi_worker_mirrored") -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(DATA / "program_run.py"), name, str(steps), strategy],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("regression_without_a_loss", ["labels are float32", "Program.loss", '"mse"']),
        ("labels_shaped_n_by_1", ["shaped (batch, 1)", "tf.squeeze(y, -1)", "Program.loss"]),
        ("float_labels", ["labels are float32", "Program.loss"]),
        ("label_out_of_range", ["label of the first batch is 9", "5 classes", "Program.loss"]),
        ("custom_train_step", ["_OwnStep", "overrides train_step", "Program.loss", "training.command"]),
        ("regression_broadcasting", ["1024 values for 32 outputs", "broadcast"]),
    ],
)
def test_a_program_whose_outputs_cannot_fit_its_loss_is_refused_naming_the_field(
    name: str, words: list[str]
) -> None:
    with pytest.raises(ProgramError) as refused:
        fit_check.first_batch(_program(name), batch_size=32)
    for word in words:
        assert word in str(refused.value), str(refused.value)


def test_a_one_unit_model_on_integer_labels_is_refused_as_a_classifier_of_one_class() -> None:
    x = np.zeros((8, 4), "float32")
    program = Program(
        build_model=lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices((x, np.zeros(8, "int64"))),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x, np.zeros(8, "int64"))),
    )
    with pytest.raises(ProgramError, match=r"one output unit.*BinaryCrossentropy"):
        fit_check.first_batch(program, batch_size=8)


def test_train_data_without_labels_is_refused() -> None:
    x = np.zeros((8, 4), "float32")
    program = Program(
        build_model=lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices({"x": x}),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices({"x": x}),
    )
    with pytest.raises(ProgramError, match=r"dicts \(x\), not \(features, label\) pairs"):
        fit_check.first_batch(program, batch_size=8)


def test_unknown_loss_and_metric_names_are_refused_naming_the_field() -> None:
    base = _program("regression")
    with pytest.raises(ProgramError, match=r"Program\.loss"):
        fit_check.first_batch(Program(base.build_model, base.train_data, base.eval_data, loss="msee"), 32)
    with pytest.raises(ProgramError, match=r"Program\.metrics"):
        fit_check.first_batch(
            Program(base.build_model, base.train_data, base.eval_data, loss="mse", metrics=["maee"]), 32
        )


def test_accuracy_means_what_the_outputs_say_as_in_compile() -> None:
    goal = resolve(_program("regression"), keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
    assert goal.loss_name == "mse" and not goal.default_loss
    binary, categorical, sparse = (
        goal.metrics(labels, outputs)
        for labels, outputs in [
            (tf.zeros((4,)), tf.zeros((4, 1))),
            (tf.zeros((4, 3)), tf.zeros((4, 3))),
            (tf.zeros((4,), tf.int64), tf.zeros((4, 3))),
        ]
    )
    assert [m.name for m in binary] == ["mae"], "the program's name for it, not Keras' long one"
    accuracy = resolve(Program(lambda: None, lambda s: None, lambda: None, metrics=["accuracy"]), None)
    kinds = [
        type(accuracy.metrics(labels, outputs)[0]).__name__
        for labels, outputs in [
            (tf.zeros((4,)), tf.zeros((4, 1))),
            (tf.zeros((4, 3)), tf.zeros((4, 3))),
            (tf.zeros((4,), tf.int64), tf.zeros((4, 3))),
        ]
    ]
    assert kinds == ["BinaryAccuracy", "CategoricalAccuracy", "SparseCategoricalAccuracy"]
    assert categorical and sparse


def test_a_loss_that_returns_its_batch_mean_is_shared_out_over_replicas() -> None:
    program = Program(lambda: None, lambda s: None, lambda: None, loss=lambda y, out: tf.reduce_mean(out))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    goal = resolve(program, model)
    outputs = tf.constant([[2.0], [4.0]])
    assert float(goal.replica_loss(model, tf.zeros((2,)), outputs, global_batch=8, replicas=4)) == 0.75
    per_example = resolve(Program(lambda: None, lambda s: None, lambda: None, loss="mae"), model)
    # (|0-2| + |0-4|) / global batch 8: each replica's share of the mean over every replica's examples
    assert float(per_example.replica_loss(model, tf.zeros((2,)), outputs, global_batch=8, replicas=4)) == 0.75


def test_tensorflows_words_for_a_table_made_in_build_get_the_fix() -> None:
    assert "Program.setup" in hint("Client for target /job:localhost/replica:0/task:0 not found")
    assert "Program.setup" in hint(
        "InvalidArgumentError: /job:localhost/replica:0/task:0/device:CPU:0 unknown device. [Op:MapDataset]"
    )
    assert hint("Received a label value of 3") == ""


@pytest.mark.slow
def test_a_regression_trains_on_its_own_loss_and_reports_its_metric(tmp_path: Path) -> None:
    result = _trained("regression", 600, tmp_path)
    assert set(result["results"]) == {"loss", "mae"}, "no accuracy is made up for a regression"
    labels = np.array(result["labels"])
    _, y_train, _, _ = _diabetes_split()
    guessing_the_mean = float(np.abs(labels - y_train.mean()).mean())
    assert result["results"]["mae"] < 0.85 * guessing_the_mean
    assert result["loss"] == "mse" and result["optimizer"] == "Adam (Program.optimizer)"
    assert result["learning_rate"] is None, "a schedule has no one learning rate"
    assert result["served_matches_keras"]
    predictions = np.array(result["predictions"])
    assert 25 <= predictions.mean() <= 346, "predictions on the labels' scale"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_a_loss_of_the_programs_own_with_python_control_flow_on_tensors_trains(
    strategy: str, tmp_path: Path
) -> None:
    """The loops' tf.functions are converted by AutoGraph only for a loss like this one
    (training.tracing): its `if` on a tensor cannot be traced otherwise."""
    result = _trained("regression_loss_with_a_branch", 300, tmp_path, strategy)
    assert "refused" not in result, result
    assert result["losses"][-1] < result["losses"][0]
    _, y_train, _, _ = _diabetes_split()
    guessing_the_mean = float(np.abs(np.array(result["labels"]) - y_train.mean()).mean())
    assert result["results"]["mae"] < guessing_the_mean


def _diabetes_split() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_diabetes

    y = load_diabetes().target
    return None, y[:380], None, y[380:]  # type: ignore[return-value]


@pytest.mark.slow
def test_compile_settings_are_used_where_the_program_gives_none(tmp_path: Path) -> None:
    result = _trained("regression_compiled", 300, tmp_path)
    assert result["loss"] == "mae" and result["optimizer"] == "SGD (the model's compile())"
    assert set(result["results"]) == {"loss", "mse"}
    assert result["learning_rate"] == pytest.approx(0.01)
    assert result["lr_scaling"] == "none (the model's compile())"
    assert result["losses"][-1] < result["losses"][0]


@pytest.mark.slow
def test_the_models_own_losses_join_the_loss(tmp_path: Path) -> None:
    """Plain Keras fit with this penalty ends near chance (0.09 measured); dlinfra must too."""
    result = _trained("heavy_penalty", 300, tmp_path)
    assert result["losses"][0] > 10, "the penalty is in the loss the loop reports"
    assert result["kernel_norm"] < 1e-2, "and in the gradients: the penalty drove the weights to zero"
    assert result["results"]["accuracy"] < 0.3


@pytest.mark.slow
def test_dict_features_train_and_export_with_metrics_under_their_keras_names(tmp_path: Path) -> None:
    result = _trained("dict_features", 400, tmp_path)
    assert result["results"]["sparse_categorical_accuracy"] > 0.85
    assert (
        result["results"]["sparse_top_k_categorical_accuracy"]
        >= result["results"]["sparse_categorical_accuracy"]
    )
    assert result["served_matches_keras"], "the SavedModel takes the named inputs"
    _own_compute_timed_in_every_report(result)


def _own_compute_timed_in_every_report(result: dict[str, Any]) -> None:
    """A mirrored worker's own forward and backward pass, timed inside its steps (what names a
    straggler): some of each step's time, never more than all of it."""
    reports = result["reports"]
    assert reports and all(0 < r["compute_seconds"] <= r["step_seconds"] for r in reports), reports


@pytest.mark.slow
def test_a_lookup_table_made_in_setup_feeds_the_input_pipeline(tmp_path: Path) -> None:
    result = _trained("lookup_table", 300, tmp_path)
    assert result["results"]["accuracy"] > 0.6
    assert result["served_matches_keras"]


def test_one_hot_labels_on_the_default_loss_are_told_to_use_categorical_crossentropy() -> None:
    x = np.zeros((8, 4), "float32")
    one_hot = np.eye(3, dtype="float32")[np.arange(8) % 3]
    program = Program(
        build_model=lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
        train_data=lambda shard: tf.data.Dataset.from_tensor_slices((x, one_hot)),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((x, one_hot)),
    )
    with pytest.raises(ProgramError) as refused:
        fit_check.first_batch(program, batch_size=8)
    assert "one-hot" in str(refused.value) and "CategoricalCrossentropy(from_logits=True)" in str(
        refused.value
    )
    assert "int64" not in str(refused.value), "a cast does not make one-hot labels class ids"


def test_sample_weights_weigh_each_examples_loss_and_a_batch_mean_loss_cannot_take_them() -> None:
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    goal = resolve(Program(lambda: None, lambda s: None, lambda: None, loss="mae"), model)
    labels, outputs = tf.zeros((4,)), tf.constant([[1.0], [2.0], [3.0], [4.0]])
    weights = tf.constant([1.0, 0.0, 0.0, 2.0])
    # Keras' weighted loss: the weighted sum over the batch's size, (1 + 8) / 4
    assert float(goal.mean_loss(model, labels, outputs, weights)) == pytest.approx(2.25)
    assert float(goal.replica_loss(model, labels, outputs, 8, 2, weights)) == pytest.approx(9 / 8)

    identity = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, "linear", False, "ones")])
    held_out = tf.data.Dataset.from_tensor_slices((outputs, labels, weights))
    weighed = Program(lambda: identity, lambda s: held_out, lambda: held_out, loss="mae")
    assert export.evaluate(identity, weighed, resolve(weighed, identity)) == pytest.approx({"loss": 2.25})

    x = np.zeros((8, 1), "float32")
    triples = tf.data.Dataset.from_tensor_slices((x, np.zeros(8, "float32"), np.ones(8, "float32")))
    program = Program(
        lambda: model, lambda s: triples, lambda: triples, loss=lambda y, out: tf.reduce_mean(out)
    )
    with pytest.raises(ProgramError, match=r"sample weights.*batch's mean"):
        fit_check.first_batch(program, batch_size=8)


def test_an_optimizer_instance_is_copied_from_its_config_and_anything_else_is_refused() -> None:
    given = keras.optimizers.SGD(0.1, momentum=0.5)
    program = Program(lambda: None, lambda s: None, lambda: None, optimizer=given)
    made, source = objective.optimizer(program, None, lambda: None)
    assert source == "Program.optimizer" and made is not given
    assert (type(made), made.get_config()) == (keras.optimizers.SGD, given.get_config())
    assert objective.optimizer(program, None, lambda: None)[0] is not made, "a fresh one for each scope"
    with pytest.raises(ProgramError, match=r"Program\.optimizer.*lambda: keras\.optimizers"):
        objective.optimizer(Program(lambda: None, lambda s: None, lambda: None, optimizer="sgd"), None, list)


@pytest.mark.slow
def test_keras_metric_objects_and_an_optimizer_instance_made_in_build_train_under_parameter_servers(
    tmp_path: Path,
) -> None:
    """Made before the cluster is joined, they once failed on the chief: `Client for target
    /job:localhost... not found` (metrics), `'SGD' object is not callable` (optimizer)."""
    result = _trained("large_digits_auc", 200, tmp_path, "parameter_server")
    assert "refused" not in result, result
    assert set(result["results"]) == {"loss", "auc", "binary_accuracy"}
    assert result["results"]["auc"] > 0.8 and result["results"]["binary_accuracy"] > 0.7
    assert result["optimizer"] == "SGD (Program.optimizer)"
    assert result["learning_rate"] == pytest.approx(0.1)
    assert result["losses"][-1] < result["losses"][0]
    # deleting them is a remote op on every worker, which the export's first batch waited for
    assert result["outliving"] == ["PerWorkerDistributedIterator"], "the workers' iterators outlive the loop"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_sample_weights_train_as_keras_trains_them(strategy: str, tmp_path: Path) -> None:
    """Every 0 weighs nothing: the model learns the other digits and never says 0 (unweighted, it
    says 0 for nearly every 0 of these digits)."""
    result = _trained("zeros_weighted_out", 300, tmp_path, strategy)
    assert "refused" not in result, result
    classes, labels = np.array(result["classes"]), np.array(result["labels"])
    assert (classes[labels == 0] == 0).mean() < 0.1
    assert (classes[labels != 0] == labels[labels != 0]).mean() > 0.7
    assert result["results"]["sparse_categorical_accuracy"] > 0.6, "a metric object under its Keras name"
    if strategy == "multi_worker_mirrored":  # a batch of three: features, label, weight
        _own_compute_timed_in_every_report(result)


def test_unused_compile_settings_go_into_the_nodes_status(tmp_path: Path) -> None:
    from dlinfra.contract import NodeConfig, StoreConfig
    from dlinfra.training import loop

    figures: dict[str, Any] = {}
    hooks = loop.Hooks(work_dir=tmp_path, on_figures=lambda **given: figures.update(given))
    cfg = NodeConfig(
        run_id="r",
        role="worker",
        index=0,
        strategy="multi_worker_mirrored",
        cluster={"worker": ["127.0.0.1:1"]},
        store=StoreConfig(url=f"file://{tmp_path}/store"),
        training=TrainingSpec(batch_size=32),
        startup_timeout=30,
        heartbeat_interval=5,
        max_runtime=300,
    )
    goal = loop.set_up(_program("unused_compile_settings"), tf.distribute.get_strategy(), cfg, hooks)
    assert goal.loss_name == "sparse_categorical_crossentropy", "the settings it uses are used"
    [warning] = figures["warnings"]
    assert "compile() settings" in warning and warning.endswith("loss_weights, run_eagerly")

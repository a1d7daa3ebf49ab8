"""What counts as a model a script left (node.model_check, node.model_probe): real files made with the
repo's TensorFlow and Keras in a process of their own, checked the way a node checks them, by a
subprocess of the run's python that reads no weights."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dlinfra.node import model_check
from dlinfra.node.model_check import check, latest_checkpoint

pytestmark = pytest.mark.slow

MAKE = """
import sys, pathlib
import tensorflow as tf, keras
out = pathlib.Path(sys.argv[1])
module = tf.Module()
module.v = tf.Variable([1.0, 2.0])
module.f = tf.function(lambda x: x * module.v, input_signature=[tf.TensorSpec([2], tf.float32)])
tf.saved_model.save(module, str(out / "saved" / "model"))
tf.saved_model.save(module, str(out / "estimator" / "export" / "1700000000"))
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
(out / "keras").mkdir()
model.save(out / "keras" / "model.keras")
(out / "h5").mkdir()
model.save(out / "h5" / "model.h5")
model.save_weights(out / "h5" / "only.weights.h5")
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", MAKE, str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_a_real_savedmodel_keras_file_and_full_h5_are_models(made: Path) -> None:
    assert check(made / "saved") == model_check.ModelFound(["SavedModel model"], None)
    assert check(made / "saved" / "model").models == ["SavedModel ."], "the directory itself"
    assert check(made / "keras").models == [".keras model.keras"]
    assert check(made / "h5").models == [".h5 model.h5"], "a weights-only .weights.h5 is not one"


def test_an_estimator_export_in_its_timestamped_directory_is_the_model(made: Path) -> None:
    assert check(made / "estimator").models == ["SavedModel export/1700000000"]


def test_a_directory_of_notes_is_no_model_and_says_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "NOTES.txt").write_text("x" * 31)
    found = check(tmp_path)
    assert found.models == []
    assert found.why_none == "found NOTES.txt (31 bytes), no SavedModel/.keras/.h5"


def test_an_empty_directory_is_no_model(tmp_path: Path) -> None:
    assert check(tmp_path) == model_check.ModelFound([], "found nothing, no SavedModel/.keras/.h5")


def test_a_truncated_keras_file_is_no_model_named_with_why(made: Path, tmp_path: Path) -> None:
    whole = (made / "keras" / "model.keras").read_bytes()
    (tmp_path / "model.keras").write_bytes(whole[: len(whole) // 2])
    found = check(tmp_path)
    assert found.models == []
    assert f"model.keras ({len(whole) // 2} bytes): not a zip archive" in str(found.why_none)


def test_a_keras_zip_without_weights_or_config_is_no_model(made: Path, tmp_path: Path) -> None:
    with (
        zipfile.ZipFile(made / "keras" / "model.keras") as whole,
        zipfile.ZipFile(tmp_path / "config-only.keras", "w") as part,
    ):
        part.writestr("config.json", whole.read("config.json"))
    with zipfile.ZipFile(tmp_path / "notes.keras", "w") as other:
        other.writestr("notes.txt", "not a model")
    why = str(check(tmp_path).why_none)
    assert "config-only.keras" in why and "no model.weights.h5" in why
    assert "notes.keras" in why and "without config.json" in why


def test_a_savedmodel_whose_graph_is_garbage_or_whose_variables_are_gone_is_no_model(
    made: Path, tmp_path: Path
) -> None:
    import shutil

    broken = tmp_path / "garbage"
    shutil.copytree(made / "saved" / "model", broken)
    (broken / "saved_model.pb").write_bytes(b"\xff" * 64)
    assert "does not parse as a SavedModel" in str(check(broken).why_none)
    shutil.rmtree(broken)
    shutil.copytree(made / "saved" / "model", broken)
    shutil.rmtree(broken / "variables")
    assert "no variables/variables.index" in str(check(tmp_path).why_none)


def test_the_latest_checkpoint_is_the_one_tensorflows_state_file_names(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "/node/work/ckpt-7"\nall_model_checkpoint_paths: "/node/work/ckpt-7"\n'
    )
    assert latest_checkpoint(tmp_path) == "ckpt-7", "a node's absolute path means nothing in the store"

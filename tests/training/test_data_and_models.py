"""Data sets in their real on-disk formats, and every model kind, built for real (no cluster)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from dlinfra.spec.dataset import DatasetSpec
from dlinfra.spec.layers import LayerSpec, ModelSpec
from dlinfra.training import data
from support import cifar_tarball


def _cifar_tarball(path: Path, train_per_batch: int = 6, test: int = 5) -> Path:
    """A tiny tarball in exactly the official 'CIFAR-10 python version' layout, random images."""
    rng = np.random.default_rng(0)

    def images(n: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n)

    return cifar_tarball(path, train_per_batch, test, images)


def test_cifar10_loads_from_a_file_uri_in_the_official_format(tmp_path: Path) -> None:
    tarball = _cifar_tarball(tmp_path / "cifar-10-python.tar.gz")
    arrays = data.load(DatasetSpec(format="cifar10", uri=f"file://{tarball}"), tmp_path / "cache")
    assert arrays.x_train.shape == (30, 32, 32, 3) and arrays.x_test.shape == (5, 32, 32, 3)
    assert arrays.x_train.min() >= 0.0 and arrays.x_train.max() <= 1.0
    assert arrays.shape == (32, 32, 3)


def test_pinned_checksum_refuses_a_different_file(tmp_path: Path) -> None:
    tarball = _cifar_tarball(tmp_path / "cifar-10-python.tar.gz")
    good = hashlib.sha256(tarball.read_bytes()).hexdigest()
    data.load(DatasetSpec(format="cifar10", uri=f"file://{tarball}", sha256=good), tmp_path / "c1")
    with pytest.raises(ValueError, match="sha256"):
        data.load(DatasetSpec(format="cifar10", uri=f"file://{tarball}", sha256="0" * 64), tmp_path / "c2")


def test_cifar10_from_s3_through_the_stores_endpoint(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes read an s3:// data set where they write results: the run store's endpoint and region
    (node.json's `store`), with no AWS_ENDPOINT_URL_S3 in the environment."""
    from dlinfra.contract import StoreConfig
    from dlinfra.spec.model import Spec
    from dlinfra.spec.training import TrainingSpec
    from dlinfra.training.program import builtin_program
    from support import FAKE_CREDS, s3_client

    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    tarball = _cifar_tarball(tmp_path / "cifar-10-python.tar.gz")
    s3 = s3_client(moto_endpoint)
    s3.create_bucket(Bucket="datasets")
    s3.upload_file(str(tarball), "datasets", "cifar/cifar-10-python.tar.gz")
    dataset = DatasetSpec(format="cifar10", uri="s3://datasets/cifar/cifar-10-python.tar.gz")
    spec = Spec.model_validate({"storage": {"url": "s3://results/runs", "endpoint_url": moto_endpoint}})
    store = StoreConfig.for_run(spec, "s3://results/runs/r")
    s3_access = data.S3Access(store.endpoint_url, store.region)
    assert data.load(dataset, tmp_path / "a", s3_access).x_train.shape[0] == 30
    # the node's path: the agent hands builtin_program its store's endpoint and region
    training = TrainingSpec(model=ModelSpec(name="mlp"), dataset=dataset)
    program = builtin_program(training, tmp_path / "b", s3_access)
    assert program.build_model() is not None


def test_digits_split_is_fixed_and_independent_of_the_training_seed() -> None:
    first = data.load(DatasetSpec(), Path("."))
    second = data.load(DatasetSpec(), Path("."))
    assert np.array_equal(first.y_test, second.y_test)
    assert len(first.y_test) == round(1797 * 0.2) and first.shape == (8, 8, 1) and first.classes == 10


def test_synthetic_data_is_learnable_shape() -> None:
    arrays = data.load(DatasetSpec(format="synthetic", shape=[4, 4, 2], classes=3, size=100), Path("."))
    assert arrays.x_train.shape[1:] == (4, 4, 2) and set(np.unique(arrays.y_train)) <= {0, 1, 2}


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (ModelSpec(name="cnn"), (8, 8, 1)),
        (ModelSpec(name="mlp", hidden_units=[16]), (8, 8, 1)),
        (ModelSpec(name="resnet20"), (32, 32, 3)),
        (
            ModelSpec(
                name="layers",
                layers=[
                    LayerSpec(type="conv2d", filters=8, activation="relu"),
                    LayerSpec(type="max_pool2d"),
                    LayerSpec(type="batch_norm"),
                    LayerSpec(type="flatten"),
                    LayerSpec(type="dropout", rate=0.1),
                    LayerSpec(type="dense", units=16, activation="relu"),
                ],
            ),
            (8, 8, 1),
        ),
    ],
    ids=["cnn", "mlp", "resnet20", "layers"],
)
def test_every_model_kind_builds_and_outputs_logits(model: ModelSpec, shape: tuple[int, ...]) -> None:
    from dlinfra.training.models import build

    keras_model = build(model, shape, 10)
    out = keras_model(np.zeros((2, *shape), dtype="float32"))
    assert tuple(out.shape) == (2, 10)
    if model.name == "resnet20":
        convs = [layer for layer in keras_model.layers if layer.__class__.__name__ == "Conv2D"]
        assert len(convs) == 19 + 2  # 19 3x3 convs + 2 projection shortcuts: ResNet-20

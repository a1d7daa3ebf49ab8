"""Data sets as in-memory arrays with a fixed train/test split (the split never depends on the seed)."""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dlinfra.runs.bundle import file_sha256
from dlinfra.spec.dataset import DatasetSpec

SPLIT_SEED = 20161  # fixed: the held-out split must be identical on every node and every rerun


@dataclass(frozen=True)
class ArrayData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


class S3Access(NamedTuple):
    """Where an s3:// data set is read: the run store's endpoint and region (an emulator's, or a
    region's), so data and results are reached the same way."""

    endpoint_url: str | None = None
    region: str | None = None


def load(spec: DatasetSpec, cache_dir: Path, s3: S3Access = S3Access()) -> ArrayData:
    if spec.format == "digits":
        return _digits(spec.test_fraction)
    if spec.format == "cifar10":
        assert spec.uri is not None
        return _cifar10(fetch(spec.uri, cache_dir, spec.sha256, s3))
    return _synthetic(spec)


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float) -> ArrayData:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test = max(1, round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return ArrayData(x[train], y[train], x[test], y[test])


def _digits(test_fraction: float) -> ArrayData:
    """scikit-learn's digits (what `sklearn.datasets.load_digits` returns), read from the file its
    wheel ships without importing scikit-learn: 2.7 CPU-seconds on every node that trains on it
    (node.tensorflow_import)."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("scikit-learn is not installed. Fix: pip install 'dlinfra[train]'")
    table = np.loadtxt(
        Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=","
    )
    x = (table[:, :-1].reshape(-1, 8, 8) / 16.0).astype("float32")[..., None]  # 8x8x1 in [0, 1]
    return _split(x, table[:, -1].astype("int64"), test_fraction)


def _synthetic(spec: DatasetSpec) -> ArrayData:
    """Learnable random data: labels come from a fixed random linear map of the inputs."""
    rng = np.random.default_rng(SPLIT_SEED)
    x = rng.standard_normal((spec.size, *spec.shape)).astype("float32")
    weights = rng.standard_normal((int(np.prod(spec.shape)), spec.classes)).astype("float32")
    y = np.argmax(x.reshape(spec.size, -1) @ weights, axis=1).astype("int64")
    return _split(x, y, spec.test_fraction)


def _cifar10(tarball: Path) -> ArrayData:
    """The official 'CIFAR-10 python version': data_batch_1..5 and test_batch pickles."""

    def batches(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        with tarfile.open(tarball, "r:gz") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            for name in names:
                if name not in members:
                    continue
                fh = tar.extractfile(members[name])
                assert fh is not None
                batch = pickle.load(fh, encoding="bytes")
                xs.append(np.asarray(batch[b"data"], dtype="uint8"))
                ys.append(np.asarray(batch[b"labels"], dtype="int64"))
        if not xs:
            raise ValueError(f"{tarball}: no {names[0]} in the tarball (is it cifar-10-python.tar.gz?)")
        x = np.concatenate(xs).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return (x.astype("float32") / 255.0), np.concatenate(ys)

    x_train, y_train = batches([f"data_batch_{i}" for i in range(1, 6)])
    x_test, y_test = batches(["test_batch"])
    return ArrayData(x_train, y_train, x_test, y_test)


def fetch(uri: str, cache_dir: Path, sha256: str | None = None, s3: S3Access = S3Access()) -> Path:
    """Bring a data file to local disk (file://, s3://, http(s)://), checking its checksum if pinned."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    dest = cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:16] / Path(uri).name
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(dest.suffix + ".part")
        if uri.startswith("file://"):
            shutil.copyfile(uri[len("file://") :], tmp)
        elif uri.startswith("s3://"):
            from dlinfra.runs.s3_store import S3Store
            from dlinfra.runs.store import parse_s3_url

            bucket, key = parse_s3_url(uri)
            if not S3Store(f"s3://{bucket}", s3.endpoint_url, s3.region).get_file(key, tmp):
                raise FileNotFoundError(uri)
        else:
            with urllib.request.urlopen(uri, timeout=60) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out)
        tmp.replace(dest)
    if sha256 and file_sha256(dest) != sha256:
        raise ValueError(f"{uri}: sha256 is {file_sha256(dest)}, the spec pins {sha256}")
    return dest

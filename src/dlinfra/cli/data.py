"""`dlinfra data pack`: a data set into TFRecord shards in a store, with their manifest."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dlinfra.cli.console import out
from dlinfra.cli.options import EndpointOpt

if TYPE_CHECKING:
    from dlinfra.training.shards import Source

data_app = typer.Typer(help="Training data: packed into shards a run reads at scale.", no_args_is_help=True)
BUILT_IN = ("digits", "cifar10")


@data_app.command()
def pack(
    source: Annotated[
        str,
        typer.Argument(
            help="digits, cifar10 (with --uri), or a directory of class sub-directories of images"
        ),
    ],
    dest: Annotated[
        str, typer.Argument(help="where the shards go: a directory, file:///abs/path or s3://bucket/prefix")
    ],
    shards: Annotated[int, typer.Option("--shards", min=1, help="training shards")] = 16,
    eval_shards: Annotated[
        int | None, typer.Option("--eval-shards", min=1, help="eval shards (default: shards/8)")
    ] = None,
    encoding: Annotated[
        str, typer.Option("--encoding", help="png (lossless) or jpeg: how built-in arrays are encoded")
    ] = "png",
    eval_fraction: Annotated[
        float,
        typer.Option("--eval-fraction", min=0.01, max=0.5, help="a directory's share held out for eval"),
    ] = 0.1,
    uri: Annotated[
        str | None, typer.Option("--uri", help="cifar10: the cifar-10-python.tar.gz location")
    ] = None,
    endpoint_url: EndpointOpt = None,
    region: Annotated[str | None, typer.Option("--region", help="the bucket's region (s3:// dest)")] = None,
) -> None:
    """Pack SOURCE into TFRecord shards at DEST (train-*.tfrecord, eval-*.tfrecord) and a manifest.json
    with every shard's records, bytes and sha256 and the examples per class."""
    from dlinfra.errors import DlinfraError
    from dlinfra.runs.store_url import open_store

    if encoding not in ("png", "jpeg"):
        raise DlinfraError(f"--encoding {encoding}: use png or jpeg")
    store = open_store(_store_url(dest), endpoint_url, region)
    from dlinfra.training import pack_dest

    # before a source is read or TensorFlow loaded: a DEST it cannot land in whole
    pack_dest.check(store, None if source in BUILT_IN else Path(source))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up notices are not ours
    try:
        from dlinfra.training import shards as packing
    except ImportError as exc:  # TensorFlow writes the records
        raise DlinfraError(f"data pack needs TensorFlow ({exc}): pip install 'dlinfra[train]'") from None
    found = _source(source, uri, encoding, eval_fraction)
    manifest = packing.pack(found, store, shards, eval_shards or max(1, shards // 8))
    for name, split in manifest.splits.items():
        size = sum(s.bytes for s in split.shards)
        out.print(
            f"{name}: {split.records} examples in {len(split.shards)} shards, {size / 1e6:.1f} MB",
            markup=False,
        )
    out.print(f"packed {found.name} ({len(found.classes)} classes) to {store.uri()}", markup=False)


def _store_url(dest: str) -> str:
    if dest.startswith(("s3://", "file://")):
        return dest
    return f"file://{Path(dest).absolute()}"


def _source(source: str, uri: str | None, encoding: str, eval_fraction: float) -> Source:
    from dlinfra.errors import DlinfraError
    from dlinfra.training import data, shards

    if source not in BUILT_IN:
        return shards.directory_source(Path(source), eval_fraction)
    if source == "cifar10" and not uri:
        raise DlinfraError(
            "cifar10: give --uri, the cifar-10-python.tar.gz location (file://, s3://, https://)"
        )
    from dlinfra.environment.venvs import cache_home
    from dlinfra.spec.dataset import DatasetSpec

    spec = DatasetSpec(format="digits" if source == "digits" else "cifar10", uri=uri)
    arrays = data.load(spec, cache_home() / "data")
    return shards.array_source(source, arrays.x_train, arrays.y_train, arrays.x_test, arrays.y_test, encoding)

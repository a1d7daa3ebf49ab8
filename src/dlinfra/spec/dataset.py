"""training.dataset: where the examples come from, and how a record becomes an image and a label."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from dlinfra.spec.grammar import http_url
from dlinfra.spec.input import StrictModel, shown

DATA_SCHEMES = ("file://", "s3://", "https://", "http://")
GLOB_CHARS = ("*", "?", "[")

PositiveInt = Annotated[int, Field(ge=1)]


def is_listing(uri: str | None) -> bool:
    """A glob over one directory's files (`s3://data/imagenet/train-*`), not a packed directory."""
    return uri is not None and any(ch in uri.rsplit("/", 1)[-1] for ch in GLOB_CHARS)


def _listing_problem(uri: str, field: str) -> str | None:
    directory = uri.rpartition("/")[0]
    if any(ch in directory for ch in GLOB_CHARS):
        return (
            f"{field}: {shown(uri)} has a wildcard in a directory; only the file name may have one. "
            "Fix: name one directory, e.g. s3://data/imagenet/train/train-*"
        )
    if not re.fullmatch(r"s3://[^/]+/.+|file://.+", directory):
        # nodes get read access to the directory: never a whole bucket
        return (
            f"{field}: {shown(uri)} is not under an s3:// prefix or a file:// directory. "
            "Fix: keep the files under a prefix, e.g. s3://data/imagenet/train-*"
        )
    return None


def _plain_key(uri: str) -> None:
    """An S3 key is taken literally, but '..' and '.' read as a path (nodes stage under the key's
    names, IAM grants by prefix): a key that looks like it leaves its prefix is refused."""
    segments = uri.removeprefix("s3://").split("/")[1:]
    if any(segment in (".", "..") for segment in segments):
        raise ValueError(
            f"{shown(uri)} has a '.' or '..' segment in its key, which S3 does not resolve. "
            "Fix: name the prefix as it is, e.g. s3://data/imagenet/train-*"
        )


class FeaturesSpec(StrictModel):
    """Your files' tf.train.Example keys, for the built-in model (a program of your own parses
    `Shard.records()` itself)."""

    image: str = Field("image", min_length=1, description="Key of the image bytes.")
    label: str = Field("label", min_length=1, description="Key of the int64 class label (0 to classes-1).")
    encoding: Literal["encoded", "raw"] = Field(
        "encoded",
        description="encoded: JPEG/PNG/GIF/BMP bytes; raw: uint8 pixels of training.dataset.shape.",
    )
    label_offset: int = Field(
        0,
        ge=0,
        description="Subtracted from every label, so labels run from 0 (1 for ImageNet's 1-based labels).",
    )


class DatasetSpec(StrictModel):
    format: Literal["digits", "cifar10", "synthetic", "tfrecord", "files"] = Field(
        "digits",
        description="digits: scikit-learn's handwritten digits; cifar10: the python tarball; tfrecord: "
        "TFRecord files of tf.train.Example records (shards `dlinfra data pack` wrote, or your own); "
        "files: your own files of any format, staged like shards, read by your program or script.",
    )
    uri: str | None = Field(
        None,
        description="cifar10: the tarball (file://, s3:// or https://); tfrecord: the packed directory "
        "(file:// or s3://), where its manifest.json is, or a glob of your own files "
        "(s3://data/imagenet/train-*).",
    )
    eval_uri: str | None = Field(
        None,
        description="tfrecord with a glob uri: the glob of the eval files (s3://data/imagenet/validation-*).",
    )
    features: FeaturesSpec = Field(
        default_factory=FeaturesSpec,
        description="tfrecord: the records' keys and image encoding, for the built-in model.",
    )
    compression: Literal["none", "gzip", "zlib"] = Field(
        "none",
        description="tfrecord with a glob uri: how your files are compressed (as TFRecordWriter wrote them).",
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected checksum of uri (tfrecord: of its manifest or file list; deploy pins it "
        "when unset).",
    )
    test_fraction: float = Field(0.2, gt=0, lt=1, description="Held-out share (digits, synthetic).")
    shape: list[PositiveInt] = Field(
        [8, 8, 1],
        description="Example shape (synthetic); tfrecord: what images of differing sizes are resized "
        "to, and the shape of your own files' images.",
    )
    classes: int = Field(10, ge=2, description="Number of classes (synthetic; tfrecord: your own files).")
    size: PositiveInt = Field(2048, description="Number of examples (synthetic).")
    cache_gb: float | None = Field(
        None,
        gt=0,
        description="tfrecord: stream each node's train files through a cache of at most this many GB "
        "(10**9 bytes): training starts when the first file lands, and files already read are evicted "
        "when the node's share does not fit. Unset: each node stages its whole share before training.",
    )
    outside_experiment_dir: bool = Field(
        False,
        description="A relative file:// uri must stay inside the experiment file's directory (no '..' "
        "or symlink out of it): true when you mean a path outside it. An absolute file:// uri is yours.",
    )

    @field_validator("uri", "eval_uri")
    @classmethod
    def _uri_scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(DATA_SCHEMES):
            raise ValueError(f"must start with one of {', '.join(DATA_SCHEMES)} (got {shown(v)})")
        if v is not None and v.startswith("http"):
            http_url(v)  # no credentials in a URL every node and log sees
        if v is not None and v.startswith("s3://"):
            _plain_key(v)
        return v

    def builtin_problem(self) -> str | None:
        """What the built-in model needs of a staged set that the spec alone shows, so that validate
        refuses what deploy would (a packed set's manifest names the rest, read at deploy)."""
        if self.format == "files":
            return (
                "format files are read by a program or script of yours (the built-in model reads "
                "TFRecords). Fix: set training.entrypoint or training.command, or pack images into "
                "shards (`dlinfra data pack`)"
            )
        if self.format != "tfrecord" or not is_listing(self.uri):
            return None
        missing = [
            f"{name} ({example})"
            for name, example in (
                ("eval_uri", "the glob of the files it evaluates on, e.g. s3://data/imagenet/validation-*"),
                ("shape", "your images' shape, e.g. [224, 224, 3]"),
                ("classes", "their number of classes, e.g. 1000"),
            )
            if name not in self.model_fields_set
        ]
        if not missing:
            return None
        return (
            f"the built-in model reads your own TFRecord files with training.dataset.{', '.join(missing)} "
            "given. Fix: set them, or train with training.entrypoint or training.command"
        )

    @property
    def compression_type(self) -> str:
        """TensorFlow's name for it (TFRecordDataset's compression_type)."""
        return "" if self.compression == "none" else self.compression.upper()

    @property
    def staged(self) -> bool:
        """Files each node copies to its disk before training (see training.staging)."""
        return self.format in ("tfrecord", "files")

    @model_validator(mode="after")
    def _uri_needed(self) -> DatasetSpec:
        if self.format == "cifar10" and not self.uri:
            raise ValueError("format cifar10 needs 'uri' (the cifar-10-python.tar.gz location)")
        if self.format == "files" and not is_listing(self.uri):
            raise ValueError(
                "format files needs 'uri' as a glob of your files, e.g. s3://data/logs/part-*.csv"
            )
        if self.staged:
            self._check_tfrecord()
        elif self.eval_uri is not None:
            raise ValueError("'eval_uri' is for format tfrecord with a glob uri. Fix: remove it")
        if self.compression != "none" and self.format != "tfrecord":
            raise ValueError(f"'compression' is for TFRecord files, not format {self.format}. Fix: remove it")
        if self.cache_gb is not None and self.format != "tfrecord":
            raise ValueError(
                f"'cache_gb' streams TFRecord files; format {self.format} "
                f"{'is staged whole' if self.staged else 'is read into memory'}. Fix: remove it"
            )
        if self.uri and self.uri.startswith("http://") and not self.sha256:
            # the tarball is unpickled: bytes changed on an unencrypted path would run as code
            raise ValueError("a plain-HTTP uri needs its sha256 (training.dataset.sha256), or use https://")
        return self

    def _check_tfrecord(self) -> None:
        if not (self.uri and self.uri.startswith(("file://", "s3://"))):
            raise ValueError(
                "format tfrecord needs 'uri': the file:// or s3:// directory `dlinfra data pack` wrote, "
                "or a glob of your own files (s3://data/imagenet/train-*)"
            )
        if is_listing(self.uri):
            if self.eval_uri is not None and not is_listing(self.eval_uri):
                raise ValueError(
                    f"eval_uri: {shown(self.eval_uri)} is no glob. Fix: name the eval files as uri names "
                    "the train files, e.g. s3://data/imagenet/validation-*"
                )
            for field, uri in (("uri", self.uri), ("eval_uri", self.eval_uri)):
                if uri is not None and (problem := _listing_problem(uri, field)):
                    raise ValueError(problem)
            return
        if self.compression != "none":
            raise ValueError(
                "'compression' is for your own files (a glob uri); `dlinfra data pack` writes shards "
                "uncompressed. Fix: remove it"
            )
        if self.eval_uri is not None:
            raise ValueError(
                "'eval_uri': a packed directory names its own eval shards (its manifest.json). Fix: remove "
                "it, or give uri as a glob of your own files"
            )
        if not re.fullmatch(r"s3://[^/]+/.*[^/].*|file://.+", self.uri):
            # nodes get read access to what is under the prefix: never a whole bucket
            raise ValueError("format tfrecord: 'uri' needs a prefix under the bucket, e.g. s3://data/digits")

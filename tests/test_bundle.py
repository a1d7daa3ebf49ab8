"""Code bundles: the same code gives the same bytes; nodes unpack exactly what was packed."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from dlinfra.errors import SpecError, StoreError
from dlinfra.runs.bundle import (
    LARGE_FILE_BYTES,
    MAX_BUNDLE_BYTES,
    extract_safely,
    materialize,
    pack,
    pack_entrypoint,
)
from dlinfra.runs.layout import RunStore
from dlinfra.runs.store_url import open_store
from support import Cli


def _project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("from pkg.layers import width\n\ndef build(training):\n    return width\n")
    (root / "pkg" / "layers.py").write_text("width = 64\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0compiled")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def test_same_code_gives_the_same_sha_whatever_the_checkout(tmp_path: Path) -> None:
    a = _project(tmp_path / "a")
    b = _project(tmp_path / "b")
    os.utime(b / "train.py", (1, 1))  # another clone: other mtimes, same content
    (b / "pkg" / "layers.py").chmod(0o600)
    assert pack(a)[0] == pack(b)[0]
    (b / "pkg" / "layers.py").write_text("width = 65\n")
    assert pack(a)[0] != pack(b)[0]


def test_bundle_holds_the_code_and_nothing_else(tmp_path: Path) -> None:
    bundle = pack_entrypoint("exp/train.py:build", _project(tmp_path / "exp").parent)
    assert bundle.entrypoint == "train.py:build"
    out = tmp_path / "bundle.tar.gz"
    out.write_bytes(bundle.data)
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    assert sorted(m.name for m in members) == ["pkg/layers.py", "train.py"]
    assert all(m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in members)
    assert bundle.pin().sha256 == hashlib.sha256(bundle.data).hexdigest()


def test_missing_entrypoint_and_oversized_directory_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"training\.entrypoint: .* does not exist"):
        pack_entrypoint("nowhere/train.py:build", tmp_path)
    big = tmp_path / "big"
    big.mkdir()
    (big / "train.py").write_text("def build(t): ...\n")
    (big / "weights.bin").write_bytes(b"\0" * (MAX_BUNDLE_BYTES + 1))
    with pytest.raises(SpecError, match="holds over 50 MB"):
        pack_entrypoint("big/train.py:build", tmp_path)


def test_a_node_unpacks_the_bundle_from_the_store_and_refuses_altered_bytes(tmp_path: Path) -> None:
    bundle = pack_entrypoint("exp/train.py:build", _project(tmp_path / "exp").parent)
    store = RunStore(open_store((tmp_path / "store").as_uri()))
    store.put_bundle(bundle.sha256, bundle.data)
    entry = materialize(store, bundle.sha256, bundle.entrypoint, tmp_path / "node")
    path, _, func = entry.rpartition(":")
    assert func == "build" and Path(path).read_text() == (tmp_path / "exp" / "train.py").read_text()
    assert (Path(path).parent / "pkg" / "layers.py").read_text() == "width = 64\n"
    store.put_bundle(bundle.sha256, bundle.data[:-1] + b"x")
    with pytest.raises(StoreError, match="does not match its pinned sha256"):
        store.bundle(bundle.sha256)
    with pytest.raises(StoreError, match="is missing"):
        store.bundle("0" * 64)


def test_keys_and_credentials_stay_out_and_dlinfraignore_is_honoured(tmp_path: Path) -> None:
    root = _project(tmp_path / "exp")
    for name in ("id_rsa_backup", "creds.env", "server.pem", "credentials", "terraform.tfstate"):
        (root / name).write_text("secret\n")
    (root / "data.csv").write_text("1,2\n")
    (root / "notes").mkdir()
    (root / "notes" / "draft.md").write_text("x\n")
    bundle = pack_entrypoint("exp/train.py:build", root.parent)
    assert list(bundle.files) == ["data.csv", "notes/draft.md", "pkg/layers.py", "train.py"]
    assert bundle.pin().files == list(bundle.files)
    (root / ".dlinfraignore").write_text("# data stays home\n*.csv\nnotes/*\n!server.pem\n")
    assert list(pack_entrypoint("exp/train.py:build", root.parent).files) == [
        "pkg/layers.py",
        "server.pem",
        "train.py",
    ]


def test_an_entrypoint_outside_the_spec_directory_is_refused(tmp_path: Path) -> None:
    _project(tmp_path / "elsewhere")
    (tmp_path / "project").mkdir()
    with pytest.raises(SpecError, match=r"training\.entrypoint: \.\./elsewhere/train\.py lies outside"):
        pack_entrypoint("../elsewhere/train.py:build", tmp_path / "project")


def test_an_oversized_bundle_is_refused_before_unpacking_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = pack_entrypoint("exp/train.py:build", _project(tmp_path / "exp").parent)
    store = RunStore(open_store((tmp_path / "store").as_uri()))
    store.put_bundle(bundle.sha256, bundle.data)
    monkeypatch.setattr("dlinfra.runs.bundle.MAX_BUNDLE_BYTES", 10)  # the headers say more than this
    with pytest.raises(StoreError, match=r"unpacks to \d+ bytes, over the"):
        materialize(store, bundle.sha256, bundle.entrypoint, tmp_path / "node")
    assert list((tmp_path / "node").iterdir()) == [], "no partial unpacking left behind"


def test_validate_refuses_a_missing_or_outside_entrypoint(cli: Cli, tmp_path: Path) -> None:
    _project(tmp_path / "elsewhere")
    (tmp_path / "project").mkdir()
    for entrypoint, message in (
        ("nope.py:build", "does not exist"),
        ("../elsewhere/train.py:build", "lies outside"),
    ):
        spec = tmp_path / "project" / "experiment.yaml"
        spec.write_text(f"training:\n  entrypoint: {entrypoint}\n")
        result = cli("validate", str(spec))
        assert result.returncode == 2, result.stdout + result.stderr
        assert "training.entrypoint: " in result.stderr and message in result.stderr


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ("import tensorflow as tf\nstrategy = tf.distribute.MultiWorkerMirroredStrategy()\n", True),
        ("def main():\n    pass\n", True),
        ("def build(training):\n    return None\n", False),
        ("from pkg.programs import build\n", False),
        ("build = make_builder()\n", False),
        ("from pkg import *\n", False),
        ("try:\n    from fast import build\nexcept ImportError:\n    from slow import build\n", False),
    ],
)
def test_an_entrypoint_file_must_bind_its_function_read_not_run(
    tmp_path: Path, source: str, refused: bool
) -> None:
    """A whole training script named as an entrypoint would train on import on every node and then
    fail for want of the function: it is refused before anything runs, pointing at script mode."""
    (tmp_path / "train.py").write_text(source)
    if not refused:
        pack_entrypoint("train.py:build", tmp_path)
        return
    with pytest.raises(SpecError) as caught:
        pack_entrypoint("train.py:build", tmp_path)
    assert "defines no 'build'" in str(caught.value)
    assert "training.command: [python, train.py]" in str(caught.value)


def test_a_large_file_packed_with_the_code_is_named_with_the_way_out(tmp_path: Path) -> None:
    root = _project(tmp_path / "p")
    (root / "pkg" / "train.npy").write_bytes(os.urandom(LARGE_FILE_BYTES))
    (root / "notes.txt").write_bytes(b"x" * (LARGE_FILE_BYTES - 1))
    bundle = pack_entrypoint("train.py:build", root)
    (warning,) = bundle.warnings("training.entrypoint")
    assert warning.startswith("training.entrypoint: the code bundle holds pkg/train.npy (5 MB)")
    assert "dlinfra data pack" in warning and ".dlinfraignore" in warning
    (root / ".dlinfraignore").write_text("*.npy\n")
    assert pack_entrypoint("train.py:build", root).warnings("training.entrypoint") == []


@pytest.mark.parametrize("python", ["with tarfile's data filter", "3.11 before 3.11.4 (no filter)"])
def test_archives_unpack_only_inside_their_dir_on_every_python(
    python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian 12's Python (3.11.2: the controller image's, some nodes') has no `filter=`: the same
    archives are refused there, and a plain one unpacks."""
    if python.startswith("3.11 before"):
        monkeypatch.delattr(tarfile, "data_filter", raising=False)

    def archive(name: str, add: Callable[[tarfile.TarFile], None]) -> tarfile.TarFile:
        path = tmp_path / f"{name}.tar"
        with tarfile.open(path, "w") as tar:
            add(tar)
        return tarfile.open(path)

    def file(arcname: str) -> Callable[[tarfile.TarFile], None]:
        def add(tar: tarfile.TarFile) -> None:
            info = tarfile.TarInfo(arcname)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"ok"))

        return add

    def link(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("escape")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
        file("escape")(tar)  # written through the link, were it followed

    absolute = tmp_path / "outside-absolute"
    for name, add in (("up", file("../outside")), ("absolute", file(str(absolute))), ("link", link)):
        # refused, or (tarfile's filter strips a leading /) unpacked inside the dir
        with archive(name, add) as tar, contextlib.suppress(StoreError, tarfile.TarError):
            extract_safely(tar, tmp_path / name)
    assert not (tmp_path / "outside").exists() and not absolute.exists()
    assert not (tmp_path / "link" / "escape").is_symlink()
    with archive("plain", file("code/train.py")) as tar:
        extract_safely(tar, tmp_path / "plain")
    assert (tmp_path / "plain" / "code" / "train.py").read_text() == "ok"

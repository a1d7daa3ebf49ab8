"""What in a script's model directory TensorFlow can load: run by the run's own python as
`python -m dlinfra.node.model_probe DIR` (node.model_check starts it), so the files are read with the
TensorFlow protobufs and h5py the script had, while the node's agent imports neither.

What counts, found anywhere up to MAX_DEPTH directories down (an Estimator exports into a timestamped
subdirectory):
- a SavedModel: a directory whose saved_model.pb (or .pbtxt) parses as a SavedModel holding a meta
  graph, beside variables/variables.index;
- a `.keras` file: a zip archive whose config.json parses as a model config, with the weights file
  (model.weights.h5 or .npz) Keras saves beside it;
- an `.h5` file (not `.weights.h5`): HDF5 with the model_config attribute load_model builds it from.
Weights are never read: only a SavedModel's graph, a config, an HDF5 header. Prints one JSON object:
{"models": ["SavedModel export/1700000000", ...], "why_none": null or what was found instead}.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

KINDS = "SavedModel/.keras/.h5"
MAX_DEPTH = 4
NOTHING = f"found nothing, no {KINDS}"
LISTED = 5  # files named in what a directory without a model held


def probe(root: Path) -> dict[str, Any]:
    models: list[str] = []
    problems: list[str] = []
    for path in _candidates(root, 0):
        rel = "." if path == root else str(path.relative_to(root))
        kind, why = _judge(path)
        if why is None:
            models.append(f"{kind} {rel}")
        else:
            problems.append(f"{rel} ({_size(path)}): {why}")
    if models:
        return {"models": models, "why_none": None}
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    named = [f"{p.relative_to(root)} ({_size(p)})" for p in files[:LISTED]]
    more = f" and {len(files) - LISTED} more files" if len(files) > LISTED else ""
    found = f"found {', '.join(named)}{more}, no {KINDS}" if files else NOTHING
    return {"models": [], "why_none": found + "".join(f"; {p}" for p in problems)}


def _candidates(directory: Path, depth: int) -> list[Path]:
    if (directory / "saved_model.pb").is_file() or (directory / "saved_model.pbtxt").is_file():
        return [directory]  # its variables/ and assets/ are the SavedModel's own
    found = []
    for path in sorted(directory.iterdir()):
        if path.is_symlink():
            continue  # a link out of the directory is not uploaded (runs.local_files): not the model
        if path.is_dir() and depth < MAX_DEPTH:
            found += _candidates(path, depth + 1)
        elif path.is_file() and (path.suffix == ".keras" or _full_h5(path)):
            found.append(path)
    return found


def _full_h5(path: Path) -> bool:
    return path.suffix == ".h5" and not path.name.endswith(".weights.h5")


def _judge(path: Path) -> tuple[str, str | None]:
    if path.is_dir():
        return "SavedModel", _saved_model(path)
    if path.suffix == ".keras":
        return ".keras", _keras(path)
    return ".h5", _h5(path)


def _saved_model(directory: Path) -> str | None:
    try:
        saved_model_pb2 = _saved_model_proto()
    except ImportError:
        return "not checked: the run's environment has no TensorFlow to read it with"
    from google.protobuf import message, text_format

    saved = saved_model_pb2.SavedModel()
    try:
        if (pb := directory / "saved_model.pb").is_file():
            saved.ParseFromString(pb.read_bytes())
        else:
            text_format.Parse((directory / "saved_model.pbtxt").read_text(), saved)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        return f"its saved_model.pb does not parse as a SavedModel ({str(exc)[:200] or type(exc).__name__})"
    if not saved.meta_graphs:
        return "its saved_model.pb holds no meta graph"
    if not (directory / "variables" / "variables.index").is_file():
        return "it has no variables/variables.index (the SavedModel's weights)"
    return None


def _saved_model_proto() -> types.ModuleType:
    """TensorFlow's SavedModel protobuf without importing TensorFlow itself (seconds, and the runtime):
    its `tensorflow` package stands in as a bare namespace while the generated modules load."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tensorflow")
    package = types.ModuleType("tensorflow")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules.setdefault("tensorflow", package)
    from tensorflow.core.protobuf import saved_model_pb2

    return saved_model_pb2


def _keras(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "config.json" not in names:
                return "a zip archive without config.json: not a Keras model file"
            config = json.loads(archive.read("config.json"))
    except zipfile.BadZipFile:
        return "not a zip archive (truncated, or not a Keras model file)"
    except (ValueError, zipfile.LargeZipFile, OSError) as exc:
        return f"its config.json does not read ({str(exc)[:200]})"
    if not isinstance(config, dict) or "class_name" not in config:
        return "its config.json is not a Keras model config (no class_name)"
    if not names & {"model.weights.h5", "model.weights.npz"}:
        return "it holds no model.weights.h5: a config without weights"
    return None


def _h5(path: Path) -> str | None:
    try:
        import h5py
    except ImportError:
        return "not checked: the run's environment has no h5py to read it with"
    try:
        with h5py.File(path, "r") as f:
            if "model_config" not in f.attrs:
                return "HDF5 without model_config: weights only, load_model cannot build a model from it"
    except OSError as exc:
        return f"not a readable HDF5 file ({str(exc)[:200]})"
    return None


def _size(path: Path) -> str:
    if path.is_dir():
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
        return f"directory, {size} bytes"
    return f"{path.stat().st_size} bytes"


if __name__ == "__main__":
    print(json.dumps(probe(Path(sys.argv[1]))), flush=True)

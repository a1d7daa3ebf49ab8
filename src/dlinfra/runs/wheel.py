"""The exact dlinfra that cloud nodes install.

From a source checkout, nodes get a wheel of that very source: built here (hatchling builds are
reproducible, so the same source gives the same sha256), uploaded to the run's store, installed by
cloud-init. An installed release has no source to build from; its nodes install the same release
from PyPI, and the manifest records the requirement instead of a wheel.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dlinfra import __version__
from dlinfra.environment.venvs import cache_home
from dlinfra.errors import DlinfraError

SOURCE_ROOT = Path(__file__).resolve().parents[3]


def _source_digest(root: Path) -> str:
    digest = hashlib.sha256()
    files = [root / "pyproject.toml", *sorted((root / "src" / "dlinfra").rglob("*"))]
    for path in files:
        parts = path.relative_to(root).parts
        if not path.is_file() or "__pycache__" in parts or any(p.startswith(".") for p in parts):
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def node_wheel() -> Path | None:
    """This source tree as a wheel (cached by content), or None when not running from source."""
    if not (SOURCE_ROOT / "pyproject.toml").is_file() or not (SOURCE_ROOT / "src" / "dlinfra").is_dir():
        return None
    out = cache_home() / "wheels" / _source_digest(SOURCE_ROOT)[:16]  # by content: shared by runs
    wheels = sorted(out.glob(f"dlinfra-{__version__}-*.whl"))
    if wheels:
        return wheels[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built aside, then renamed in: another process never sees half a wheel.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check"]
        result = subprocess.run([*pip, "-w", tmp, str(SOURCE_ROOT)], capture_output=True, text=True)
        built = sorted(Path(tmp).glob(f"dlinfra-{__version__}-*.whl"))
        if result.returncode != 0 or not built:
            raise DlinfraError(
                f"could not build the dlinfra wheel for the nodes from {SOURCE_ROOT}:\n"
                f"{result.stderr[-2000:]}\nFix: `pip wheel --no-deps .` must work in the checkout "
                "(it needs the hatchling build backend)"
            )
        out.mkdir(exist_ok=True)
        os.replace(built[0], out / built[0].name)
    return out / built[0].name

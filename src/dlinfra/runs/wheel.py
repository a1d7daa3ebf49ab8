"""The exact dlinfra that nodes install: a wheel of the running dlinfra, whatever way it was installed.

From a source checkout, nodes get a wheel of that very source: built here (hatchling builds are
reproducible, so the same source gives the same sha256). Installed from a wheel, an index or a
`git+https://…@COMMIT` URL, there is no source to build from, and no index need serve this version
(a git install's `0.1.0` is on none): the wheel is repacked from the installed distribution's own
files (its RECORD), so the nodes run the very code that planned them. Either way the wheel is
uploaded to the run's store, pinned by its sha256 in the manifest, and installed `--no-deps` after
the lock (environment/lock.py keeps it out of the lock).
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path, PurePosixPath

import dlinfra
from dlinfra import __version__
from dlinfra.environment.lock import uv
from dlinfra.environment.venvs import cache_home
from dlinfra.errors import DlinfraError

SOURCE_ROOT = Path(__file__).resolve().parents[3]
# Files an installer writes about its own install, not part of the wheel (PEP 376, PEP 610)
INSTALLER_FILES = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"})
# Every entry's timestamp (zip's earliest): the same files give the same bytes, so the same sha256
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def _source_digest(root: Path) -> str:
    digest = hashlib.sha256()
    files = [root / "pyproject.toml", *sorted((root / "src" / "dlinfra").rglob("*"))]
    for path in files:
        parts = path.relative_to(root).parts
        if not path.is_file() or "__pycache__" in parts or any(p.startswith(".") for p in parts):
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def node_wheel() -> Path:
    """The running dlinfra as a wheel, cached by content: this source tree built, or the installed
    distribution repacked."""
    return _built(SOURCE_ROOT) if _checkout() else _repacked()


class BuildingWheel:
    """A checkout's wheel, building in a thread, and the pyproject.toml its lock resolves from
    meanwhile (environment/declared.py): a fresh start waited for the build, then the lock. An
    interpreter's exit waits for the build, so a refused run leaves no half-built wheel behind."""

    def __init__(self, root: Path) -> None:
        self.pyproject = root / "pyproject.toml"
        pool = ThreadPoolExecutor(1, thread_name_prefix="dlinfra-wheel")
        self._built = pool.submit(_built, root)
        pool.shutdown(wait=False)  # its one thread ends with the build

    def result(self) -> Path:
        """The wheel, once built (its build's DlinfraError, if it failed)."""
        return self._built.result()


def node_wheel_started() -> Path | BuildingWheel:
    """node_wheel(), started: a checkout's build goes on while its lock resolves."""
    return BuildingWheel(SOURCE_ROOT) if _checkout() else _repacked()


def _checkout() -> bool:
    return (SOURCE_ROOT / "pyproject.toml").is_file() and (SOURCE_ROOT / "src" / "dlinfra").is_dir()


def _built(root: Path) -> Path:
    out = cache_home() / "wheels" / _source_digest(root)[:16]  # by content: shared by runs
    wheels = sorted(out.glob(f"dlinfra-{__version__}-*.whl"))
    if wheels:
        return wheels[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built aside, then renamed in: another process never sees half a wheel.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        # uv's build (0.5 s; pip's took 1.1 s): the same hatchling, the same bytes. Offline, the
        # build backend uv cached answers.
        build = [uv(), "build", "--wheel", "--quiet", "--out-dir", tmp, str(root)]
        environ = dict(os.environ, NO_COLOR="1", UV_NO_PROGRESS="1")
        result = subprocess.run(build, capture_output=True, text=True, env=environ)
        if result.returncode != 0:
            offline = subprocess.run([*build, "--offline"], capture_output=True, text=True, env=environ)
            result = offline if offline.returncode == 0 else result
        built = sorted(Path(tmp).glob(f"dlinfra-{__version__}-*.whl"))
        if result.returncode != 0 or not built:
            raise DlinfraError(
                f"could not build the dlinfra wheel for the nodes from {root}:\n"
                f"{result.stderr[-2000:]}\nFix: `uv build --wheel` must work in the checkout "
                "(it needs the hatchling build backend, from the package index or uv's cache)"
            )
        out.mkdir(exist_ok=True)
        os.replace(built[0], out / built[0].name)
    return out / built[0].name


def _repacked() -> Path:
    """The installed distribution's files (as its RECORD lists them) zipped back into a wheel:
    the package and its .dist-info, without what the installer added (scripts are made again from
    entry_points.txt, bytecode by the nodes' install)."""
    entries, dist_info, tag = installed_entries()
    digest = hashlib.sha256()
    for name, data in entries.items():
        digest.update(name.encode() + b"\0" + data + b"\0")
    out = cache_home() / "wheels" / f"installed-{digest.hexdigest()[:16]}"
    wheel = out / f"{dist_info.removesuffix('.dist-info')}-{tag}.whl"
    if wheel.is_file():
        return wheel
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out, prefix=".repack-", suffix=".whl", delete=False) as tmp:
        _write_wheel(Path(tmp.name), entries, dist_info)
        os.replace(tmp.name, wheel)  # another process never sees half a wheel
    return wheel


def installed_entries() -> tuple[dict[str, bytes], str, str]:
    """(archive path → bytes, the .dist-info directory, the wheel tag) of the installed dlinfra,
    checked to be the dlinfra running now (not another copy that happens to be on sys.path)."""
    fix = "Fix: reinstall dlinfra with pip or uv (pip install --force-reinstall 'dlinfra @ …')"
    try:
        dist = metadata.distribution("dlinfra")
    except metadata.PackageNotFoundError:
        raise DlinfraError(f"dlinfra runs from {dlinfra.__file__} but is not installed. {fix}") from None
    if dist.files is None or dist.version != __version__:
        raise DlinfraError(
            f"the installed dlinfra {dist.version} has no file list (RECORD), or is not the running "
            f"{__version__}: the nodes cannot be given the same code. {fix}"
        )
    entries: dict[str, bytes] = {}
    for file in dist.files:
        posix = PurePosixPath(file.as_posix())
        top, name = posix.parts[0], posix.name
        if top == ".." or "__pycache__" in posix.parts or name.endswith(".pyc"):
            continue  # scripts and bytecode: made again by the nodes' install
        if top.endswith(".dist-info") and len(posix.parts) == 2 and name in INSTALLER_FILES:
            continue
        if top != "dlinfra" and not top.endswith(".dist-info"):
            continue  # an editable install's .pth and finders: never in a wheel
        entries[str(posix)] = Path(str(dist.locate_file(file))).read_bytes()
    dist_info = next((p.split("/")[0] for p in entries if p.endswith(".dist-info/WHEEL")), None)
    running = Path(dlinfra.__file__).resolve()
    if (
        dist_info is None
        or "dlinfra/__init__.py" not in entries
        or (Path(str(dist.locate_file("dlinfra/__init__.py"))).resolve() != running)
    ):
        raise DlinfraError(
            f"the installed dlinfra distribution is not the dlinfra running from {running.parent}. {fix}"
        )
    tags = [line.split(":", 1)[1].strip() for line in entries[f"{dist_info}/WHEEL"].decode().splitlines()
            if line.startswith("Tag:")]  # fmt: skip
    return entries, dist_info, tags[0] if len(tags) == 1 else "py3-none-any"


def _write_wheel(path: Path, entries: dict[str, bytes], dist_info: str) -> None:
    record = [
        f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}" for name, data in entries.items()
    ]
    files = {
        **dict(sorted(entries.items())),
        f"{dist_info}/RECORD": ("\n".join([*sorted(record), f"{dist_info}/RECORD,,"]) + "\n").encode(),
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

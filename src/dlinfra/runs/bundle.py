"""Code bundles: the user's training code, packed so that the same files always give the same bytes.

The directory holding the entrypoint file (script mode: the experiment file's directory) is packed
into a tar.gz with sorted entries and zeroed times, owners and modes (so its sha256 names the code,
not the checkout); it goes to the run's store (see layout) and every node, on any target, runs the
code from there. A rerun copies the bundle of the original run, so it runs the original code even
after the files changed.
"""

from __future__ import annotations

import ast
import fnmatch
import gzip
import hashlib
import io
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from dlinfra.errors import SpecError, StoreError
from dlinfra.runs.layout import RunStore
from dlinfra.runs.manifest import BundlePin
from dlinfra.spec.training import TrainingSpec

MAX_BUNDLE_BYTES = 50 * 1024 * 1024
LARGE_FILE_BYTES = 5 * 1024 * 1024  # a file this big in a code bundle is data, most likely
SKIPPED_DIRS = {"__pycache__", "node_modules", "venv"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")
# Names that hold keys and credentials, left out unless .dlinfraignore says `!pattern`: a bundle goes
# to the store and every node, and reruns keep it.
SECRET_NAMES = ("id_*", "*.pem", "*.key", "*.p12", "*.pfx", "*.env", "credentials*", "*.tfstate*", "*.kdbx")
IGNORE_FILE = ".dlinfraignore"


@dataclass(frozen=True)
class Bundle:
    data: bytes
    entrypoint: str  # 'relative/file.py:function' inside the bundle
    files: tuple[str, ...] = ()
    large: tuple[tuple[str, int], ...] = ()  # (path, bytes) of files of LARGE_FILE_BYTES or more

    def warnings(self, field: str) -> list[str]:
        """What to tell the user of data packed with the code: every node downloads it, every
        rerun keeps it, and a 50 MB bundle is refused."""
        return [
            f"{field}: the code bundle holds {name} ({size / 2**20:.0f} MB): every node downloads it with "
            f"the code and every rerun keeps it. Fix: pack data into shards (`dlinfra data pack`) and set "
            f"training.dataset.uri, or leave the file out with {IGNORE_FILE}"
            for name, size in self.large
        ]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def pin(self) -> BundlePin:
        return BundlePin(
            sha256=self.sha256, entrypoint=self.entrypoint, bytes=len(self.data), files=list(self.files)
        )


def entrypoint_file(entrypoint: str, base: Path) -> Path:
    """The file of 'file.py:function', relative to `base` (the spec's directory) and inside it."""
    file_name = entrypoint.rpartition(":")[0]
    path = (base / file_name).resolve()
    if not path.is_file():
        raise SpecError(
            [f"training.entrypoint: {path} does not exist. Fix: give a path relative to the spec file"]
        )
    if not path.is_relative_to(base.resolve()):
        raise SpecError(
            [
                f"training.entrypoint: {file_name} lies outside {base}, and its whole directory would be "
                "packed and uploaded. Fix: keep the training code next to (or below) the experiment file"
            ]
        )
    _defines(path, file_name, entrypoint.rpartition(":")[2])
    return path


def _defines(path: Path, file_name: str, name: str) -> None:
    """The entrypoint's file binds `name` at its top level (read, never run: a whole training script
    named as an entrypoint would train on import, then fail for want of the function)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError) as exc:
        raise SpecError([f"training.entrypoint: {file_name} is not valid Python: {exc}"]) from None
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif not isinstance(node, ast.Expr):
            return  # conditional definitions (if/try/with): too dynamic to judge, the node will tell
    if name not in bound and "*" not in bound:
        raise SpecError(
            [
                f"training.entrypoint: {file_name} defines no {name!r} at its top level. Fix: name the "
                f"function that returns the Program, or, for a whole training script that reads TF_CONFIG "
                f"itself, run it as it is: training.command: [python, {file_name}]"
            ]
        )


def pack_entrypoint(entrypoint: str, base: Path, leave_out: Path | None = None) -> Bundle:
    """Bundle the directory of 'file.py:function' (a path relative to `base`, the spec's directory)."""
    path = entrypoint_file(entrypoint, base)
    archive, listed = pack(path.parent, leave_out=leave_out)
    large = _large(path.parent, listed)
    return Bundle(archive, f"{path.name}:{entrypoint.rpartition(':')[2]}", listed, large)


def code_root(training: TrainingSpec, base: Path) -> Path | None:
    """The directory packed as the run's code (see pack_code); None: the run packs none."""
    if training.entrypoint:
        return entrypoint_file(training.entrypoint, base).parent
    return base if training.command else None


def pack_code(training: TrainingSpec, base: Path, leave_out: Path) -> Bundle | None:
    """The run's code: the entrypoint's directory, or in script mode (`training.command`) the
    experiment file's directory `base`, which the command runs from. `leave_out`: dlinfra's own runs
    (DLINFRA_HOME), never code though it may lie below it."""
    if training.entrypoint:
        return pack_entrypoint(training.entrypoint, base, leave_out)
    if training.command:
        archive, listed = pack(base, "training.command", leave_out)
        return Bundle(archive, "", listed, _large(base, listed))
    return None


def _large(root: Path, listed: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    sizes = ((name, (root / name).stat().st_size) for name in listed)
    return tuple((name, size) for name, size in sizes if size >= LARGE_FILE_BYTES)


def command_file(command: list[str], base: Path) -> Path | None:
    """The script a `python FILE ...` command runs, when it names one, checked before anything starts
    (a missing file is a typo that would otherwise fail on every node)."""
    if len(command) < 2 or not Path(command[0]).name.startswith("python") or not command[1].endswith(".py"):
        return None
    path = (base / command[1]).resolve()
    if not path.is_file():
        raise SpecError(
            [
                f"training.command: {command[1]} is not a file in {base}, the directory the command runs "
                "from. Fix: give the script's path relative to the experiment file"
            ]
        )
    return path


def _ignored(root: Path) -> tuple[list[str], list[str]]:
    """(patterns left out, patterns let back in): the secret names, then .dlinfraignore's lines."""
    out, back = list(SECRET_NAMES), list[str]()
    ignore = root / IGNORE_FILE
    if ignore.is_file():
        for line in ignore.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                (back if line.startswith("!") else out).append(line.removeprefix("!"))
    return out, back


def code_files(root: Path, leave_out: Path | None) -> list[Path]:
    out, back = _ignored(root)
    root, skipped = root.resolve(), leave_out.resolve() if leave_out else None
    found = []
    for path in sorted(root.rglob("*")):
        if skipped is not None and path.is_relative_to(skipped):
            continue
        rel = path.relative_to(root)
        parts = rel.parts
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts) or path.name.endswith(SKIPPED_SUFFIXES):
            continue
        names = (rel.as_posix(), path.name)
        matches = any(fnmatch.fnmatch(n, pat) for n in names for pat in out)
        if matches and not any(fnmatch.fnmatch(n, pat) for n in names for pat in back):
            continue
        if path.is_file() and not path.is_symlink():
            found.append(path)
    return found


def pack(
    root: Path, field: str = "training.entrypoint", leave_out: Path | None = None
) -> tuple[bytes, tuple[str, ...]]:
    """A reproducible tar.gz of `root` (hidden paths, caches and virtualenvs left out), and what it
    holds as relative paths: one walk, so what is listed for review is exactly what is packed."""
    raw = io.BytesIO()
    listed = []
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        total = 0
        for path in code_files(root, leave_out):
            data = path.read_bytes()
            total += len(data)
            if total > MAX_BUNDLE_BYTES:
                raise SpecError(
                    [
                        f"{field}: {root} holds over {MAX_BUNDLE_BYTES // 2**20} MB of files. Fix: keep the "
                        f"training code in its own directory, or leave files out with {IGNORE_FILE}; read "
                        "data from the store or DLINFRA_DATA_DIR"
                    ]
                )
            listed.append(path.relative_to(root.resolve()).as_posix())
            info = tarfile.TarInfo(listed[-1])
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue(), tuple(listed)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def materialize(store: RunStore, sha256: str, entrypoint: str, work: Path) -> str:
    """Unpack the bundle into the node's work dir; the entrypoint as a path a node can import."""
    file_name, _, func = entrypoint.rpartition(":")
    return f"{unpack(store, sha256, work) / file_name}:{func}"


def extract_safely(tar: tarfile.TarFile, dest: Path) -> None:
    """Every member inside `dest`, or none: no absolute path, no '..', no link or device. Pythons
    without tarfile's `data` filter (3.11 before 3.11.4: Debian 12's, so some images') get the same
    refusal from the check below; it is stricter (no links at all) and dlinfra packs none."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
            raise StoreError(f"{member.name}: not a plain file or directory inside the archive; refused")
    tar.extractall(dest)  # every member was checked above


def unpack(store: RunStore, sha256: str, work: Path) -> Path:
    """The bundle's files in the node's work dir (unpacked once per node and bundle)."""
    target = work / f"code-{sha256[:12]}"
    if not target.exists():
        partial = work / f".code-{sha256[:12]}.partial"
        shutil.rmtree(partial, ignore_errors=True)  # an earlier life's half-done unpacking
        partial.mkdir(parents=True)
        try:
            with tarfile.open(fileobj=io.BytesIO(store.bundle(sha256)), mode="r:gz") as tar:
                unpacked = sum(m.size for m in tar.getmembers())  # sizes from headers, before writing
                if unpacked > MAX_BUNDLE_BYTES:
                    raise StoreError(
                        f"code bundle {sha256[:12]} unpacks to {unpacked} bytes, over the "
                        f"{MAX_BUNDLE_BYTES // 2**20} MB a bundle may hold. Fix: deploy again from the code"
                    )
                extract_safely(tar, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        partial.replace(target)
    return target

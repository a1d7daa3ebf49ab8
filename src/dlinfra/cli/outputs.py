"""Files and directories a command writes where the user said (`render --out`, `plan --markdown`,
`compare --plot`, `init PATH`). Each path is checked before any work starts, and written beside its
target then renamed into place: a bad path is one message naming the option (exit 2), and a failure
never leaves half a file or half a directory of node files behind."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dlinfra.errors import DlinfraError


def _refuse(option: str, path: Path, why: str, fix: str) -> DlinfraError:
    return DlinfraError(f"{option} {path}: {why}. Fix: {fix}")


def _unwritable(option: str, path: Path, where: Path, exc: OSError) -> DlinfraError:
    reason = exc.strerror or type(exc).__name__
    # absolute: "cannot write in ." would not say where the shell was
    place = where.absolute()
    return _refuse(option, path, f"cannot write in {place} ({reason})", "choose a place you can write to")


def _in_place(path: Path) -> bool:
    """A device, a pipe or a symlink (`--markdown /dev/stdout`) is written through, never replaced."""
    return path.is_symlink() or (path.exists() and not path.is_file())


def _staged(where: Path, name: str, suffix: str = "", directory: bool = False) -> Path:
    """A new, unique, hidden path in `where`. Made with os.open/os.mkdir rather than tempfile's, so
    the umask decides its mode as it would the target's (tempfile's 0600/0700 would outlive the
    rename)."""
    for _ in range(100):
        path = where / f".{name}.{secrets.token_hex(4)}{suffix}"
        try:
            if directory:
                os.mkdir(path)
            else:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free name in {where}")


def _probe(option: str, path: Path, where: Path) -> None:
    # Only trying tells: /proc and /sys refuse even root, whatever their permission bits say.
    try:
        os.unlink(_staged(where, "dlinfra-probe"))
    except OSError as exc:
        raise _unwritable(option, path, where, exc) from None


def check_file(path: Path, option: str, example: str, suffix: str | None = None) -> None:
    """Refuse, before any work, a file path that cannot be written: a directory, a missing or
    unwritable directory to put it in, or (with `suffix`) a name of another kind."""
    if path.is_dir():
        raise _refuse(option, path, "is a directory", f"name a file, e.g. {path / example}")
    if suffix and path.suffix.lower() != suffix:
        raise _refuse(option, path, f"not a {suffix} file", f"end its name with {suffix}, e.g. {example}")
    if _in_place(path):
        return
    parent = path.parent
    if not parent.exists():
        raise _refuse(option, path, f"{parent} does not exist", f"mkdir -p {parent}, or choose another path")
    if not parent.is_dir():
        raise _refuse(option, path, f"{parent} is not a directory", "choose another path")
    _probe(option, path, parent)


@contextmanager
def new_file(path: Path, option: str) -> Iterator[Path]:
    """A path beside `path` (same suffix) for the caller to write, after `check_file`; moved onto
    `path` once the block ends without an error, removed otherwise."""
    through = _in_place(path)
    where = Path(tempfile.gettempdir()) if through else path.parent
    try:
        staged = _staged(where, path.name, path.suffix)
    except OSError as exc:
        raise _unwritable(option, path, path.parent, exc) from None
    try:
        yield staged
        if through:  # not shutil.copyfile: it refuses a pipe, which /dev/stdout often is
            path.write_bytes(staged.read_bytes())
        else:
            os.replace(staged, path)
    except OSError as exc:
        raise _unwritable(option, path, path.parent, exc) from None
    finally:
        staged.unlink(missing_ok=True)


def write_file(path: Path, option: str, text: str) -> None:
    with new_file(path, option) as staged:
        staged.write_text(text, encoding="utf-8")


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (`path` itself, or an ancestor)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return missing
        missing = candidate
    return missing


def check_dir(path: Path, option: str) -> None:
    """Refuse, before any work, a directory path that cannot be made: a file, an ancestor that is a
    file, or a place nothing can be written (missing parents are fine: they are made)."""
    if path.exists() and not path.is_dir():
        raise _refuse(option, path, "is a file, not a directory", "name a directory (made if missing)")
    missing = _first_missing(path)
    where = path if missing is None else missing.parent
    if not where.is_dir():
        raise _refuse(option, path, f"{where} is not a directory", "choose another path")
    _probe(option, path, where)


@contextmanager
def new_dir(path: Path, option: str) -> Iterator[Path]:
    """A directory for the caller to fill; its files land in `path` once the block ends without an
    error. A new `path` (and any missing parents) appears whole, by one rename; into an existing one,
    each file is renamed in. Nothing is left behind on an error."""
    check_dir(path, option)
    missing = _first_missing(path)
    where = path if missing is None else missing.parent
    try:
        stage = _staged(where, (missing or path).name, directory=True)
    except OSError as exc:
        raise _unwritable(option, path, where, exc) from None
    inner = stage if missing is None else stage / path.relative_to(missing)
    try:
        inner.mkdir(parents=True, exist_ok=True)
        yield inner
        if missing is None:
            items = sorted(inner.iterdir())
            taken = [path / item.name for item in items if (path / item.name).is_dir()]
            if taken:  # checked before any file moves: a clash leaves the directory as it was
                raise _refuse(option, path, f"{taken[0]} is a directory", "remove it, or choose another path")
            for item in items:
                os.replace(item, path / item.name)
        else:
            os.rename(stage, missing)
    except OSError as exc:
        raise _unwritable(option, path, where, exc) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)

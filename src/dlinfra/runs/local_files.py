"""The files of a node's own directory that may leave it for the store (a script's model, checkpoint
and TensorBoard directories, issue 55 class 1).

A script writes these directories, so what is in them is not trusted: a symlink may name any file on
the node, a FIFO blocks its reader forever, a sparse file reads as its full length. Only regular files
under the directory go: a link to a regular file inside it goes as that file, a link that leaves it
is refused with a line naming it, and a special file (FIFO, socket, device) is skipped. A file is
opened one path component at a time with O_NOFOLLOW from the directory down, so a link swapped in
after the look (the script still runs while its checkpoints sync) makes the open fail, never leave.
A directory's files count by their apparent size (what a read of a sparse file yields, and so what
the store would receive) against a cap, `training.outputs_max_gb`."""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from dlinfra.errors import StoreError
from dlinfra.spec.input import shown

GB = 1_000_000_000
MAX_LINES = 20


class OutputsTooBig(StoreError):
    """A directory's files add up to more than the cap: the verdict names the cap and the fix."""


@dataclass(frozen=True)
class LocalFile:
    rel: str  # its key under the directory's prefix ('/'-separated)
    source: str  # what is opened, relative to the directory: rel, or where an inside link leads
    size: int  # apparent size: a sparse file's full length
    mtime_ns: int


@dataclass
class Listing:
    files: list[LocalFile] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line per link out or special file

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def regular_files(root: Path, what: str) -> Listing:
    """The regular files under `root` (`what` names the directory in the lines, e.g. DLINFRA_MODEL_DIR)."""
    listing = Listing()
    if root.is_symlink():
        listing.refused.append(f"{what} is itself a link: refused, nothing of it uploaded")
        return listing
    if not root.is_dir():
        return listing
    real = os.path.realpath(root)
    _walk(real, real, "", what, listing)
    if len(listing.refused) > MAX_LINES:  # the result names a few; a million links are not a million lines
        more = len(listing.refused) - MAX_LINES
        listing.refused[MAX_LINES:] = [f"{what}: {more} more links out or special files: refused or skipped"]
    return listing


def _walk(real: str, directory: str, prefix: str, what: str, listing: Listing) -> None:
    # a stack, not recursion: a script may nest its directories deeper than Python's recursion limit
    todo = [(directory, prefix)]
    while todo:
        folder, above = todo.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name, reverse=True)
        except OSError:  # removed meanwhile (a checkpoint manager's max_to_keep)
            continue
        for entry in entries:
            rel = above + entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append((entry.path, rel + "/"))
            elif stat.S_ISREG(st.st_mode):
                listing.files.append(LocalFile(rel, rel, st.st_size, st.st_mtime_ns))
            elif stat.S_ISLNK(st.st_mode):
                _link(real, entry.path, rel, what, listing)
            else:
                listing.refused.append(
                    f"{what}: {shown(rel)} is not a regular file (a FIFO, socket or device): skipped"
                )


def _link(real: str, path: str, rel: str, what: str, listing: Listing) -> None:
    target = os.path.realpath(path)
    if os.path.commonpath([real, target]) != real:
        listing.refused.append(f"{what}: {shown(rel)} is a link out of it: refused, not uploaded")
        return
    try:
        st = os.stat(target, follow_symlinks=False)
    except OSError:
        return  # a dangling link names nothing to send
    if stat.S_ISREG(st.st_mode):
        listing.files.append(LocalFile(rel, os.path.relpath(target, real), st.st_size, st.st_mtime_ns))
    elif not stat.S_ISDIR(st.st_mode):
        listing.refused.append(f"{what}: {shown(rel)} is a link to a special file: skipped")
    # a link to a directory inside is not followed: its files are sent under their own names


class Sink(Protocol):
    def put_opened(self, key: str, fh: BinaryIO, tags: dict[str, str] | None = None) -> None: ...


def upload(store: Sink, local: Path, prefix: str, what: str, cap_gb: float | None = None) -> Listing:
    """The regular files under `local` into `prefix` of the store, none of them once they add up to
    more than `cap_gb`; what was refused or skipped is in the listing."""
    listing = regular_files(local, what)
    check_cap(listing, cap_gb, what)
    for found in listing.files:
        if (fh := open_beneath(local, found.source)) is not None:
            with fh:
                store.put_opened(f"{prefix}/{found.rel}", bounded(fh, found.size))
    return listing


def check_cap(listing: Listing, cap_gb: float | None, what: str) -> None:
    if cap_gb is not None and listing.size > cap_gb * GB:
        raise OutputsTooBig(
            f"the script's {what} holds {listing.size / GB:.3g} GB (sparse files count by their full "
            f"length), more than training.outputs_max_gb ({cap_gb:g} GB): nothing more of it was "
            f"uploaded. Fix: write less there, or raise training.outputs_max_gb"
        )


def open_beneath(root: Path, source: str) -> BinaryIO | None:
    """`source` under `root` opened for reading with no link followed on the way, or None when it is
    no longer a regular file there."""
    parts = source.split("/")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)  # the directory itself swapped for a link: no
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        # O_NONBLOCK: a FIFO swapped in opens at once instead of waiting for a writer
        opened = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(opened).st_mode):
        os.close(opened)
        return None
    os.set_blocking(opened, True)
    return os.fdopen(opened, "rb")


def bounded(fh: BinaryIO, size: int) -> BinaryIO:
    return io.BufferedReader(Bounded(fh, size))


class Bounded(io.RawIOBase):
    """At most `size` bytes of `fh` (the size the cap counted): a file that grows while it is sent is
    sent as it was listed, and sent again, whole, at the next sync."""

    def __init__(self, fh: BinaryIO, size: int):
        self.fh, self.left, self.size = fh, size, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.left <= 0:
            return 0
        view = memoryview(buffer)[: self.left]
        got = self.fh.readinto(view)  # type: ignore[attr-defined]
        self.left -= got or 0
        return got or 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        # boto3 rewinds a body to retry it; only a rewind to the start is needed
        if whence == os.SEEK_END:
            offset = self.size + offset
        elif whence == os.SEEK_CUR:
            offset = self.size - self.left + offset
        self.fh.seek(offset)
        self.left = self.size - offset
        return offset

    def tell(self) -> int:
        return self.size - self.left


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists (a writer whose part may still be in progress)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True

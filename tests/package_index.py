"""A private package index for tests: real pure-Python wheels written by hand (`build_wheel`, no build
backend, no network) and a PEP 503 simple index serving them on loopback (`PackageIndex`), which can
publish and unpublish while it serves, so a test can make pip or uv resolve, lock and install from a
world it controls (a new release appears, one is yanked outright) and see what they fetched.

Layout under the index's root, as served from `http://127.0.0.1:PORT/`:

    simple/index.html                  every project (PEP 503)
    simple/<normalized>/index.html     its wheels: `<a href="../../files/W.whl#sha256=HEX"
                                       data-core-metadata="sha256=HEX" ...>` (PEP 658/714)
    files/W.whl, files/W.whl.metadata  the wheel and its METADATA, for resolvers that take it (uv, pip)

Tests take it as `with PackageIndex(tmp_path) as index:` or, in a conftest, as the fixture:
`from package_index import package_index_fixture  # noqa: F401` gives tests `package_index`."""

from __future__ import annotations

import base64
import hashlib
import html
import os
import re
import shutil
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# Every entry's timestamp (zip's earliest): the same inputs give the same bytes, so the same sha256.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_GENERATOR = "dlinfra-tests-package-index (1.0)"


def normalize(name: str) -> str:
    """A project's name as PEP 503 compares it (and as its page's path spells it)."""
    return canonicalize_name(name, validate=True)


def _escaped(name: str) -> str:
    """A name as wheel filenames and `.dist-info` directories spell it (the binary distribution format)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wheel_filename(name: str, version: str, tag: str = "py3-none-any") -> str:
    return f"{_escaped(name)}-{str(Version(version)).replace('-', '_')}-{tag}.whl"


def _metadata(name: str, version: str, requires: Sequence[str]) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {Version(version)}"]
    lines += [f"Requires-Dist: {Requirement(r)}" for r in requires]  # validated, in their canonical form
    return ("\n".join(lines) + "\n").encode()


def _entries(
    name: str, version: str, modules: Mapping[str, str], requires: Sequence[str], tag: str
) -> dict[str, bytes]:
    """The wheel's files but RECORD, by archive path."""
    dist_info = f"{_escaped(name)}-{Version(version)}.dist-info"
    entries: dict[str, bytes] = {}
    for path, text in modules.items():
        parts = PurePosixPath(path).parts
        if not parts or path.startswith("/") or ".." in parts or "\\" in path or parts[0] == dist_info:
            raise ValueError(f"not a module path inside a wheel: {path!r}")
        entries[str(PurePosixPath(path))] = text.encode()
    entries[f"{dist_info}/METADATA"] = _metadata(name, version, requires)
    entries[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: {_GENERATOR}\nRoot-Is-Purelib: true\nTag: {tag}\n"
    ).encode()
    return entries


def build_wheel(
    out_dir: Path,
    name: str,
    version: str,
    modules: Mapping[str, str],
    requires: Sequence[str] = (),
    tag: str = "py3-none-any",
) -> Path:
    """Writes `{name}-{version}-{tag}.whl` into `out_dir` (made if missing) and returns it.

    `modules` maps archive paths (`pkg/__init__.py`) to their text; `requires` are Requires-Dist
    requirements (`other>=1`, `extra; python_version < "3.12"`); `tag` is the wheel's compatibility
    tag (`py3-none-manylinux_2_31_x86_64`: a wheel for glibc 2.31 or newer). The same arguments give
    the same bytes."""
    entries = _entries(name, version, modules, requires, tag)
    dist_info = f"{_escaped(name)}-{Version(version)}.dist-info"
    record = f"{dist_info}/RECORD"
    rows = [f"{path},{_record_hash(data)},{len(data)}" for path, data in sorted(entries.items())]
    entries[record] = ("\n".join([*rows, f"{record},,"]) + "\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / wheel_filename(name, version, tag)
    partial = wheel.with_name(f".{wheel.name}.{os.getpid()}.{threading.get_ident()}.partial")
    with zipfile.ZipFile(partial, "w") as archive:
        # modules first, .dist-info last (RECORD the very last), as installers prefer
        for path in sorted(entries, key=lambda p: (p.startswith(dist_info), p == record, p)):
            info = zipfile.ZipInfo(path, date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100644 & 0xFFFF) << 16  # a regular file, rw-r--r--
            info.create_system = 3  # Unix, whatever builds it
            archive.writestr(info, entries[path])
    os.replace(partial, wheel)  # whole or not at all, for a server reading the directory
    return wheel


def wheel_metadata(wheel: Path) -> bytes:
    """The METADATA a wheel carries (what PEP 658 serves next to it)."""
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        return archive.read(path)


@dataclass(frozen=True)
class Published:
    name: str  # as published (the index shows it so)
    version: str
    wheel: Path
    sha256: str
    metadata_sha256: str


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _page(title: str, links: Sequence[str]) -> bytes:
    body = "\n".join(f"    {link}<br/>" for link in links)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n"
    ).encode()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up is no news
            super().handle_error(request, client_address)


class PackageIndex:
    """A PEP 503 simple index on `host` (127.0.0.1 unless a VM must reach it too; a port of its
    own), serving from `root` (a temporary directory, removed on exit, when not given) in a
    background thread until the `with` ends."""

    def __init__(self, root: Path | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="package-index-")) if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        self.files = self.root / "files"
        self.files.mkdir(exist_ok=True)
        self.published: dict[str, dict[str, Published]] = {}  # normalized name → version → wheel
        self.requests: list[str] = []  # every GET/HEAD path served, in order
        self._lock = threading.Lock()
        self._rewrite_pages()
        self.server = _QuietServer((host, 0), self._handler())
        self.port: int = self.server.server_address[1]  # bound already: no race for it
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), name="package-index", daemon=True
        )
        self._started = False

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def url(self) -> str:
        """What `--index-url` takes."""
        return f"{self.base_url}simple/"

    def __enter__(self) -> PackageIndex:
        self._thread.start()
        self._started = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._started:
            self.server.shutdown()
            self._thread.join(timeout=10)
            self._started = False
        self.server.server_close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def publish(
        self,
        name: str,
        version: str,
        modules: Mapping[str, str],
        requires: Sequence[str] = (),
        tag: str = "py3-none-any",
    ) -> Path:
        """Builds the wheel into the index and lists it (replacing a wheel of the same version)."""
        with self._lock:
            wheel = build_wheel(self.files, name, version, modules, requires, tag)
            metadata = wheel_metadata(wheel)
            _write_atomically(wheel.with_name(wheel.name + ".metadata"), metadata)
            entry = Published(
                name, str(Version(version)), wheel, sha256_of(wheel), hashlib.sha256(metadata).hexdigest()
            )
            self.published.setdefault(normalize(name), {})[entry.version] = entry
            self._rewrite_pages()
            return wheel

    def unpublish(self, name: str, version: str) -> None:
        """Takes the wheel off the index (its page first, then its files); a project left with no
        wheel leaves the index (its page answers 404, as an unknown project's does)."""
        with self._lock:
            project = normalize(name)
            entry = self.published.get(project, {}).pop(str(Version(version)), None)
            if entry is None:
                raise KeyError(f"{name} {version} is not published")
            if not self.published[project]:
                del self.published[project]
            self._rewrite_pages()
            entry.wheel.with_name(entry.wheel.name + ".metadata").unlink(missing_ok=True)
            entry.wheel.unlink(missing_ok=True)

    def sha256(self, name: str, version: str) -> str:
        return self.published[normalize(name)][str(Version(version))].sha256

    def fetched(self, suffix: str) -> list[str]:
        """The request paths served that end with `suffix` (e.g. a wheel's filename)."""
        return [path for path in list(self.requests) if path.split("#")[0].split("?")[0].endswith(suffix)]

    def _rewrite_pages(self) -> None:
        simple = self.root / "simple"
        listed = {project: next(iter(versions.values())).name for project, versions in self.published.items()}
        for stale in simple.glob("*/") if simple.is_dir() else ():
            if stale.name not in listed:
                shutil.rmtree(stale, ignore_errors=True)
        for project, versions in sorted(self.published.items()):
            links = []
            for entry in sorted(versions.values(), key=lambda e: Version(e.version)):
                href = html.escape(f"../../files/{entry.wheel.name}#sha256={entry.sha256}")
                meta = f"sha256={entry.metadata_sha256}"
                links.append(
                    f'<a href="{href}" data-core-metadata="{meta}" data-dist-info-metadata="{meta}">'
                    f"{html.escape(entry.wheel.name)}</a>"
                )
            _write_atomically(simple / project / "index.html", _page(f"Links for {listed[project]}", links))
        root_links = [f'<a href="{p}/">{html.escape(listed[p])}</a>' for p in sorted(listed)]
        _write_atomically(simple / "index.html", _page("Simple index", root_links))

    def _handler(self) -> type[SimpleHTTPRequestHandler]:
        owner = self
        root = str(self.root)

        class Handler(SimpleHTTPRequestHandler):
            extensions_map = {
                **SimpleHTTPRequestHandler.extensions_map,
                ".whl": "application/octet-stream",
                ".metadata": "application/octet-stream",
            }

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=root, **kwargs)

            def _served(self) -> None:
                owner.requests.append(self.path)
                # always the current pages: no 304 for a page rewritten within the same second
                for header in ("If-Modified-Since", "If-None-Match"):
                    del self.headers[header]

            def do_GET(self) -> None:
                self._served()
                super().do_GET()

            def do_HEAD(self) -> None:
                self._served()
                super().do_HEAD()

            def end_headers(self) -> None:
                self.send_header("Cache-Control", "no-cache, no-store, max-age=0")
                super().end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        return Handler


@pytest.fixture(name="package_index")
def package_index_fixture(tmp_path: Path) -> Iterator[PackageIndex]:
    """A running, empty `PackageIndex` for one test, rooted in its tmp_path."""
    with PackageIndex(tmp_path / "package-index") as index:
        yield index

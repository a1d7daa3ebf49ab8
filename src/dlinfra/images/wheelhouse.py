"""The wheels a node environment is made of, downloaded once on the deploying machine: copied into
a local image build, or served as a PEP 503 index to VMs that install at boot (no VM needs the
internet, only the host's loopback)."""

from __future__ import annotations

import hashlib
import html
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dlinfra.errors import DlinfraError
from dlinfra.images import images_home


def wheelhouse(requirements: list[str]) -> Path:
    """Every wheel `requirements` need (pip's resolution on this machine, whose Python and platform
    the Debian images share), cached by the requirements; local wheel files count by content."""
    key = hashlib.sha256()
    for req in requirements:
        path = Path(req.split("[", 1)[0])
        part = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else req
        key.update(part.encode() + b"\0")
    out = images_home() / "wheelhouse" / key.hexdigest()[:16]
    if (out / "simple").is_dir():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(out)]
    result = subprocess.run([*cmd, *requirements], capture_output=True, text=True)
    if result.returncode != 0:
        raise DlinfraError(
            f"could not download the node's wheels ({' '.join(requirements)}):\n{result.stderr[-2000:]}\n"
            "Fix: this machine needs PyPI (or a mirror in pip's config) for the first build"
        )
    _write_index(out)
    return out


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _write_index(root: Path) -> None:
    """simple/<project>/index.html per PEP 503, each link with its sha256 (pip checks it)."""
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(root.glob("*.whl")):
        projects.setdefault(_normalize(wheel.name.split("-", 1)[0]), []).append(wheel)
    for project, wheels in projects.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../{html.escape(w.name)}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
            f"{html.escape(w.name)}</a>\n"
            for w in wheels
        )
        page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n", encoding="utf-8")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serve(root: Path, host: str = "127.0.0.1") -> Iterator[int]:
    """Serve `root` read-only on `host` (a free port, yielded) while the block runs."""
    server = ThreadingHTTPServer((host, 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()

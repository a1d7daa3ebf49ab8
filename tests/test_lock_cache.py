"""Locks cached by their inputs (environment/lock_cache.py): every command takes them and says when
they were resolved; a refresh (--refresh-lock) resolves anew while the index answers, and takes
them, saying so, only when it does not. The index is a closed port (nothing answers) or an empty one
of our own (it answers: no such package): any resolution here fails, so what succeeds was cached."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dlinfra.environment import lock_cache
from dlinfra.environment.lock import Index, IndexUnreachable, Platform
from dlinfra.errors import DlinfraError, SpecError

CLOSED = Index(url="http://127.0.0.1:9/simple")
TARGET = Platform("3.11", "x86_64")
TEXT = "numpy==2.1.0 \\\n    --hash=sha256:00\n"


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """dlinfra's lock cache and uv's own, both empty."""
    monkeypatch.setenv("DLINFRA_CACHE", str(tmp_path / "dlinfra"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv"))
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # a closed port fails at once
    return tmp_path / "dlinfra"


@pytest.fixture
def empty_index(tmp_path: Path) -> Iterator[Index]:
    """A package index that answers every request, with a 404: it holds nothing."""
    root = tmp_path / "index"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Index(url=f"http://127.0.0.1:{server.server_address[1]}/simple")
    server.shutdown()
    server.server_close()


def leave(cache: Path, *args: object) -> None:
    """What an earlier deploy on this machine left for these inputs."""
    (cache / "locks").mkdir(parents=True, exist_ok=True)
    (cache / "locks" / f"{lock_cache._key(*args)}.lock").write_text(TEXT)  # type: ignore[arg-type]


def test_the_lock_resolved_before_for_the_same_inputs_answers_and_says_when(caches: Path) -> None:
    args = ("==0.1.0", ["numpy"], "cpu", TARGET, CLOSED, True)
    with pytest.raises(DlinfraError):  # nothing cached: it resolves
        lock_cache.locked(*args, fresh=False)  # type: ignore[arg-type]
    leave(caches, *args)
    lock = lock_cache.locked(*args, fresh=False)  # type: ignore[arg-type]
    assert lock.text == TEXT
    assert lock.note.startswith("the lock this machine resolved for the same inputs on 20")
    assert lock.note.endswith("UTC (--refresh-lock resolves anew)")
    other = ("==0.1.0", ["numpy<2"], "cpu", TARGET, CLOSED, True)
    assert lock_cache._key(*other) != lock_cache._key(*args)  # type: ignore[arg-type]


def test_a_refresh_resolves_anew_while_the_index_answers_even_with_a_lock_cached(
    caches: Path, empty_index: Index
) -> None:
    args = ("==0.1.0", ["numpy"], "cpu", TARGET, empty_index, True)
    leave(caches, *args)
    with pytest.raises(SpecError, match="no environment satisfies them"):  # the index's answer, not the cache
        lock_cache.locked(*args, fresh=True)  # type: ignore[arg-type]


def test_an_offline_refresh_takes_the_cached_lock_for_the_same_inputs_and_says_so(caches: Path) -> None:
    args = ("==0.1.0", ["numpy"], "cpu", TARGET, CLOSED, True)
    # nothing cached, uv's cache cold: the index is named, not the requirements (they may be fine)
    with pytest.raises(IndexUnreachable, match="could not reach the package index") as raised:
        lock_cache.locked(*args, fresh=True)  # type: ignore[arg-type]
    assert "no environment satisfies" not in str(raised.value)
    assert "Fix: check the network" in str(raised.value)
    leave(caches, *args)
    lock = lock_cache.locked(*args, fresh=True)  # type: ignore[arg-type]
    assert lock.text == TEXT
    assert "did not answer (http://127.0.0.1:9/simple)" in lock.note
    assert "the lock this machine resolved for the same inputs on 20" in lock.note
    other = ("==0.1.0", ["numpy<2"], "cpu", TARGET, CLOSED, True)  # another input: not that lock
    with pytest.raises(IndexUnreachable):
        lock_cache.locked(*other, fresh=True)  # type: ignore[arg-type]


def _wheel(path: Path, module: str, requires: list[str]) -> str:
    import zipfile

    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr("pkg/__init__.py", module)
        headers = ["Metadata-Version: 2.3", "Name: dlinfra", "Version: 0.1.0"]
        headers += [f"Requires-Dist: {r}" for r in requires]
        zipped.writestr("dlinfra-0.1.0.dist-info/METADATA", "\n".join(headers) + "\n\nthe README\n")
    return str(path)


def test_a_checkouts_wheel_keys_its_lock_by_its_dependencies_not_its_code(tmp_path: Path) -> None:
    """An edit of a checkout's code makes a new wheel: its lock is the one before. A changed dependency
    in pyproject.toml is a new lock."""
    rest = (["numpy"], "cpu", TARGET, CLOSED, False)
    first = lock_cache._key(_wheel(tmp_path / "a.whl", "A = 1", ["tensorflow==2.21"]), *rest)  # type: ignore[arg-type]
    edited = lock_cache._key(_wheel(tmp_path / "b.whl", "A = 2", ["tensorflow==2.21"]), *rest)  # type: ignore[arg-type]
    bumped = lock_cache._key(_wheel(tmp_path / "c.whl", "A = 1", ["tensorflow==2.22"]), *rest)  # type: ignore[arg-type]
    assert first == edited
    assert bumped != first

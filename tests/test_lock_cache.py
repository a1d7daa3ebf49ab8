"""Locks cached by their inputs (environment/lock_cache.py): validate answers from them, plan and
deploy never do. The index is a closed port: any resolution here fails, so what succeeds was cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlinfra.environment import lock_cache
from dlinfra.environment.lock import Index, Platform
from dlinfra.errors import DlinfraError

CLOSED = Index(url="http://127.0.0.1:9/simple")
TARGET = Platform("3.11", "x86_64")
TEXT = "numpy==2.1.0 \\\n    --hash=sha256:00\n"


def test_validate_answers_from_the_lock_resolved_before_and_deploy_resolves_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINFRA_CACHE", str(tmp_path))
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # a closed port fails at once
    args = ("==0.1.0", ["numpy"], "cpu", TARGET, CLOSED, True)
    with pytest.raises(DlinfraError):  # nothing cached: validate resolves too
        lock_cache.locked(*args, fresh=False)  # type: ignore[arg-type]
    key = lock_cache._key(*args)  # type: ignore[arg-type]
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / f"{key}.lock").write_text(TEXT)  # what an earlier deploy left
    assert lock_cache.locked(*args, fresh=False).text == TEXT  # type: ignore[arg-type]
    with pytest.raises(DlinfraError):
        lock_cache.locked(*args, fresh=True)  # type: ignore[arg-type]
    other = ("==0.1.0", ["numpy<2"], "cpu", TARGET, CLOSED, True)
    assert lock_cache._key(*other) != key  # type: ignore[arg-type]

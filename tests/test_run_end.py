"""How soon a run's end is seen by those that wait for it: the servers of a parameter-server cluster
and the command that watches the run, at the pace their store allows (Store.poll_seconds)."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState
from dlinfra.runs.store_url import open_store
from support import FAKE_CREDS, aws_client


def _store(backend: str, tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    if backend == "file":
        return RunStore(open_store(f"file://{tmp_path / 'store'}"))
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    aws_client(moto_endpoint, "s3").create_bucket(Bucket="pace")
    return RunStore(open_store("s3://pace/runs/r", endpoint_url=moto_endpoint))


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_a_server_looks_for_the_runs_end_at_its_stores_pace(
    backend: str, tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local run's command waits for its servers to leave: they read a local directory every 0.2 s.
    Against S3, where each request is billed and counted against the prefix's rate, every 3 s."""
    from dlinfra.node import membership

    store = _store(backend, tmp_path, moto_endpoint, monkeypatch)
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the server's clock only: moto's threads keep the real one
        waits.append(seconds)
        if len(waits) == 2:
            store.write_marker("DONE", node="chief-0")

    monkeypatch.setattr(membership, "time", types.SimpleNamespace(sleep=sleep, time=time.time))
    assert membership.until_the_run_ends(store).marker == "DONE"
    assert waits == ([0.2, 0.2] if backend == "file" else [3.0, 3.0])


def _node(name: str, state: str) -> NodeState:
    now = time.time()
    return NodeState(
        node=name, role=name[:-2], index=0, state=state, started=now, first_started=now, heartbeat=now
    )


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_the_watch_looks_more_often_once_the_chief_exports_where_its_store_allows(
    backend: str, tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training is watched every second; the second or so from the chief's export to the run's end,
    which the user waits for, at a local store's pace. An S3 store is not asked more often."""
    from dlinfra.watching import Snapshot, _pace

    store = _store(backend, tmp_path, moto_endpoint, monkeypatch)
    training = Snapshot({"chief-0": _node("chief-0", "training"), "ps-0": None}, None, 9.0)
    exporting = Snapshot(
        {"chief-0": _node("chief-0", "exporting"), "ps-0": _node("ps-0", "serving")}, None, 12.0
    )
    assert _pace(training, 1.0, store) == 1.0
    assert _pace(exporting, 1.0, store) == (0.2 if backend == "file" else 1.0)

"""One owner per run: the lease on `owner.json`, raced by real processes on a file store and held
against moto's S3 (its conditional writes)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from dlinfra.runs import ownership
from dlinfra.runs.layout import RunStore
from dlinfra.runs.ownership import Lease, claim
from dlinfra.runs.records import Owner
from dlinfra.runs.store import Store
from support import FAKE_CREDS, aws_client


def _race(url: str, who: str, start_at: float, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = RunStore(Store.from_url(url))
    time.sleep(max(0.0, start_at - time.time()))
    got = claim(store, "cli", who)
    results.put((who, isinstance(got, Lease)))


def test_claimants_racing_in_separate_processes_leave_exactly_one_owner(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    start_at = time.time() + 3.0  # all at once, once every process has started
    racers = [spawn.Process(target=_race, args=(url, f"cli {i}", start_at, results)) for i in range(6)]
    for p in racers:
        p.start()
    outcomes = dict(results.get(timeout=60) for _ in racers)
    for p in racers:
        p.join(timeout=60)
    winners = [who for who, won in outcomes.items() if won]
    assert len(winners) == 1, outcomes
    owner, _ = RunStore(Store.from_url(url)).owner()
    assert owner is not None and owner.holder == winners[0]


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    if request.param == "file":
        return RunStore(Store.from_url(f"file://{tmp_path}/store"))
    endpoint = request.getfixturevalue("moto_endpoint")
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    bucket = f"lease-{tmp_path.name[-20:].lower().replace('_', '-')}".rstrip("-")
    aws_client(endpoint, "s3").create_bucket(Bucket=bucket)
    return RunStore(Store.from_url(f"s3://{bucket}/runs/r1", endpoint_url=endpoint, region="us-east-1"))


def test_a_live_owner_keeps_the_run_and_a_release_hands_it_on(store: RunStore) -> None:
    first = claim(store, "cli", "cli a")
    assert isinstance(first, Lease)
    second = claim(store, "controller", "controller i-1")
    assert isinstance(second, Owner) and second.holder == "cli a"  # refused: it names the owner
    assert first.renew() and first.held
    again = claim(store, "cli", "cli a")  # the same holder claiming again (a restarted watch loop)
    assert isinstance(again, Lease)
    first.release()  # the older claim was replaced by `again`: its release must not free the run
    assert isinstance(claim(store, "controller", "controller i-1"), Owner)
    again.release(handed_to="controller")
    owner, _ = store.owner()
    assert owner is not None and owner.kind == "none" and owner.handed_to == "controller"
    taken = claim(store, "controller", "controller i-1")
    assert isinstance(taken, Lease) and ownership.owner_of(store) == taken.record


def test_a_silent_owner_loses_the_run_after_its_lease_and_cannot_act_again(store: RunStore) -> None:
    old = claim(store, "cli", "cli laptop", lease_seconds=0.5)
    assert isinstance(old, Lease)
    time.sleep(0.6)  # the laptop slept through its lease
    new = claim(store, "controller", "controller i-1")
    assert isinstance(new, Lease)
    assert not old.renew() and not old.held  # its next renewal finds the run taken
    assert new.renew() and ownership.owner_of(store) == new.record


def test_the_keeper_thread_renews_while_the_holder_is_busy(store: RunStore) -> None:
    lease = claim(store, "cli", "cli a", lease_seconds=1.0)
    assert isinstance(lease, Lease)
    lease.keep(every=0.2)
    time.sleep(1.5)  # longer than the lease: a heal's apply blocking the watch loop
    assert isinstance(claim(store, "controller", "controller i-1"), Owner)
    lease.release()
    assert lease.held is False and isinstance(claim(store, "controller", "controller i-1"), Lease)

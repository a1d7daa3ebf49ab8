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
from dlinfra.runs.store_url import open_store
from support import FAKE_CREDS, aws_client


def _race(url: str, who: str, start_at: float, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = RunStore(open_store(url))
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
    owner, _ = RunStore(open_store(url)).owner()
    assert owner is not None and owner.holder == winners[0]


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    if request.param == "file":
        return RunStore(open_store(f"file://{tmp_path}/store"))
    endpoint = request.getfixturevalue("moto_endpoint")
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    bucket = f"lease-{tmp_path.name[-20:].lower().replace('_', '-')}".rstrip("-")
    aws_client(endpoint, "s3").create_bucket(Bucket=bucket)
    return RunStore(open_store(f"s3://{bucket}/runs/r1", endpoint_url=endpoint, region="us-east-1"))


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
    again.hand_over()
    # reserved for the controller: a CLI watching meanwhile is refused, and follows it
    pending = claim(store, "cli", "cli b")
    assert isinstance(pending, Owner) and pending.holder == ownership.PENDING
    taken = claim(store, "controller", "controller i-1")
    assert isinstance(taken, Lease) and ownership.owner_of(store) == taken.record
    # picked up: a second controller (a replaced one racing the first) no longer may take it
    assert isinstance(claim(store, "controller", "controller i-2"), Owner)
    taken.release()
    owner, _ = store.owner()
    assert owner is not None and owner.kind == "none" and ownership.owner_of(store) is None


def test_a_silent_owner_loses_the_run_after_its_lease_and_cannot_act_again(store: RunStore) -> None:
    old = claim(store, "cli", "cli laptop", lease_seconds=0.5)
    assert isinstance(old, Lease)
    time.sleep(0.6)  # the laptop slept through its lease
    new = claim(store, "controller", "controller i-1")
    assert isinstance(new, Lease)
    assert not old.renew() and not old.held  # its next renewal finds the run taken
    assert new.renew() and ownership.owner_of(store) == new.record


def test_the_keeper_thread_renews_while_the_holder_is_busy(store: RunStore) -> None:
    lease = claim(store, "cli", "cli a", lease_seconds=3.0)
    assert isinstance(lease, Lease)
    lease.keep(every=0.2)
    # the holder does nothing for longer than its lease (a heal's apply blocking the watch loop):
    # wait for a renewal past the first lease's end, however slow this machine is
    deadline = time.monotonic() + 60
    while (owner := store.owner()[0]) is not None and owner.renewed < lease.record.since + 3.5:
        assert time.monotonic() < deadline, "the keeper never renewed"
        time.sleep(0.1)
    assert isinstance(claim(store, "controller", "controller i-1"), Owner)
    lease.release()
    assert lease.held is False and isinstance(claim(store, "controller", "controller i-1"), Lease)


def test_an_act_is_refused_while_another_holder_owns_the_run(store: RunStore) -> None:
    owner = claim(store, "controller", "controller i-1")
    assert isinstance(owner, Lease)
    with (
        pytest.raises(ownership.Owned, match="run r1 is owned by controller i-1"),
        ownership.acting(store, "r1"),
    ):
        pytest.fail("acted on a run another holder owns")
    owner.release()
    with ownership.acting(store, "r1") as lease:
        assert lease is not None and lease.held
    assert ownership.owner_of(store) is None  # given up after the act


def test_an_act_goes_on_when_the_store_is_gone(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dlinfra destroy` of a run whose bucket was deleted: nobody can own it, the destroy must run."""
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    gone = RunStore(
        open_store("s3://no-such-bucket-here/runs/r1", endpoint_url=moto_endpoint, region="us-east-1")
    )
    acted = False
    with ownership.acting(gone, "r1") as lease:
        acted = lease is None
    assert acted

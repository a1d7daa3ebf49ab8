"""Who acts for a run: exactly one owner at a time.

Healing a node, writing a verdict and destroying the stack are acts; following the run's progress is
not. A deploy, a `dlinfra watch` and the account's controller may all follow one run, but only the
holder of the run's lease (`owner.json` in its store) acts. The lease is taken and renewed by a
compare-and-swap on that record (S3's conditional writes; a lock file on a file:// store), so two
claimants racing for it cannot both win, and one that dies loses it after `LEASE_SECONDS`.

A holder renews from a thread of its own: a heal's `terraform apply` may block its watch loop for
minutes, and the run must not look abandoned meanwhile. The Terraform state's own lock
(`use_lockfile`) still guards the state if two holders ever overlapped.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from dlinfra.errors import DlinfraError, StoreError
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import Owner

LEASE_SECONDS = 90.0  # how long a silent holder keeps the run: outlasts a store outage of a minute
# How long a run handed to the controller stays reserved for it: a stopped controller instance boots
# and picks it up within minutes; one that never does leaves the run to whoever watches it next.
HANDOVER_SECONDS = 600.0
PENDING = "controller (handed over, not picked up yet)"
RENEW_SECONDS = 15.0
CLAIM_ATTEMPTS = 5

Kind = Literal["cli", "controller"]


def cli_holder() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"cli {user}@{socket.gethostname()} pid {os.getpid()}"


@dataclass
class Lease:
    """A held claim on a run. `held` turns False once another holder took the run over."""

    store: RunStore
    record: Owner
    version: str | None
    lease_seconds: float = LEASE_SECONDS
    _lost: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _keeper: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return not self._lost.is_set()

    def keep(self, every: float = RENEW_SECONDS) -> Lease:
        """Renew in the background until released."""

        def loop() -> None:
            while not self._done.wait(every) and self.renew():
                pass

        self._keeper = threading.Thread(target=loop, name="dlinfra-lease", daemon=True)
        self._keeper.start()
        return self

    def renew(self) -> bool:
        with self._lock:
            if self._lost.is_set() or self._done.is_set():
                return False
            record = self.record.model_copy(update={"renewed": time.time()})
            if not self._swap(record):
                self._lost.set()
                return False
            return True

    def release(self) -> None:
        """Give the run up: it ended, or it was detached (whoever attaches next owns it)."""
        self._give_up(self.record.model_copy(update={"kind": "none"}))

    def hand_over(self) -> None:
        """Give the run to the account's controller: reserved for it alone (no CLI takes it meanwhile)
        until it claims the run, or for HANDOVER_SECONDS if it never comes."""
        now = time.time()
        pending = Owner(
            kind="controller",
            holder=PENDING,
            token=secrets.token_hex(8),
            since=now,
            renewed=now,
            lease_seconds=HANDOVER_SECONDS,
            handed_to="controller",
        )
        self._give_up(pending)

    def _give_up(self, record: Owner) -> None:
        self._done.set()
        if self._keeper is not None:
            self._keeper.join()
        with self._lock:
            if self._lost.is_set():
                return
            self._swap(record)
            self._lost.set()

    def _swap(self, record: Owner) -> bool:
        if (version := _put(self.store, record, self.version)) is None:
            return False
        self.version, self.record = version, record
        return True


def claim(store: RunStore, kind: Kind, holder: str, lease_seconds: float = LEASE_SECONDS) -> Lease | Owner:
    """Take the run's lease if it is free, released, expired or already this holder's (or, for a
    controller, handed over to the controller); else the live owner that holds it."""
    for _ in range(CLAIM_ATTEMPTS):
        current, version = store.owner()
        now = time.time()
        mine = current is not None and (
            current.holder == holder or (kind == "controller" and current.handed_to == "controller")
        )
        if current is not None and not mine and current.live(now):
            return current
        record = Owner(
            kind=kind,
            holder=holder,
            token=secrets.token_hex(8),
            since=now,
            renewed=now,
            lease_seconds=lease_seconds,
        )
        if (written := _put(store, record, version)) is not None:
            return Lease(store, record, written, lease_seconds)
    current, _ = store.owner()
    assert current is not None  # five lost races: someone holds it
    return current


def owner_of(store: RunStore) -> Owner | None:
    """The live owner, if any."""
    current, _ = store.owner()
    return current if current is not None and current.live(time.time()) else None


def _put(store: RunStore, record: Owner, version: str | None) -> str | None:
    """The new version, or None if another writer came first."""
    if (written := store.swap_owner(record, version)) is not None:
        return written
    # a retried write whose first answer was lost fails its own condition: it is ours if the record
    # is the one we wrote
    now, now_version = store.owner()
    return now_version if now == record else None


class Owned(DlinfraError):
    """Another holder acts for the run."""

    def __init__(self, run_id: str, owner: Owner):
        super().__init__(
            f"run {run_id} is owned by {owner.holder}, which heals it and tears it down when it ends. "
            "Fix: let it, or stop that owner first (its lease lapses 90 s after it is gone)"
        )
        self.owner = owner


@contextmanager
def acting(store: RunStore, run_id: str, kind: Kind = "cli") -> Iterator[Lease | None]:
    """Hold the run's lease for one act (`dlinfra destroy`); refuse if another holder has it. A store
    that cannot be read (its bucket deleted, credentials for it expired) holds no owner either: the
    act goes on without a lease, as the command that removes what costs money must (Terraform's own
    state lock still keeps two destroys apart)."""
    try:
        got = claim(store, kind, cli_holder() if kind == "cli" else kind)
    except StoreError:
        yield None
        return
    if isinstance(got, Owner):
        raise Owned(run_id, got)
    try:
        yield got.keep()
    finally:
        got.release()

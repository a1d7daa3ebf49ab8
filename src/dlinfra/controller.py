"""The account's controller: one long-lived process near the runs (on a small instance of its own,
`dlinfra controller run`) that owns every run handed to it until the run ends: it heals, records
verdicts, enforces limits and tears down with the same watch loop a `deploy` runs, so a run goes on
and ends clean with no laptop watching.

It keeps no memory that matters. Each look at the bucket it lists the hand-overs, takes up those it
does not own yet (runs.handover: the run dir from the store, the lease reserved for it), and owns
each in a thread of its own until the run ends, then drops the hand-over. A controller that died
mid-run, or its replacement, picks the same runs up from the same records once their leases lapse.
With nothing to own for `idle_minutes` it says so in the bucket and stops its own instance: a
stopped instance costs only its disk.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dlinfra.deploy import act_for
from dlinfra.errors import DlinfraError, StoreError
from dlinfra.prepare import Prepared
from dlinfra.runs.handover import POLL_SECONDS, judge, take_up
from dlinfra.runs.layout import RunStore
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.ownership import Lease, claim
from dlinfra.runs.records import ControllerInfo, Handover
from dlinfra.runs.run import home, utc_now
from dlinfra.runs.sealing import key_parameter, read_key
from dlinfra.targets.base import TargetOptions

LOG_SYNC_SECONDS = 30.0


def holder_name(instance_id: str | None) -> str:
    return (
        f"controller {instance_id}" if instance_id else f"controller {socket.gethostname()} pid {os.getpid()}"
    )


@dataclass
class Controller:
    store: ControllerStore
    idle_minutes: float
    instance_id: str | None = None  # its own instance, stopped when idle (None: run by hand)
    stop_instance: Callable[[str], None] = lambda instance_id: None
    poll: float = POLL_SECONDS
    log_file: Path = field(default_factory=lambda: home() / "controller.log")
    # ControllerInfo.emulated, as `setup` registered it: kept in every record the controller writes
    emulated: Literal["process", "vm"] | None = None
    # the hand-over key (runs.sealing); None: read from SSM at the first look that needs it
    key: bytes | None = field(default=None, repr=False)  # never in a repr, a log or a traceback
    _owned: dict[str, threading.Thread] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # what was quarantined (or could not be moved) and said once: never read or said again
    _refused: set[str] = field(default_factory=set)
    _keyless: bool = False  # said once that the key cannot be read
    _unreadable: set[str] = field(default_factory=set)  # runs whose own records did not read: said once

    @property
    def holder(self) -> str:
        return holder_name(self.instance_id)

    def log(self, line: str) -> None:
        stamped = f"{utc_now()} {line}"
        with self._lock, open(self.log_file, "a", encoding="utf-8") as out:
            out.write(stamped + "\n")
        print(stamped, flush=True)

    def run(self) -> str:
        """Own what is handed over until nothing has been for `idle_minutes`; then stop."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(StoreError):
            self.emulated = info.emulated if (info := self.store.info()) else None
        self.log(f"{self.holder}: watching {self.store.uri()} (idle stop after {self.idle_minutes:g} min)")
        idle_since = time.monotonic()
        synced = 0.0
        while True:
            try:
                busy = self._look()
            except StoreError as exc:  # the bucket out of reach for a while: the runs' owners go on
                self.log(f"cannot read {self.store.uri()}: {exc}; looking again in {self.poll:g}s")
                busy = True
            if busy:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= self.idle_minutes * 60 and self._may_stop():
                break
            if time.monotonic() - synced >= LOG_SYNC_SECONDS:
                self._sync_log()
                synced = time.monotonic()
            time.sleep(self.poll)
        said = f"{self.holder}: nothing to own for {self.idle_minutes:g} min: stopping"
        self.log(said)
        self._sync_log()
        if self.instance_id:
            self.stop_instance(self.instance_id)
        return said

    def _may_stop(self) -> bool:
        """Say `stopped` first, then look once more: a deploy writes its hand-over first, then reads
        whether the controller runs (and starts it if not), so one of the two sees the other."""
        try:
            self.store.put_info(self._info("stopped", []))
            if not [h for h in self._handed_over() if h.run_id not in self._unreadable]:
                return True
        except StoreError as exc:
            self.log(f"cannot read {self.store.uri()}: {exc}; not stopping blind")
            return False
        self.log(f"{self.holder}: a run was handed over as it was stopping: staying")
        return False

    def _look(self) -> bool:
        """Take up what was handed over and is not owned here yet; say so in the bucket. Whether
        anything is handed over or owned."""
        handovers, waiting = self._handed_over(), []
        for handover in handovers:
            if self._owns(handover.run_id):
                continue
            try:
                self._take(handover)
            except StoreError as exc:  # the run's own records do not read: said once, keeps nobody busy
                if handover.run_id not in self._unreadable:
                    self._unreadable.add(handover.run_id)
                    self.log(f"run {handover.run_id}: not taken up (looking again, quietly): {exc}")
                continue
            self._unreadable.discard(handover.run_id)
            waiting.append(handover)
        owned = self._alive()
        self.store.put_info(self._info("running", owned))
        return bool(owned or waiting)

    def _handed_over(self) -> list[Handover]:
        """The hand-overs this account's dlinfra sealed, each pointed at its run's prefix in this
        controller's own bucket, by its own endpoint (never the record's). Anything else in the
        prefix is moved to quarantine and said once; it keeps nobody busy."""
        listed = [(name, found) for name, found in self.store.listed() if name not in self._refused]
        judged = judge(self.store, listed, self._key)
        for name, why in judged.refused:
            self._quarantine(name, why)
        return judged.sealed  # with no key, none: nothing is acted on, and idle still comes

    def _key(self) -> bytes | None:
        if self.key is None:
            try:
                self.key = read_key(
                    self.store.bucket, self.store.region, self.store.endpoint_url, create=False
                )
            except StoreError as exc:
                self._no_key(str(exc))
                return None
            if self.key is None:
                self._no_key(
                    f"no hand-over key ({key_parameter(self.store.bucket)}) exists. Fix: hand a run "
                    "over again (`deploy` makes the key), or run `dlinfra setup --controller`"
                )
        return self.key

    def _no_key(self, why: str) -> None:
        if not self._keyless:
            self._keyless = True
            self.log(f"{self.holder}: cannot verify hand-overs, acting on none: {why}")
        return None

    def _quarantine(self, key: str, problem: str) -> None:
        self._refused.add(key)
        try:
            where = f"moved to {self.store.quarantine(key)}"
        except StoreError as exc:
            where = f"never read again ({exc})"
        self.log(f"{self.store.uri(key)}: not acted on ({problem}): {where}")

    def _owns(self, run_id: str) -> bool:
        thread = self._owned.get(run_id)
        return thread is not None and thread.is_alive()

    def _alive(self) -> list[str]:
        return sorted(run_id for run_id in self._owned if self._owns(run_id))

    def _info(self, state: Any, runs: list[str]) -> ControllerInfo:
        return ControllerInfo(
            holder=self.holder,
            instance_id=self.instance_id,
            idle_minutes=self.idle_minutes,
            beat=time.time(),
            state=state,
            runs=runs,
            emulated=self.emulated,
        )

    def _take(self, handover: Handover) -> None:
        store = RunStore.open(handover.store)
        if (marker := store.marker()) is not None and _finished_with(store, handover.keep):
            self.store.remove_handover(handover.run_id)
            return
        got = claim(store, "controller", self.holder)
        if not isinstance(got, Lease):
            return  # another owner's live lease: it acts, and this controller looks again later
        self.log(
            f"run {handover.run_id}: owned (handed over by {handover.by}"
            + (f"; it ended {marker.marker} meanwhile" if marker else "")
            + ")"
        )
        thread = threading.Thread(
            target=self._own, args=(handover, got), name=f"own-{handover.run_id}", daemon=True
        )
        self._owned[handover.run_id] = thread
        thread.start()

    def _own(self, handover: Handover, lease: Lease) -> None:
        run_id, store = handover.run_id, RunStore.open(handover.store)
        try:
            run = take_up(handover)
        except Exception as exc:  # nothing acted yet: let whoever watches next take the run
            lease.release()
            self.log(f"run {run_id}: not taken up: {_why(exc)}")
            with contextlib.suppress(StoreError):
                self.store.remove_handover(run_id)
            return
        said = f"run {run_id}: "  # every line the run's owner logs names the run, once
        options = TargetOptions(
            log=lambda line: self.log(said + line.removeprefix(said)),
            emulate_instances=handover.emulate_instances,
        )
        try:
            outcome = act_for(Prepared.load(run), lease, options, keep=handover.keep)
        except Exception as exc:
            # the watch loop tore the stack down on its way out: a run nobody owns must not go on
            why = _why(exc)
            self.log(f"run {run_id}: the controller failed while owning it: {why}")
            with contextlib.suppress(StoreError):
                store.write_marker("FAILED", error=f"the controller failed while owning the run: {why[:500]}")
                self.store.remove_handover(run_id)
            return
        run.publish_manifest()  # the deploying machine reads how it ended from the store
        self.log(f"run {run_id}: {outcome.state}" + (f": {outcome.error}" if outcome.error else ""))
        if outcome.state != "DETACHED":  # DETACHED: another owner took it over, and finishes it
            self.store.remove_handover(run_id)

    def _sync_log(self) -> None:
        if self.log_file.is_file():
            self.store.put_log(self.holder, self.log_file)


def _why(exc: Exception) -> str:
    """Our own errors say what to do; anything else is a bug, told with its traceback."""
    return str(exc) if isinstance(exc, DlinfraError) else traceback.format_exc()


def _finished_with(store: RunStore, keep: bool) -> bool:
    """An ended run whose stack is gone (or kept on purpose): nothing is left to own."""
    manifest = store.manifest()
    return manifest is not None and (manifest.destroyed or keep)

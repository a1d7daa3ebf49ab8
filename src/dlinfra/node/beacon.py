"""`dlinfra node run NODE_JSON`: a node's beacon. It starts the trainer (node.trainer_process) and,
from outside it, publishes the node's liveness: the trainer's own state file, its process state from
/proc, whether its TF port answers, and the heartbeat time. It never imports TensorFlow, so a trainer
blocked in TensorFlow, stopped or spinning cannot silence it: the watcher can tell a frozen trainer
from a lost machine. It also dumps the trainer's stacks (py-spy) when the store asks for them.

The beacon is what the supervisors (the local launcher, systemd on EC2) start and restart: it ends
the way its trainer ended (same exit code, or the same signal), so the restart contract is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dlinfra.contract import EXIT_STOPPED, NodeConfig
from dlinfra.node import reaper, spot, trainer_process, watchdog
from dlinfra.node.masked_log import MaskedLog
from dlinfra.node.peers import port_open
from dlinfra.node.status import SPAWNED_AT, read_state, state_file
from dlinfra.node.supervision import should_restart
from dlinfra.node.survived import Survived
from dlinfra.node.trainer_process import TrainerProcess
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import NodeState

# /proc/<pid>/stat state letters → what the watcher reads
PROCESS_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-wait",
    "T": "stopped",
    "t": "stopped",
    "Z": "zombie",
}
STACK_DUMP_TIMEOUT = 30.0
# A stop request's SIGKILL follows 10 s on (the local launcher's grace): its detached processes end first
STOP_SWEEP_AFTER = 5.0
# The trainer's state is looked at this often between beats: news (a state, a restart's record, the
# end) goes out at once, not up to a heartbeat later, when the owner may have written the run's end
# from the store's older word (a CI run of the custom-loop guide recorded a resumed worker as lost).
NEWS_POLL = 1.0
NEWS_FIELDS = ("state", "restart_history", "error")
WATCHDOG_GRACE = 30.0  # the trainer's own watchdog fires first; this one ends a trainer too stuck to


def run(config_path: Path, log_file: Path | None = None, work_dir: Path | None = None) -> int:
    cfg = NodeConfig.model_validate_json(config_path.read_text(encoding="utf-8"))
    work = work_dir or cfg.default_work_dir()
    work.mkdir(parents=True, exist_ok=True)
    beacon = Beacon(cfg, RunStore.open(cfg.store), work, log_file)
    beacon.record_earlier_life(read_state(state_file(work)))
    state_file(work).unlink(missing_ok=True)  # an earlier life's state is not this one's
    reaper.become_subreaper()  # what the trainer leaves (its script's daemons) stays below, to be ended
    trainer = trainer_process.start(config_path, work, log_file, {SPAWNED_AT: f"{time.time():.3f}"})
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: beacon.ask_stop(trainer, signum))
    if cfg.spot:
        beacon.spot = spot.SpotWatch(cfg, beacon.store, lambda: _forward(trainer, signal.SIGTERM)).start()
    if cfg.spot_in_cluster and cfg.is_chief:
        spot.NoticeRelay(beacon.store, work).start()
    return beacon.watch(trainer)


class Beacon:
    def __init__(self, cfg: NodeConfig, store: RunStore, work: Path, log_file: Path | None):
        self.cfg, self.store, self.work, self.log_file = cfg, store, work, log_file
        self.answered: str | None = None
        self.spot: spot.SpotWatch | None = None
        self.survived = Survived(cfg.name)
        with contextlib.suppress(Exception):  # a store outage must not end the node before it starts
            self.answered = store.stacks_request()  # requests older than this life are not ours
            self.survived = Survived(cfg.name, store.status(cfg.name))
        self._masked: MaskedLog | None = None
        self.stop_asked: float | None = None
        self.published: dict[str, Any] | None = None  # the NEWS_FIELDS of the last beat
        self.told_incidents = 0  # of survived.found, how many a beat carried
        self.looking_at: int | None = None  # the pid _look watches: the trainer's, or its script's

    def ask_stop(self, trainer: TrainerProcess, signum: int) -> None:
        """A stop request (the launcher's teardown, systemd's): passed on to the trainer, and timed."""
        self.stop_asked = self.stop_asked or time.monotonic()
        _forward(trainer, signum)

    def _sweep_if_stopping(self, trainer: int, script: int) -> float:
        """Once a stop request is STOP_SWEEP_AFTER old, end every process below but the trainer and its
        script: the launcher's SIGKILL of this beacon would orphan them to init (a trainer and script
        that ignore the request still die with it, by PR_SET_PDEATHSIG). How long to wait next."""
        if self.stop_asked is None:
            return self.cfg.heartbeat_interval
        left = self.stop_asked + STOP_SWEEP_AFTER - time.monotonic()
        if left <= 0:
            reaper.end_descendants(grace=0, within=1, keep=frozenset({trainer, script}))
        return max(0.1, min(1.0, left if left > 0 else 1.0))

    def record_earlier_life(self, fields: dict[str, Any] | None) -> None:
        """An earlier life on this machine that ended before its beacon's first beat (a restart of
        every mirrored worker seconds after they started) is in the store only through this: the new
        life counts its restart, and keeps its first start, from the store's record of the last one."""
        if fields is None:
            return
        try:
            published = self.store.status(self.cfg.name)
            newer = published is None or (
                # of this node's lives (a scratch dir reused by another run of the same id is not)
                published.first_started == fields.get("first_started")
                and published.started < float(fields.get("started") or 0)
            )
            if newer:
                self.publish(int(fields.get("pid") or 0), fields, gone=True)
        except Exception as exc:  # a store outage must not end the node before it starts
            print(f"beacon {self.cfg.name}: earlier life not recorded: {exc}", file=sys.stderr, flush=True)

    def watch(self, trainer: TrainerProcess) -> int:
        done = threading.Event()
        threading.Thread(target=self._look, args=(done,), name="looks", daemon=True).start()
        try:
            return self._watch(trainer)
        finally:
            done.set()

    def _look(self, done: threading.Event) -> None:
        """The trainer's process state every NEWS_POLL, on a thread of its own: a beat blocked on the
        store (an outage its retries outlast) must not blind the beacon to a stop, which it would miss,
        or merge with the next into one pause too long (bench_chaos seeds 821 and 825)."""
        while not done.wait(NEWS_POLL):
            if (pid := self.looking_at) is not None:
                self.survived.process(process_state(pid))

    def _watch(self, trainer: TrainerProcess) -> int:
        beat_due = 0.0
        while True:
            code = trainer.poll()
            fields = read_state(state_file(self.work))  # read once a look, for both uses below
            leaving = self.spot is not None and self.spot.leaving.is_set()
            if leaving and code is not None and fields is not None:
                fields["state"] = "interrupted"
            if code is not None and code < 0 and should_restart(code) and fields and not fields.get("error"):
                fields["error"] = f"killed by signal {-code}"  # no last word of its own: its restart's cause
            # the process that trains: the trainer, or in script mode the user's script it runs
            pid = int((fields or {}).get("pid") or trainer.pid)
            if code is not None:
                self.looking_at = None
                self.survived.process("gone")
            elif fields is not None:  # once it has a state file: each look from now on, not each beat
                self.looking_at = pid
            beat = code is not None or time.monotonic() >= beat_due
            if beat or self._news(fields):
                self.publish(pid, fields, gone=code is not None)
            if code is not None:
                reaper.end_descendants()
                return self.spot.finish() if self.spot is not None and leaving else _end_like(code)
            if beat:  # what a beat does besides publishing: at the heartbeat's pace, not each look
                beat_due = time.monotonic() + self.cfg.heartbeat_interval
                self.answer_stack_requests(pid)
                reaper.reap_orphans(keep=trainer.pid)
                if self._past_its_limit(fields):
                    return self._stop_unresponsive(trainer)
            with contextlib.suppress(subprocess.TimeoutExpired):
                trainer.wait(min(NEWS_POLL, self._sweep_if_stopping(trainer.pid, pid)))

    def _stop_unresponsive(self, trainer: TrainerProcess) -> int:
        limit = watchdog.binding_limit(self.cfg)
        self.store.write_marker(
            "STOPPED",
            node=self.cfg.name,
            reason=f"{limit} (trainer unresponsive)",
            verdict="budget" if limit == "budget" else None,
        )
        _forward(trainer, signal.SIGKILL)
        trainer.wait()
        reaper.end_descendants()
        return EXIT_STOPPED

    def _news(self, fields: dict[str, Any] | None) -> bool:
        """Whether the trainer's state holds news the last beat did not carry."""
        if fields is None:
            return False
        news = {k: fields.get(k) for k in NEWS_FIELDS} != self.published
        return news or len(self.survived.found) != self.told_incidents

    def publish(self, pid: int, fields: dict[str, Any] | None, gone: bool) -> None:
        if fields is None:  # the trainer is still importing TensorFlow: nothing to say yet
            return
        process = "gone" if gone else process_state(pid)
        self.survived.process(process)
        self.survived.store(self.store.store.last_outage)  # outlasted by any call: this beat's, a read's
        try:
            state = NodeState(
                **{**fields, "incidents": self.survived.found},  # the trainer's copy holds earlier lives'
                heartbeat=time.time(),
                process=process,
                stopped_since=self.survived.stopped_since,
                port_open=None if gone else port_open(self.cfg.address),
                notice=self.spot.text if self.spot else None,
            )
            # news that fails to go out goes with the next beat, not again each look (a store outage)
            self.published = {k: fields.get(k) for k in NEWS_FIELDS}
            self.store.put_status(state)
            if self.survived.store(self.store.store.last_outage):  # this very write outlasted it: told
                # now, not a beat later (the beat of a trainer that ended is its beacon's last: seen
                # by bench_chaos, an outage every beacon outlasted in its final write went unrecorded)
                state = state.model_copy(update={"incidents": self.survived.found})
                self.store.put_status(state)
            self.told_incidents = len(state.incidents)
            self._sync_log(final=gone)
        except Exception as exc:  # a store outage must not end the node; the next beat retries
            print(f"beacon {self.cfg.name}: could not publish: {exc}", file=sys.stderr, flush=True)

    def answer_stack_requests(self, pid: int) -> None:
        try:
            request = self.store.stacks_request()
            if request is None or request == self.answered:
                return
            self.store.put_stacks(self.cfg.name, request, dump_stacks(pid))
            self.answered = request
        except Exception as exc:
            print(f"beacon {self.cfg.name}: stack dump failed: {exc}", file=sys.stderr, flush=True)

    def _past_its_limit(self, fields: dict[str, Any] | None) -> bool:
        first = (fields or {}).get("first_started")
        return first is not None and time.time() > first + self.cfg.runs_for + WATCHDOG_GRACE

    def _sync_log(self, final: bool) -> None:
        """The store gets the log masked (masked_log): a script may print what it was not meant to."""
        if self.log_file is None or not self.log_file.exists():
            return
        if self._masked is None:
            self._masked = MaskedLog(self.log_file, self.work / "log.masked")
        if self._masked.update(final):
            self.store.put_log(self.cfg.name, self._masked.copy)


def process_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    letter = stat.rsplit(")", 1)[1].split()[0]  # the command name may hold spaces and parentheses
    return PROCESS_STATES.get(letter, letter)


def dump_stacks(pid: int) -> str:
    """Every thread's Python stack of the trainer. py-spy pauses the process for a consistent read;
    a stopped process cannot be paused, so then it reads without pausing (and may need a retry)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        return "py-spy is not installed on this node. Fix: pip install py-spy\n"
    failures = []
    for extra in ([], ["--nonblocking"], ["--nonblocking"], ["--nonblocking"]):
        try:
            done = subprocess.run(
                [py_spy, "dump", *extra, "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=STACK_DUMP_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            failures.append(f"py-spy dump {' '.join(extra)} did not finish in {STACK_DUMP_TIMEOUT:.0f}s")
            continue
        if done.returncode == 0:
            return done.stdout
        failures.append(
            done.stderr.strip().splitlines()[0] if done.stderr.strip() else f"exit {done.returncode}"
        )
    return f"py-spy could not read pid {pid}: " + "; ".join(failures) + "\n"


def _forward(trainer: TrainerProcess, signum: int) -> None:
    """Pass a stop request on to the trainer's group (and wake it, should it be stopped)."""
    for sig in (signum, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(trainer.pid, sig)


def _end_like(code: int) -> int:
    """The trainer's exit code, or its death by a signal re-enacted, so supervisors see what it did."""
    if code >= 0:
        return code
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
        signal.signal(-code, signal.SIG_DFL)
    sys.stdout.flush()
    os.kill(os.getpid(), -code)
    return 128 - code  # not reached for fatal signals

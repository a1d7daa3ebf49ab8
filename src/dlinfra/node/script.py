"""Script mode: a node runs the user's own training program (`training.command`) as it is.

The node agent (a fork of the beacon, started and watched by the beacon as always) restores the
run's checkpoint files, starts the command from the code bundle with TF_CONFIG and the DLINFRA_*
variables, and stays beside it: it reads the script's progress reports (dlinfra.report), keeps the
checkpoint and TensorBoard directories synced to the store, and ends the node the way the script
ended. The agent imports no TensorFlow, so the script's environment may hold whichever TensorFlow its
requirements pin.

The node that owns the result (the chief; worker 0 without one) decides the run: its exit 0 is DONE
with what it left (a model TensorFlow loads, else "no model saved": node.script_end), FAILED under
training.require_model without one; any node's failure is FAILED with its exit code and last lines.
The other nodes stop once the run has ended (a ps serves until then).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from dlinfra.contract import EXIT_DONE, NodeConfig
from dlinfra.node import reaper
from dlinfra.node.directory_sync import DirectorySync
from dlinfra.node.environ import without_aws
from dlinfra.node.events import EventScalars
from dlinfra.node.peers import port_open
from dlinfra.node.script_dirs import (
    CHECKPOINT_DIR,
    EVAL_FILES,
    TENSORBOARD_DIR,
    TRAIN_FILES,
    ScriptDirs,
)
from dlinfra.node.script_end import alone, ended, finish
from dlinfra.node.script_log import RUNNING
from dlinfra.node.script_progress import ScriptProgress, carry_last_report
from dlinfra.node.spot import holds_state
from dlinfra.node.status import NodeStatus, give_up
from dlinfra.node.supervision import CLEAN_STOP_SIGNALS
from dlinfra.runs import bundle
from dlinfra.runs.layout import SCRIPT_CHECKPOINTS, TENSORBOARD, RunStore
from dlinfra.runs.local_files import OutputsTooBig, regular_files
from dlinfra.training import staging

POLL_SECONDS = 0.5
MARKER_SECONDS = 1.0  # how often a node looks for the run's end in the store
SYNC_SECONDS = 10.0
STOP_GRACE = 30.0  # after the run ended elsewhere: SIGTERM, then this long before SIGKILL
# Told to stop (a spot notice), the script has this long to exit on its own (TensorFlow's
# PreemptionCheckpointHandler saves at its next step and exits), then it is killed and its checkpoint
# directory sent. Under TF_CONFIG, MultiWorkerMirroredStrategy takes SIGTERM for its preemption
# notifier, so a script that does not handle it trains on until the machine is gone (a --full run of
# the MWMS guide left 33 s after its notice, its script having finished on its own meanwhile).
TOLD_GRACE = 10.0
# An owner whose script trains this long (from its first reported step, else from its start) without
# serving on its TF_CONFIG address, while it has peers, ignores them: it is refused as `alone` then,
# not after it trained its full length on every node.
ALONE_AFTER = 60.0


def run(cfg: NodeConfig, store: RunStore, status: NodeStatus, work: Path, log_file: Path | None) -> int:
    """One life of a script-mode node: the exit code tells its beacon what to do next."""
    command = cfg.training.command or []
    assert cfg.bundle is not None
    code = bundle.unpack(store, cfg.bundle, work)
    carry_last_report(status, ScriptDirs.progress_file(work))
    dirs = ScriptDirs.under(work)
    cap = cfg.training.outputs_max_gb
    # under parameter servers each ps sends shards of one checkpoint: none may delete another's
    alone_sends = not cfg.peers.get("ps")
    checkpoints = DirectorySync(
        store, dirs.checkpoint, SCRIPT_CHECKPOINTS, CHECKPOINT_DIR, cap, sole_sender=alone_sends
    )
    tensorboard = DirectorySync(store, dirs.tensorboard, TENSORBOARD, TENSORBOARD_DIR, cap)
    # The nodes that hold state send their checkpoint files (the owner's, each ps's shards; other
    # workers' are TensorFlow's temporary copies); those that restore from them read them back.
    sends = cfg.is_chief or cfg.role == "ps"
    if holds_state(cfg) and (restored := checkpoints.pull()):
        print(f"restored {restored} checkpoint files from the store into {dirs.checkpoint}", flush=True)
        status.update(resumed_from=status.fields.get("step"))
        status.restored(restored_files=restored)
    elif holds_state(cfg) and not regular_files(dirs.checkpoint, CHECKPOINT_DIR).files:
        status.restored(from_scratch=f"${CHECKPOINT_DIR}")  # a restart that has nothing to resume from
    stopping: list[int] = []
    told_at: list[float] = []

    def told(signum: int, frame: object) -> None:
        stopping.append(signum)
        told_at.append(time.monotonic())

    for sig in CLEAN_STOP_SIGNALS:  # the beacon signals the whole group: the script gets it too
        signal.signal(sig, told)
    variables = dirs.environ(cfg) | staged_files(cfg, work, code)
    argv = expand(command, variables)
    print(f"{RUNNING}{shlex.join(argv)} in {code}", flush=True)
    reaper.become_subreaper()  # what the script daemonizes stays below this agent, to be ended with it
    try:
        script = subprocess.Popen(
            argv,
            cwd=code,
            env=script_environ(variables, cfg.training.pass_env),
            stdin=subprocess.DEVNULL,
            preexec_fn=reaper.die_with_parent,  # the max_runtime watchdog ends this agent: the script too
        )
    except OSError as exc:
        return give_up(
            cfg,
            store,
            status,
            f"training.command could not start on {cfg.name}: {command[0]!r}: {exc.strerror}. Fix: name a "
            "program the run's environment has (python, or a script in the bundle made executable)",
            "",
            verdict="command",
        )
    status.mark("program")
    # The stall clock starts with the script; its reports (or, without them, its CPU use) move it on.
    status.update(state="running", pid=script.pid, progress_at=time.time())
    owner = cfg.is_chief
    progress = ScriptProgress(status, dirs.progress, EventScalars(dirs.tensorboard) if owner else None)
    alone_check = owner and sum(len(a) for a in cfg.peers.values()) > 1
    served = not alone_check
    started = time.time()
    synced = marker_read = 0.0
    too_big: OutputsTooBig | None = None
    while True:
        try:
            exit_code = script.wait(POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            pass
        if told_at and time.monotonic() - told_at[0] > TOLD_GRACE and script.returncode is None:
            name = signal.Signals(stopping[0]).name
            print(f"the script did not exit within {TOLD_GRACE:.0f}s of {name}: killed", flush=True)
            script.kill()
            told_at.clear()  # once
        reaper.reap_orphans(keep=script.pid)
        progress.read()
        progress.busy(script.pid)
        served = served or port_open(cfg.address)
        if status.restart is not None and not status.fields.get("step") and port_open(cfg.address):
            status.training_again(time.time())  # one that reports nothing (a ps, its workers) serves again
        if not served and time.time() - (progress.first_step_at or started) > ALONE_AFTER:
            _stop(script)
            _end_left_behind()
            return alone(cfg, store, status, dirs, time.time() - started)
        now = time.monotonic()
        try:
            if sends:  # looked at every poll, sent once settled: a restart finds the newest checkpoint
                _push(checkpoints)
            if owner and now - synced > SYNC_SECONDS:
                _push(tensorboard, final=True)  # event files only grow: what is there is worth sending
                synced = now
        except OutputsTooBig as exc:
            too_big = exc
            exit_code = _stop(script)
            break
        if not stopping and now - marker_read > MARKER_SECONDS:
            marker_read = now
            if (marker := store.marker()) is not None:  # the run ended elsewhere: this node is done
                _stop(script)
                _end_left_behind()
                status.stop(state=marker.marker.lower())
                return EXIT_DONE
    took = time.time() - started
    _end_left_behind()  # before the outputs are read: a daemon left running could still change them
    status.update(pid=os.getpid())
    progress.read()
    try:
        _push(checkpoints if sends else None, tensorboard if owner else None, final=True)
    except OutputsTooBig as exc:
        too_big = too_big or exc
    if stopping:  # told to stop (a spot notice, teardown): end as the trainer would have
        status.stop(state="stopped")
        _die_by(stopping[0])
    if too_big is not None:
        return give_up(cfg, store, status, f"on {cfg.name}: {too_big}", "", verdict="outputs")
    if exit_code == 0 and owner and not served:
        return alone(cfg, store, status, dirs, None)
    if exit_code == 0 and owner:
        return finish(cfg, store, status, dirs, progress, (checkpoints, tensorboard), took)
    return ended(cfg, store, status, exit_code, progress, log_file)


def staged_files(cfg: NodeConfig, work: Path, code: Path) -> dict[str, str]:
    """A packed data set's staged shards (see training.staging) as glob patterns relative to the
    command's working directory, its code: under parameter servers the chief's coordinator hands its
    one pattern to every worker, and each worker must find its own share by it."""
    if not cfg.training.dataset.staged:
        return {}
    up = Path(os.path.relpath(work, code))
    train, held = staging.patterns(cfg.training.dataset.format)
    return {TRAIN_FILES: str(up / train), EVAL_FILES: str(up / held)}


def script_environ(variables: dict[str, str], passed: Iterable[str] = ()) -> dict[str, str]:
    """The script's environment: the node's (without the AWS settings the spec does not pass: see
    node.environ), the DLINFRA_* variables, and the run's environment first on PATH, so `python` (and
    any console script its packages install) is the locked one."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    node = without_aws(os.environ, passed)
    return dict(node, **variables, PATH=f"{bin_dir}{os.pathsep}{path}" if path else bin_dir)


def expand(command: list[str], variables: dict[str, str]) -> list[str]:
    """`$DLINFRA_MODEL_DIR` or `${DLINFRA_MODEL_DIR}` in a word of the command becomes its value, as a
    shell would expand it (the command runs without one), so a script takes its paths as flags."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, match.group(0))

    return [re.sub(r"\$\{(DLINFRA_[A-Z_]+)\}|\$(DLINFRA_[A-Z_]+)", value, word) for word in command]


def _push(*syncs: DirectorySync | None, final: bool = False) -> None:
    try:
        for sync in syncs:
            if sync is not None:
                sync.push(final=final)
    except OutputsTooBig:
        raise
    except Exception as exc:  # a store outage must not end the script; the next sync retries
        print(f"could not sync to the store: {exc}", file=sys.stderr, flush=True)


def _stop(script: subprocess.Popen[bytes]) -> int:
    script.terminate()
    try:
        return script.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        script.kill()
        return script.wait()


def _end_left_behind() -> None:
    if ended := reaper.end_descendants():
        print(
            f"ended {len(ended)} processes the script left running (pids {' '.join(map(str, ended))}): "
            "every process a node starts ends with its run",
            flush=True,
        )


def _die_by(signum: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1)
    os._exit(128 + signum)

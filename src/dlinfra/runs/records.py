"""Typed records of a run: what nodes and the CLI write to the store and the run dir, and read back.
Where each one lives is the layout module's business.

Every record carries `schema_version`. A reader refuses a record of another version (an older or
newer dlinfra, or something that is not ours) with a clear error instead of guessing at its keys.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dlinfra.contract import StoreConfig

SCHEMA_VERSION = 1

MarkerName = Literal["DONE", "FAILED", "STOPPED"]
MARKERS: tuple[MarkerName, ...] = ("DONE", "FAILED", "STOPPED")
FINISHED_NODE_STATES = ("done", "failed", "stopped")
INTERRUPTED_NODE_STATES = ("interrupted", "replacing (interrupted)", "replacing (straggler)")
NoticeKind = Literal["interruption", "rebalance"]
NO_MODEL = "no model"  # the verdict of a script run that saved none under training.require_model
NO_MODEL_SAVED = "no model saved"  # the reason on the DONE marker of one without it


class Record(BaseModel):
    # Unknown keys are an error: a record we wrote has none, and a typo in an update must not pass.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    schema_version: int = SCHEMA_VERSION


class Restart(Record):
    """One restart of a node: why its last life ended, where the new one resumed, what it cost."""

    node: str
    life: int  # the life it began: 2 for the node's first restart
    cause: str  # killed by signal 9 | lost peer | spot notice | replaced (straggler) | process died | ...
    failed_at: float  # the earlier life's last word (or last beat): when the fault was seen
    restarted_at: float  # the new life's start
    checkpoint_step: int | None = None  # the step of the checkpoint it restored (Program mode)
    restored_files: int | None = None  # checkpoint files pulled into $DLINFRA_CHECKPOINT_DIR (script mode)
    from_scratch: str | None = None  # where it looked and found no checkpoint
    resumed_at: float | None = None  # its first step in the new life (or, without reports, busy again)
    first_step: int | None = None  # the step it first reported in the new life

    @property
    def seconds_lost(self) -> float | None:
        """From the fault to training again."""
        return None if self.resumed_at is None else max(0.0, self.resumed_at - self.failed_at)


IncidentKind = Literal["paused", "store unreachable"]


class Incident(Record):
    """A fault a node lived through without losing its life (a lost life is a Restart): its trainer
    stopped and thawed (SIGSTOP, a debugger), or the store unreachable from the node for a while.
    Seen from outside the trainer by the node's beacon (node.survived)."""

    node: str
    kind: IncidentKind
    at: float  # when it was first seen
    seconds: float  # how long it lasted, as seen


class NodeState(Record):
    """A node's heartbeat and progress, rewritten every few seconds."""

    node: str
    role: str
    index: int
    state: str
    step: int = 0
    total_steps: int | None = None
    loss: float | None = None
    examples_per_sec: float | None = None
    input_wait: float | None = None  # the share of step time waiting on input since the last report
    # What the watcher names stragglers by (runs.stragglers): under multi_worker_mirrored each worker's
    # seconds per step in its own pass, timed in its steps (the all-reduce left out; None under
    # training.deterministic); under parameter servers the chief's
    # worker → [seconds per step of its sampled calls, steps sampled]
    compute_seconds: float | None = None
    workers: dict[str, list[float]] | None = None
    restarts: int = 0
    restart_history: list[Restart] = Field(default_factory=list)  # every restart of the node, oldest first
    incidents: list[Incident] = Field(default_factory=list)  # what it lived through, oldest first
    started: float
    first_started: float
    heartbeat: float
    host: str | None = None
    pid: int | None = None
    error: str | None = None
    resumed_from: int | None = None
    progress_at: float | None = None  # when the trainer began training or last reported a step
    # script mode: the stall bound its reports' pace sets (node.script_progress), else None
    stall_after: float | None = None
    working_at: float | None = None  # script mode, reporting: last seen using CPU between reports
    cpu_percent: float | None = None  # script mode, without reports: the script's CPU use of late
    devices: list[str] | None = None  # what TensorFlow sees on the node: "GPU:0 Tesla T4 15 GiB", "CPU:0"
    packages: dict[str, str] | None = None  # what the node runs of its lock's packages: name → version
    warnings: list[str] | None = None  # what its program asks that training does not do (unused compile())
    # what the node ran, read from its own environment: tensorflow, keras, numpy, python, lock (sha256)
    versions: dict[str, str] | None = None
    # when this life reached each startup phase (epoch seconds): spawned, up, tensorflow, peers, program,
    # first step (contract.PHASES); `dlinfra show` and deploy's result say where the seconds went
    phases: dict[str, float] = Field(default_factory=dict)
    # What the node's beacon (a process beside the trainer) sees of the trainer from outside:
    process: str | None = None  # running | sleeping | disk-wait | stopped | zombie | gone
    stopped_since: float | None = None  # first seen stopped (SIGSTOP, a debugger), else None
    port_open: bool | None = None  # the node's TF port accepts connections
    notice: str | None = None  # what EC2 announced for its machine: a rebalance, an interruption

    @property
    def interrupted(self) -> bool:
        """Left its machine on purpose (ahead of a spot reclaim, or replaced as a straggler) or being
        replaced after that: its next life is a new machine's first, not a restart of the node."""
        return self.state in INTERRUPTED_NODE_STATES

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_NODE_STATES


class Marker(Record):
    """DONE / FAILED / STOPPED: how the run ended. The first one written wins."""

    marker: MarkerName
    time: float
    node: str | None = None
    error: str | None = None
    reason: str | None = None
    traceback: str | None = None
    # FAILED: crashed | frozen | lost | stalled | devices (fewer GPUs than asked) | failed (its own error)
    verdict: str | None = None
    stacks: dict[str, str] | None = None  # node → where its main thread waits (frozen and stalled runs)
    last_checkpoint: str | None = None  # the checkpoint prefix a STOPPED run can resume from
    step: int | None = None
    eval_accuracy: float | None = None
    restarts: list[Restart] = Field(default_factory=list)  # every node's, by the time of the fault


class Owner(Record):
    """Who acts for a run (heals, records verdicts, tears down): one CLI or the account's controller,
    holding a lease it renews. Anyone else only watches (runs.ownership)."""

    kind: Literal["cli", "controller", "none"]  # none: released (ended, detached or handed over)
    holder: str  # "cli <user>@<host> pid N" | "controller <instance id>"
    token: str  # this claim's own id: a write whose answer was lost is recognised as ours
    since: float
    renewed: float  # the holder's clock; the lease holds until renewed + lease_seconds
    lease_seconds: float
    handed_to: str | None = None  # released for the controller: it claims the run next

    def live(self, now: float) -> bool:
        return self.kind != "none" and now < self.renewed + self.lease_seconds


class Handover(Record):
    """A run handed to the account's controller (`deploy` with a controller): enough to act for it
    from the bucket alone. The run dir itself travels in the run's store (RunStore.put_run_dir)."""

    run_id: str
    store: StoreConfig  # the run's own store
    emulate_instances: str | None = None  # the processes or VMs standing in for instances (tests)
    keep: bool = False  # leave the stack up after the run ends (`deploy --keep`)
    by: str  # the holder that handed it over
    time: float
    run_dir_sha256: str | None = None  # of run-dir.tar.gz as handed over: a swapped one is refused
    signature: str | None = None  # runs.sealing: HMAC under the bucket's hand-over key


class ControllerInfo(Record):
    """The account's controller as it last said: who it is, and when it last looked for runs."""

    holder: str  # "controller <instance id>" (or "controller <host> pid N" run by hand)
    instance_id: str | None = None  # None: not on an instance (nothing to start when it stops)
    idle_minutes: float
    beat: float  # its clock when it last looked
    state: Literal["running", "stopped"] = "running"
    runs: list[str] = Field(default_factory=list)  # the runs it owns now
    # How --emulate-instances boots its instance (None: EC2 does). A VM controller, like one on EC2,
    # cannot reach the emulated nodes' processes: it acts on the runs through the EC2 API only.
    emulated: Literal["process", "vm"] | None = None

    def running(self, now: float, poll: float) -> bool:
        """Whether it still looks for runs (a silent one died without saying so)."""
        return self.state == "running" and now < self.beat + 6 * poll


class Notice(Record):
    """A spot notice one node's beacon saw in its instance metadata, and what came of it. Written by
    that beacon only: when it sees the notice, then again when the node leaves."""

    node: str
    kind: NoticeKind
    noticed: float  # when the beacon saw it
    action: str | None = None  # EC2's instance-action: terminate | stop | hibernate
    deadline: float | None = None  # when EC2 said it will act
    acted: bool = False  # the node leaves (an interruption, or a rebalance with act_on_rebalance)
    step_at_notice: int | None = None  # the run's step (its chief's) when the notice was seen
    checkpoint_step: int | None = None  # the latest checkpoint when the node left
    checkpoint_time: float | None = None
    left: float | None = None  # when the node's trainer was stopped and the node exited
    step_at_left: int | None = None
    steps_lost: int | None = None  # trained before the node left, held by no checkpoint a restart reads
    exit_code: int | None = None

    @property
    def key(self) -> str:
        """Unique in the run: a node replaced after one notice can get another."""
        return f"{self.node}.{int(self.noticed * 1000)}"

    @property
    def seconds_used(self) -> float | None:
        """Of the notice EC2 gave, how long the node took to leave."""
        return None if self.left is None else self.left - self.noticed


class MeanSd(BaseModel):
    mean: float
    sd: float


class Metrics(Record):
    """What the chief measured and left."""

    # program: dlinfra's loop trained a Program; script: the user's command ran (training.command)
    mode: Literal["program", "script"] = "program"
    command: list[str] | None = None
    # where a script's steps and scalars came from: its dlinfra.report calls, else the scalars it wrote
    # for TensorBoard; None: neither (its progress is unknown)
    progress: Literal["report", "tensorboard"] | None = None
    # where the program measured an accuracy (a script: where it reported one, eval_accuracy)
    eval_accuracy: float | None = None
    steps: int | None = None  # a script's last reported step (None: it reported none)
    total_steps: int | None = None
    # by name: a program's eval loss and metrics (eval_loss, eval_mae...), a script's last reported scalars
    scalars: dict[str, float] = Field(default_factory=dict)
    loss: str | None = None  # a program's loss, as named (its own, its compile()'s, or the default)
    optimizer: str | None = None  # a program's optimizer class, and where it came from
    strategy: str
    workers: int
    ps: int
    batch_size: int | None = None  # per replica
    replicas: int | None = None  # model copies computing gradients (every GPU, or one per CPU worker)
    global_batch: int | None = None  # examples behind one optimizer update
    learning_rate: float | None = None  # as used
    lr_scaling: str | None = None  # the rule that turned training.learning_rate into it
    mixed_precision: bool = False
    # parameter_server: steps per remote call -> steps scheduled at that size (auto starts at one and
    # follows the measured step time); empty under multi_worker_mirrored, whose calls are log_every
    steps_per_call: dict[int, int] = Field(default_factory=dict)
    # parameter_server: steps the chief handed to workers (this life of the chief): `steps` less the
    # step it resumed from, in a run without faults
    steps_scheduled: int | None = None
    train_seconds: float
    first_step_at: float | None = None
    finished_at: float
    global_steps_per_sec: MeanSd | None = None
    examples_per_sec: MeanSd | None = None
    # the share of step time spent waiting on input (in next() on the iterator), over the run: the
    # chief's own pipeline under multi_worker_mirrored, a sample of the workers' under parameter servers
    input_wait: float | None = None
    examples_per_sec_series: list[tuple[float, int, float]] = Field(default_factory=list)
    loss_series: list[tuple[int, float]] = Field(default_factory=list)
    final_loss: float | None = None
    model_uri: str
    checkpoint: str | None = None
    # a script's model directory: what in it TensorFlow loads ("SavedModel export/17", ".keras model.keras"),
    # or, none loading, what it held instead (node.model_probe): the run is DONE with "no model saved"
    models: list[str] = Field(default_factory=list)
    no_model: str | None = None
    latest_checkpoint: str | None = None  # the one TensorFlow's state file names, under `checkpoint`
    # a script's outputs not uploaded: links out of their directory, special files (runs.local_files)
    outputs_refused: list[str] = Field(default_factory=list)
    interruptions: list[Notice] = Field(default_factory=list)  # spot notices the nodes acted on
    rebalances: int = 0  # rebalance recommendations seen (only logged unless act_on_rebalance)
    restarts: list[Restart] = Field(default_factory=list)  # every node's, by the time of the fault

    def left_instead(self) -> str:
        """Where a script run that saved no model keeps what it did leave: its checkpoints, and the
        files of its model directory (uploaded as they are)."""
        if self.checkpoint is None:
            left = "no checkpoint either (nothing in $DLINFRA_CHECKPOINT_DIR)"
        else:
            latest = f", the latest {self.latest_checkpoint}" if self.latest_checkpoint else ""
            left = f"its checkpoints at {self.checkpoint}{latest}"
        if self.no_model and not self.no_model.startswith("found nothing"):  # node.model_probe's words
            left += f"; what its model directory held at {self.model_uri}"
        return left

    def steady_examples_per_sec(self) -> float | None:
        """Every example over all the time from the first report to the last: what a run sustains.
        The mean of the intervals' rates is not, where intervals differ (parameter-server calls end
        in bursts: a short interval's high rate counts as much as a long one's low)."""
        s = self.examples_per_sec_series
        if len(s) < 2 or s[-1][0] <= s[0][0]:
            return self.examples_per_sec.mean if self.examples_per_sec else None
        examples = sum(rate * (t - before) for (before, _, _), (t, _, rate) in itertools.pairwise(s))
        return examples / (s[-1][0] - s[0][0])

    def summary(self) -> dict[str, Any]:
        """What the manifest keeps of the metrics (the series stay in metrics.json)."""
        return {
            "eval_accuracy": self.eval_accuracy,
            "scalars": self.scalars,
            "steps": self.steps,
            "train_seconds": self.train_seconds,
            "model_uri": self.model_uri,
            **({"no_model": self.no_model} if self.no_model else {}),
            **({"restarts": len(self.restarts)} if self.restarts else {}),
            **(
                {
                    "interruptions": len(self.interruptions),
                    "steps_lost_to_interruptions": sum(n.steps_lost or 0 for n in self.interruptions),
                }
                if self.interruptions
                else {}
            ),
        }


class CheckpointPointer(Record):
    """The latest checkpoint: written after the files it names, so it never names a partial one."""

    step: int = Field(ge=0)
    prefix: str  # ckpt-<step>
    files: list[str]
    time: float | None = None  # when the pointer was written: the checkpoint is complete from then

    @model_validator(mode="after")
    def _names_stay_in_checkpoints(self) -> CheckpointPointer:
        # A node restores into its work dir by these names: a planted '../' would write elsewhere.
        if self.prefix != f"ckpt-{self.step}":
            raise ValueError(f"prefix must be ckpt-{self.step} (got {self.prefix[:100]!r})")
        plain = re.compile(rf"{re.escape(self.prefix)}\.[A-Za-z0-9_-][A-Za-z0-9_.-]{{0,200}}")
        if bad := [name for name in self.files if not plain.fullmatch(name)]:
            raise ValueError(f"files must be plain {self.prefix}.* names (got {bad[0][:100]!r})")
        return self

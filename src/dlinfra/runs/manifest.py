"""The run manifest: what a run was, where it went, and the pins (bundle, wheel, locks, images) that
let a rerun be the same run. Kept apart from the per-node records of `runs.records`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from dlinfra.contract import StoreConfig
from dlinfra.runs.records import Record


class WheelPin(BaseModel):
    name: str
    sha256: str
    uri: str


class EnvironmentPin(BaseModel):
    """One flavor's lock: the file in code/, its digest, what it was resolved for and from."""

    file: str  # env-cpu.lock
    sha256: str
    uri: str
    platform: str  # "Python 3.11 on linux/x86_64"
    index: str  # the index(es) it was resolved from, credentials masked
    packages: dict[str, str] = Field(default_factory=dict)  # name → version


class ImagePin(BaseModel):
    """The image nodes booted: an AMI id or a local image's name; `digest` its recipe digest
    (None: a base image, whose nodes installed at boot)."""

    id: str
    digest: str | None = None
    dlinfra_version: str | None = None
    lock_sha256: str | None = None  # the environment lock the image holds (None: unrecorded)


class BundlePin(BaseModel):
    sha256: str
    entrypoint: str
    bytes: int
    files: list[str] = []  # what was packed, for review (empty in records of older versions)


HealReason = Literal["vanished", "interrupted", "preflight", "straggler"]


class Heal(BaseModel):
    node: str
    old: str
    new: str
    time: str  # when the replacement was up (applied)
    started: float | None = None  # when the re-apply began (epoch seconds)
    reason: HealReason = "vanished"
    noticed: float | None = None  # interrupted: when its beacon saw the spot notice
    on_demand: bool = False  # the spot capacity was not there: replaced on demand (fallback)


class PlanCounts(BaseModel):
    add: int
    change: int
    destroy: int
    usd_per_hour: float


class Manifest(Record):
    """In the run dir and the store: what a run was, where it went, and what pins a rerun."""

    run_id: str
    name: str
    target: str
    strategy: str
    status: str  # CREATED, PLANNED, CANCELLED, APPLIED, RUNNING, DONE, FAILED, STOPPED
    created: str
    store: StoreConfig
    spec_sha256: str
    spec_path: str | None = None
    command: str
    git: dict[str, Any] | None = None  # commit, dirty
    # what the nodes ran (tensorflow, keras, numpy, python, lock; "source": planned | nodes): runs.versions
    versions: dict[str, str | None] = Field(default_factory=dict)
    node_versions: dict[str, dict[str, str]] = Field(default_factory=dict)  # node → its own, if they differ
    version_changes: list[str] | None = None  # a rerun: what its nodes ran differently from the original's
    nodes: list[str] = Field(default_factory=list)
    addresses: dict[str, list[str]] = Field(default_factory=dict)
    bundle: BundlePin | None = None
    wheel: WheelPin | None = None
    install: str | None = None
    environment: dict[str, EnvironmentPin] = Field(default_factory=dict)  # flavor → its lock
    lock_changes: list[str] | None = None  # rerun --refresh-lock: "name a → b" against the original
    images: dict[str, ImagePin] = Field(default_factory=dict)  # role → the image it booted
    ami_id: str | None = None  # aws: the base AMI the plan resolved (aws.ami or the SSM parameter)
    dataset: dict[str, Any] | None = None
    seeds: dict[str, Any] | None = None
    rerun_of: str | None = None
    unpinned: list[str] = Field(default_factory=list)
    started: str | None = None
    command_started: float | None = None  # epoch seconds the deploy command began: startup's clock
    finished: str | None = None
    metrics: dict[str, Any] | None = None
    restarts: int | None = None  # of every node, as the run ended (None: not recorded)
    # What the target created: local node process groups, or cloud instances and their Terraform.
    pids: dict[str, int] = Field(default_factory=dict)  # node → process group of its beacon
    network: str | None = None  # local: private (the cluster's own namespace) or host
    detached: bool = False  # deployed with --detach: no watcher until `dlinfra watch`
    handed_over: bool = False  # given to the account's controller: the store's manifest is the news
    instances: dict[str, str] = Field(default_factory=dict)
    heals: list[Heal] = Field(default_factory=list)
    devices: dict[str, list[str]] = Field(default_factory=dict)  # node → what TensorFlow saw on it
    plan: PlanCounts | None = None
    apply_seconds: float | None = None
    tfvars_sha256: str | None = None
    terraform_lock_sha256: str | None = None
    destroyed: bool = False
    destroy_seconds: float | None = None

    @property
    def resources_up(self) -> bool:
        """Cloud resources were applied for this run and not destroyed since."""
        return bool(self.instances) and not self.destroyed

    def usd_spent(self, now: float) -> float | None:
        """What the run has cost at its plan's prices from its nodes' start to its end (or `now`); None
        where nothing is billed. The clock cluster.max_cost keeps, give or take each node's boot."""
        rate = self.plan.usd_per_hour if self.plan else None
        if not rate or self.started is None:
            return None
        end = datetime.fromisoformat(self.finished).timestamp() if self.finished else now
        return rate * max(0.0, end - datetime.fromisoformat(self.started).timestamp()) / 3600

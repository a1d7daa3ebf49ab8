"""The experiment spec: pydantic models and their JSON Schema (loading is spec.loading).

The models are the single place where defaults live: `dlinfra schema` is generated from them, the
commented example `dlinfra init` writes is kept equal to them by a test, and a spec-less
`dlinfra deploy` is simply ``Spec()``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from dlinfra.spec.aws import AwsSpec
from dlinfra.spec.counts import auto_or_count
from dlinfra.spec.grammar import INSTANCE_TYPE_RE, NAME_RE, S3_URL_RE, http_url
from dlinfra.spec.input import StrictModel, shown
from dlinfra.spec.preflight import PreflightSpec, StragglerSpec, preflight_shorthand
from dlinfra.spec.spot import SpotPolicy, SpotSpec, spot_shorthand
from dlinfra.spec.training import TrainingSpec

STORE_SCHEMES = ("file://", "s3://")

PositiveInt = Annotated[int, Field(ge=1)]
HOUR = 3600
DAY = 24 * HOUR


class ChiefSpec(StrictModel):
    instance_type: str = Field(
        "m5.xlarge",
        pattern=INSTANCE_TYPE_RE,
        description="EC2 type of the chief (aws), family.size like m5.xlarge.",
    )


MAX_GPUS = 16


GpuCount = Annotated[int | Literal["auto"], BeforeValidator(auto_or_count(0, MAX_GPUS, "GPUs"))]


# The worker block of the largest subnet a VPC can have (/16): hosts .128 up to the broadcast address.
# The subnet actually chosen is the real limit, checked with the address plan (its fix names a size).
MAX_WORKERS = 2**16 - 128 - 1


class WorkersSpec(StrictModel):
    count: int = Field(2, ge=1, le=MAX_WORKERS, description="Number of worker nodes.")
    instance_type: str = Field(
        "g4dn.xlarge",
        pattern=INSTANCE_TYPE_RE,
        description="EC2 type of each worker (aws), family.size like g5.xlarge.",
    )
    gpus: GpuCount = Field(
        "auto",
        description="GPUs each worker trains on. auto: all of the type's GPUs on aws, none on local "
        "(local workers share this machine: worker i gets GPUs i*gpus..). 0: CPU.",
    )
    spot: Annotated[SpotSpec, BeforeValidator(spot_shorthand)] = Field(
        SpotSpec(), description="Spot capacity for the workers; `spot: true` is short for {enabled: true}."
    )


class PsSpec(StrictModel):
    count: int = Field(1, ge=0, le=100, description="Parameter servers (parameter_server strategy only).")
    instance_type: str = Field(
        "m5.xlarge",
        pattern=INSTANCE_TYPE_RE,
        description="EC2 type of each ps (aws), family.size like m5.xlarge.",
    )


class ClusterSpec(StrictModel):
    chief: ChiefSpec = ChiefSpec()
    workers: WorkersSpec = WorkersSpec()
    ps: PsSpec = PsSpec()
    port: int = Field(
        2222,
        ge=1024,
        le=65533,
        description="TF gRPC port on aws nodes (local picks free ports); the chief's tf.data dispatcher "
        "listens on the next one, each node's preflight link sink on the one after.",
    )
    startup_timeout: float = Field(180, gt=0, le=DAY, description="Seconds a node waits for its peers.")
    heartbeat_timeout: float = Field(
        60,
        gt=0,
        le=HOUR,
        description="Seconds without heartbeat before a node is lost, or stopped before it is frozen.",
    )
    stall_timeout: float = Field(
        600,
        gt=0,
        le=7 * DAY,
        description=(
            "Seconds without a training step, every node alive, before the run is stalled (a script "
            "that reports is stalled sooner, by its own pace: see docs/script.md)."
        ),
    )
    max_runtime: float = Field(
        3600,
        gt=0,
        le=30 * DAY,
        description="Watchdog: every node stops after this many seconds (30 days at most).",
    )
    max_cost: float | None = Field(
        None,
        gt=0,
        description="USD: once the cluster has cost this much at the catalog's prices, the run checkpoints "
        "and stops (STOPPED, verdict budget). Spot nodes are priced on demand, erring on the safe side.",
    )
    local_network: Literal["auto", "private", "host", "shaped"] = Field(
        "auto",
        description="local target: private puts the cluster in its own network namespace, unreachable from "
        "outside (TensorFlow's servers listen on every interface, unauthenticated); host shares this "
        "machine's network; auto: private unless the nodes need the network (an s3:// store, a remote "
        "dataset) or this machine cannot make namespaces; shaped: private, and each node in a namespace "
        "of its own whose link runs at its instance type's baseline bandwidth (times local_link_scale).",
    )
    local_link_scale: float = Field(
        1.0,
        gt=0,
        le=1,
        description="local_network shaped: each node's link is its type's baseline bandwidth times this "
        "(0.01: a 10 Gb/s type gets 100 Mb/s, so a cloud's network bound shows on one machine).",
    )
    max_restarts: int = Field(
        5,
        ge=0,
        le=1000,
        description="Restarts of one node (crash, lost peer) before the run is marked FAILED.",
    )
    spot: SpotPolicy = SpotPolicy()
    preflight: Annotated[PreflightSpec, BeforeValidator(preflight_shorthand)] = Field(
        PreflightSpec(),
        description="Checks every node runs before the first step: quick | full | off, or a mapping "
        "{checks, min_ratio, on_fail}.",
    )
    straggler: StragglerSpec = StragglerSpec()


# ---------------------------------------------------------------- storage and aws


class StorageSpec(StrictModel):
    url: str | None = Field(
        None, description="Results store: file:///path or s3://bucket/prefix. Default: the run dir."
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto, LocalStack).")

    @field_validator("url")
    @classmethod
    def _store_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith(STORE_SCHEMES):
            raise ValueError(f"must start with file:// or s3:// (got {shown(v)})")
        if v.startswith("s3://") and not re.fullmatch(S3_URL_RE, v):
            raise ValueError(
                "needs a bucket name and a plain prefix: s3://my-bucket/runs (letters, digits, . _ - = /; "
                f"no spaces, quotes or credentials) (got {shown(v)})"
            )
        if v.startswith("file://") and not v[len("file://") :].startswith("/"):
            raise ValueError(f"needs an absolute path: file:///abs/path (got {shown(v)})")
        return v.rstrip("/")

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return http_url(v)


# ---------------------------------------------------------------- the spec


@dataclass(frozen=True)
class RoleShape:
    count: int
    instance_type: str
    spot: bool = False


class Spec(StrictModel):
    """One experiment: what to train, on what cluster, where results go."""

    name: str = Field(
        "digits-cnn",
        pattern=NAME_RE,
        description="Up to 27 lowercase letters, digits, dashes; starts with a letter.",
    )
    target: Literal["local", "aws"] = "local"
    strategy: Literal["parameter_server", "multi_worker_mirrored"] = Field(
        "parameter_server", description="parameter_server: async; multi_worker_mirrored: sync all-reduce."
    )
    cluster: ClusterSpec = ClusterSpec()
    training: TrainingSpec = TrainingSpec()
    storage: StorageSpec = StorageSpec()
    aws: AwsSpec = AwsSpec()
    auto_apply: bool = Field(False, description="Deploy on merge (`dlinfra init --github --apply`).")

    @model_validator(mode="after")
    def _strategy_fits_cluster(self) -> Spec:
        if self.strategy == "parameter_server" and self.cluster.ps.count < 1:
            raise ValueError(
                "strategy parameter_server needs cluster.ps.count >= 1 (or use multi_worker_mirrored)"
            )
        if self.training.jit_compile and self.strategy == "parameter_server":
            # the chief traces a step that runs on other machines: XLA there is untested, so refused
            raise ValueError(
                "training.jit_compile applies to multi_worker_mirrored only. Fix: set strategy: "
                "multi_worker_mirrored, or training.jit_compile: false"
            )
        return self

    def roles(self) -> dict[str, RoleShape]:
        """TF job → its nodes' count and instance type. multi_worker_mirrored has workers only
        (worker 0 acts as chief)."""
        c = self.cluster
        workers = RoleShape(c.workers.count, c.workers.instance_type, c.workers.spot.enabled)
        if self.strategy == "multi_worker_mirrored":
            return {"worker": workers}
        return {
            "chief": RoleShape(1, c.chief.instance_type),
            "worker": workers,
            "ps": RoleShape(c.ps.count, c.ps.instance_type),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

"""The experiment spec: pydantic models and their JSON Schema (loading is spec.loading).

The models are the single place where defaults live: `dlinfra schema` is generated from them, the
commented example `dlinfra init` writes is kept equal to them by a test, and a spec-less
`dlinfra deploy` is simply ``Spec()``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from dlinfra.spec import pass_env
from dlinfra.spec.aws import AwsSpec
from dlinfra.spec.dataset import DatasetSpec
from dlinfra.spec.grammar import INSTANCE_TYPE_RE, NAME_RE, S3_URL_RE, http_url
from dlinfra.spec.input import StrictModel, shown
from dlinfra.spec.layers import ModelSpec
from dlinfra.spec.preflight import PreflightSpec, StragglerSpec, preflight_shorthand
from dlinfra.spec.requirements import FORM_FIX as REQUIREMENT_FIX
from dlinfra.spec.requirements import problem as requirement_problem
from dlinfra.spec.spot import SpotPolicy, SpotSpec, spot_shorthand

STORE_SCHEMES = ("file://", "s3://")

PositiveInt = Annotated[int, Field(ge=1)]
HOUR = 3600
DAY = 24 * HOUR
MAX_COUNT = 10**9  # steps and step intervals: far past any run, well inside every integer type


class ChiefSpec(StrictModel):
    instance_type: str = Field(
        "m5.xlarge",
        pattern=INSTANCE_TYPE_RE,
        description="EC2 type of the chief (aws), family.size like m5.xlarge.",
    )


MAX_GPUS = 16


def _auto_or_count(low: int, high: int, unit: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be auto or a whole number of {unit} from {low} to {high} (got {value!r})")
        return value

    return check


GpuCount = Annotated[int | Literal["auto"], BeforeValidator(_auto_or_count(0, MAX_GPUS, "GPUs"))]
StepsPerCall = Annotated[int | Literal["auto"], BeforeValidator(_auto_or_count(1, 1000, "steps"))]


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
        description="Seconds without a training step, every node alive, before the run is stalled.",
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


# ---------------------------------------------------------------- training


OUTPUTS_MAX_GB = 20.0


class TrainingSpec(StrictModel):
    model: ModelSpec = ModelSpec()
    dataset: DatasetSpec = DatasetSpec()
    entrypoint: str | None = Field(
        None,
        description="User code 'path/to/file.py:function' returning a dlinfra.training.program.Program, "
        "trained by dlinfra's loop. One of entrypoint or command.",
    )
    command: list[str] | None = Field(
        None,
        min_length=1,
        description="Script mode: the program every node runs as it is, e.g. [python, train.py, --epochs, "
        "'3'], from the experiment file's directory, with TF_CONFIG and the DLINFRA_* variables set "
        "(README: Bring your own script). One of entrypoint or command.",
    )
    outputs_max_gb: float = Field(
        OUTPUTS_MAX_GB,
        gt=0,
        le=100_000,
        description="Script mode: the most a script's model, checkpoint or TensorBoard directory may hold "
        "(GB, sparse files at their full length) for the node to upload it; past it the run fails naming "
        "this field. Only regular files under a directory are uploaded: a link out of it is refused.",
    )
    requirements: list[str] = Field(
        default_factory=list,
        description="Packages the entrypoint imports beyond dlinfra's own (PEP 508 strings), or the path "
        "of a requirements file beside the experiment file. Locked with hashes once per run.",
    )
    batch_size: int = Field(
        64,
        ge=1,
        le=65536,
        description="Examples per step on each replica (a worker has one replica per GPU, or one on CPU).",
    )
    steps: int = Field(600, ge=1, le=MAX_COUNT, description="Total optimizer steps (global).")
    learning_rate: float = Field(0.003, gt=0, le=10)
    optimizer: Literal["adam", "sgd", "rmsprop", "adagrad"] = Field(
        "adam",
        description="Keras optimizer at learning_rate, its defaults otherwise; sgd is SGD with momentum 0.9.",
    )
    seed: int = Field(
        42, ge=0, le=2**31 - 1, description="Seed of every random stream (NumPy takes 32 bits)."
    )
    checkpoint_every: int = Field(200, ge=1, le=MAX_COUNT, description="Steps between checkpoints.")
    log_every: int = Field(20, ge=1, le=MAX_COUNT, description="Steps between progress reports.")
    steps_per_execution: StepsPerCall = Field(
        10, description="parameter_server: steps per remote call, at most log_every (auto: ~1 s of compute)."
    )
    deterministic: bool = Field(False, description="TF op determinism and fixed seeds.")
    mixed_precision: bool = Field(
        False, description="Keras mixed_float16 on the GPU workers (refused when no worker has a GPU)."
    )
    jit_compile: bool = Field(
        False,
        description="multi_worker_mirrored: compile each replica's forward and backward pass with XLA "
        "(a compile before the first step; 0.6x on ResNet-20 on our 2-core CPU: see BENCHMARKS.md).",
    )
    lr_scaling: Literal["none", "linear"] = Field(
        "none",
        description="multi_worker_mirrored: linear multiplies learning_rate by the replica count "
        "(the global batch grows with it); none uses it as given.",
    )

    pass_env: list[str] = Field(
        default_factory=list, max_length=pass_env.MAX_NAMES, description=pass_env.DESCRIPTION
    )

    @field_validator("pass_env")
    @classmethod
    def _pass_env_names(cls, v: list[str]) -> list[str]:
        if problems := pass_env.problems(v):
            raise ValueError(
                f"{'; '.join(problems)}. Fix: name variables of your shell, e.g. [WANDB_API_KEY]"
            )
        return v

    @field_validator("requirements")
    @classmethod
    def _requirements_form(cls, v: list[str]) -> list[str]:
        problems = [
            f"[{i}] {shown(text)} {why}" for i, text in enumerate(v) if (why := requirement_problem(text))
        ]
        if problems:
            raise ValueError(f"{'; '.join(problems)}. Fix: {REQUIREMENT_FIX}")
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _command_words(cls, v: Any) -> Any:
        """YAML reads `--epochs, 3` as a number: numbers are taken as the words they were written as."""
        if isinstance(v, str):
            raise ValueError(
                f"must be a list of words, not one string (got {shown(v)}). Fix: command: "
                f"{v.split()!r}, as the script's argv"
            )
        if isinstance(v, list):
            return [str(a) if isinstance(a, int | float) and not isinstance(a, bool) else a for a in v]
        return v

    @field_validator("command")
    @classmethod
    def _command_form(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v[0].strip() or any("\0" in arg for arg in v)):
            raise ValueError(f"needs a program to run first, e.g. [python, train.py] (got {shown(v)})")
        return v

    @model_validator(mode="after")
    def _one_program(self) -> TrainingSpec:
        if self.entrypoint and self.command:
            raise ValueError(
                "entrypoint and command are both set: give one. Fix: entrypoint for a Program that "
                "dlinfra's loop trains, command to run your own training script as it is"
            )
        if self.command and self.dataset.cache_gb is not None:
            raise ValueError(
                "dataset.cache_gb streams files to Shard.records(); a script reads "
                "$DLINFRA_TRAIN_FILES, staged whole. Fix: remove cache_gb, or train with a Program "
                "(training.entrypoint)"
            )
        # its default is written out with every spec and node config: only another value is refused
        if self.outputs_max_gb != OUTPUTS_MAX_GB and not self.command:
            raise ValueError(
                "outputs_max_gb caps what a script's directories upload; without training.command "
                "dlinfra's loop writes the model itself. Fix: remove outputs_max_gb, or set command"
            )
        return self

    @model_validator(mode="after")
    def _builtin_reads_the_data(self) -> TrainingSpec:
        if not (self.entrypoint or self.command) and (problem := self.dataset.builtin_problem()):
            raise ValueError(problem)  # deploy refused it once the files were listed; validate passed it
        return self

    def dispatches_files(self, strategy: str) -> bool:
        """Parameter-server workers take train files as they are free, from a tf.data dispatcher on
        the chief, instead of a fixed share each: of packed or listed TFRecords that dlinfra reads
        (Shard.records(), the built-in model). A script reads its staged share its own way."""
        ds = self.dataset
        return strategy == "parameter_server" and ds.format == "tfrecord" and not self.command

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"must look like 'path/to/file.py:function' (got {shown(v)})")
        return v


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

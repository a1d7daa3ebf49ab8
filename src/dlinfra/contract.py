"""The node contract: what a node is given (NodeConfig), how it finds its peers (TF_CONFIG), and what
its exit code tells its supervisor. The renderer writes it, the agent and the trainer read it."""

from __future__ import annotations

import ipaddress
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dlinfra import __version__
from dlinfra.spec.model import Spec
from dlinfra.spec.training import TrainingSpec

NODE_JSON_PATH = "/etc/dlinfra/node.json"

# How a node agent ends. systemd on EC2 (`RestartPreventExitStatus`) and the local launcher restart
# whatever did not end with one of the FINAL codes (see node.supervision).
EXIT_DONE = 0
EXIT_FAILED = 1  # the run failed (user code, data, too many restarts): restarting cannot help
EXIT_USAGE = 2  # bad node config or flags
EXIT_STOPPED = 3  # the watchdog fired: max_runtime, or the budget (cluster.max_cost)
EXIT_RETRY = 75  # EX_TEMPFAIL: a peer went away; start me again and I resume from the checkpoint
# A spot notice: the machine is being reclaimed. Starting the node again on it is pointless; the watcher
# (or, locally, the launcher) starts a replacement elsewhere instead.
EXIT_INTERRUPTED = 76
FINAL_EXIT_CODES = (EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED)
# What a supervisor on the node's own machine (systemd) must not restart; the machine powers off.
NO_RESTART_EXIT_CODES = (*FINAL_EXIT_CODES, EXIT_INTERRUPTED)

# Where a node's seconds before its first step go, in the order a node reaches them; each life of a
# node records when it reached each one in its status, and the CLI puts them on the command's clock.
LOCK_PATH = "/etc/dlinfra/env.lock"  # where a booted node keeps the lock it installed

# At the budget the run checkpoints, then stops: the longest it waits for that checkpoint.
BUDGET_CHECKPOINT_SECONDS = 120.0
PREFLIGHT_ONLY = "preflight only"  # the DONE marker's reason for a run of `dlinfra preflight`

PHASES = ("spawned", "up", "tensorflow", "preflight", "peers", "program", "first step")
# On aws the nodes' security group opens the TF port and the next two: the chief's tf.data dispatcher,
# then every node's preflight link sink.
DISPATCHER_PORT_OFFSET = 1
PREFLIGHT_PORT_OFFSET = 2
# In a parameter-server worker's work dir (its cwd): its index, which the chief's remote calls read
# where they run to say which worker ran them.
WORKER_INDEX_FILE = "dlinfra-worker-index"


class StoreConfig(BaseModel):
    """Where a run's results go. Never carries credentials: nodes use their own (instance profile)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    endpoint_url: str | None = None
    region: str | None = None

    @classmethod
    def for_run(cls, spec: Spec, url: str) -> StoreConfig:
        """S3 stores use the spec's S3 endpoint, else the AWS emulator endpoint, and the AWS region."""
        if not url.startswith("s3://"):
            return cls(url=url)
        return cls(
            url=url, endpoint_url=spec.storage.endpoint_url or spec.aws.endpoint_url, region=spec.aws.region
        )


# The order TF_CONFIG lists a cluster's jobs in (and the address plan numbers them in).
ROLE_ORDER = ("chief", "worker", "ps")


class SubnetLayout(BaseModel):
    """A cluster of fixed private IPs, told by its rule instead of its list: each role's nodes take
    consecutive host numbers from its block's first (`offsets`), all on one port. A node expands it
    itself (`addresses`), so its user-data stays the same size at 3 workers and at 3000."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subnet: str
    port: int = Field(ge=1, le=65535)
    offsets: dict[str, int]
    counts: dict[str, int]

    def hosts(self) -> list[tuple[str, int, str]]:
        """(role, index, private IP) of every node, roles in TF_CONFIG order."""
        base = ipaddress.IPv4Network(self.subnet).network_address
        return [
            (role, i, str(base + self.offsets[role] + i))
            for role in ROLE_ORDER
            for i in range(self.counts.get(role, 0))
        ]

    def addresses(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for role, _, host in self.hosts():
            out.setdefault(role, []).append(f"{host}:{self.port}")
        return out


class Budget(BaseModel):
    """cluster.max_cost against the whole cluster's price from the catalog (its nodes and a NAT
    gateway): what each node's watchdog stops the run at, counted from the node's first start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_cost: float  # USD
    usd_per_hour: float  # every node of the cluster, and what the network bills by the hour

    @property
    def seconds(self) -> float:
        return self.max_cost / self.usd_per_hour * 3600


class PreflightPlan(BaseModel):
    """cluster.preflight, resolved for the target (see spec.preflight)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checks: Literal["quick", "full"]
    min_ratio: float
    on_fail: Literal["replace", "fail", "warn"]
    port: int = Field(ge=0, le=65535)  # the node's link sink; 0: any free one (nodes sharing a host)
    only: bool = False  # stop after the checks (`dlinfra preflight`)


class NodeConfig(BaseModel):
    """Written to /etc/dlinfra/node.json by cloud-init; read by `dlinfra node run`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dlinfra_version: str = __version__
    run_id: str
    role: Literal["chief", "worker", "ps"]
    index: int
    strategy: Literal["parameter_server", "multi_worker_mirrored"]
    # Every node's address: the rule on AWS (fixed IPs), the list where ports are drawn (local).
    cluster: SubnetLayout | dict[str, list[str]]
    store: StoreConfig
    training: TrainingSpec
    data: StoreConfig | None = None  # where a packed data set's shards are (training.dataset.uri)
    # host:port of the chief's tf.data dispatcher, where parameter-server workers take train files as
    # they are free (TrainingSpec.dispatches_files); None: each worker reads a fixed share
    dispatcher: str | None = None
    entrypoint: str | None = None  # 'file.py:function' inside the code bundle
    bundle: str | None = None  # sha256 of the code bundle in the run's store
    startup_timeout: float
    heartbeat_interval: float
    max_runtime: float
    budget: Budget | None = None  # cluster.max_cost on a priced target
    max_restarts: int = 5
    instance_type: str | None = None  # what the node runs on (None: a process on the deploying machine)
    gpus: int = 0  # GPUs the node trains on; it fails at once if TensorFlow sees fewer
    gpu_offset: int = 0  # its first GPU among its machine's (nodes sharing a machine split its GPUs)
    spot: bool = False  # on spot capacity: its beacon watches the instance metadata for notices
    act_on_rebalance: bool = False  # a rebalance recommendation is treated as an interruption notice
    spot_in_cluster: bool = False  # some node is spot: the chief's beacon relays their notices to it
    # sha256 of the environment lock this node runs (its flavor's; None: nothing to check against)
    lock_sha256: str | None = None
    preflight: PreflightPlan | None = None  # None: no checks before the first step

    @property
    def runs_for(self) -> float:
        """Seconds after its first start by which this node's watchdog has stopped it: max_runtime, or
        the budget's end and the checkpoint taken then."""
        if self.budget is None:
            return self.max_runtime
        return min(self.max_runtime, self.budget.seconds + BUDGET_CHECKPOINT_SECONDS)

    @property
    def flavor(self) -> Literal["cpu", "gpu"]:
        """The build of TensorFlow it runs: the GPU one only where it trains on GPUs."""
        return "gpu" if self.gpus else "cpu"

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def is_chief(self) -> bool:
        """The node that trains (ps strategy) or saves (mirrored: worker 0)."""
        if self.strategy == "multi_worker_mirrored":
            return self.role == "worker" and self.index == 0
        return self.role == "chief"

    @property
    def takes_dispatched_files(self) -> bool:
        """A parameter-server worker that takes train files from the chief's dispatcher."""
        return self.dispatcher is not None and self.role == "worker"

    @property
    def chief_name(self) -> str:
        """The node that saves checkpoints (see is_chief)."""
        return "worker-0" if self.strategy == "multi_worker_mirrored" else "chief-0"

    def default_work_dir(self) -> Path:
        """Local scratch (checkpoints, model, the trainer's state file) when none is given."""
        return Path(tempfile.gettempdir()) / "dlinfra" / self.run_id / self.name

    @property
    def peers(self) -> dict[str, list[str]]:
        """The TF cluster map: job name → addresses ordered by task index."""
        return self.cluster.addresses() if isinstance(self.cluster, SubnetLayout) else self.cluster

    @property
    def address(self) -> str:
        """host:port this node serves TensorFlow on."""
        return self.peers[self.role][self.index]

    @property
    def num_workers(self) -> int:
        if isinstance(self.cluster, SubnetLayout):
            return self.cluster.counts.get("worker", 0)
        return len(self.cluster.get("worker", []))


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> dict[str, Any]:
    """The TF_CONFIG dict TensorFlow's cluster resolver reads."""
    if role not in cluster:
        raise ValueError(f"role {role!r} is not in the cluster ({', '.join(cluster)})")
    if not 0 <= index < len(cluster[role]):
        raise ValueError(f"{role} index {index} out of range 0..{len(cluster[role]) - 1}")
    return {
        "cluster": {job: list(addrs) for job, addrs in cluster.items()},
        "task": {"type": role, "index": index},
    }

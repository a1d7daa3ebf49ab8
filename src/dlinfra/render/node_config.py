"""NodeConfig: everything one node needs to join its cluster; TF_CONFIG is a pure function of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from dlinfra import __version__
from dlinfra.render.addresses import AddressPlan
from dlinfra.spec import Spec, TrainingSpec

if TYPE_CHECKING:
    from dlinfra.bundle import Bundle


class StoreConfig(BaseModel):
    """Where this run's results go. Never carries credentials: nodes use their own (instance profile)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    endpoint_url: str | None = None
    region: str | None = None


class NodeConfig(BaseModel):
    """Written to /etc/dlinfra/node.json by cloud-init; read by `dlinfra node run`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dlinfra_version: str = __version__
    run_id: str
    role: Literal["chief", "worker", "ps"]
    index: int
    strategy: Literal["parameter_server", "multi_worker_mirrored"]
    cluster: dict[str, list[str]]
    store: StoreConfig
    training: TrainingSpec
    entrypoint: str | None = None  # 'file.py:function' inside the code bundle
    bundle: str | None = None  # sha256 of the code bundle in the store (code/bundle-<sha256>.tar.gz)
    startup_timeout: float
    heartbeat_interval: float
    max_runtime: float
    max_restarts: int = 5

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
    def num_workers(self) -> int:
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


def store_config(spec: Spec, url: str) -> StoreConfig:
    """S3 stores use the spec's S3 endpoint, else the AWS emulator endpoint, and the AWS region."""
    if not url.startswith("s3://"):
        return StoreConfig(url=url)
    return StoreConfig(
        url=url, endpoint_url=spec.storage.endpoint_url or spec.aws.endpoint_url, region=spec.aws.region
    )


def build_node_configs(
    spec: Spec, run_id: str, store_url: str, plan: AddressPlan, code: Bundle | None = None
) -> dict[str, NodeConfig]:
    store = store_config(spec, store_url)
    cluster = plan.cluster()
    # Heartbeats come several times per timeout so one slow write is never read as a lost node.
    heartbeat = max(1.0, min(10.0, spec.cluster.heartbeat_timeout / 4))
    return {
        node.name: NodeConfig(
            run_id=run_id,
            role=node.role,  # type: ignore[arg-type]
            index=node.index,
            strategy=spec.strategy,
            cluster=cluster,
            store=store,
            training=spec.training,
            entrypoint=code.entrypoint if code else None,
            bundle=code.sha256 if code else None,
            startup_timeout=spec.cluster.startup_timeout,
            heartbeat_interval=heartbeat,
            max_runtime=spec.cluster.max_runtime,
            max_restarts=spec.cluster.max_restarts,
        )
        for node in plan
    }

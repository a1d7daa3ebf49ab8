"""The node config of a lone multi_worker_mirrored worker (no TF_CONFIG: no server, no port), for the
scripts here that run the training loop directly in a fresh process."""

from pathlib import Path

from dlinfra.contract import NodeConfig, StoreConfig
from dlinfra.spec.training import TrainingSpec


def lone_worker(training: TrainingSpec, work: Path) -> NodeConfig:
    return NodeConfig(
        run_id="r",
        role="worker",
        index=0,
        strategy="multi_worker_mirrored",
        cluster={"worker": ["127.0.0.1:1"]},
        store=StoreConfig(url=f"file://{work}/store"),
        training=training,
        startup_timeout=30,
        heartbeat_interval=5,
        max_runtime=300,
    )

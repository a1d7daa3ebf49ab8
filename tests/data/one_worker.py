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


def in_process_chief(training: TrainingSpec, work: Path, workers: int = 2) -> NodeConfig:
    """The chief of a parameter-server cluster whose workers and ps are TensorFlow servers in this
    process, on free loopback ports: the real strategy, coordinator and remote calls, without a
    deploy. Its TF_CONFIG is set; the workers' cwd (this one) holds their index."""
    import json
    import os

    import tensorflow as tf

    from dlinfra.contract import WORKER_INDEX_FILE
    from dlinfra.render.addresses import free_ports

    ports = [f"localhost:{port}" for port in free_ports(workers + 2)]
    cluster = {"chief": ports[:1], "ps": ports[1:2], "worker": ports[2:]}
    threads = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)  # fewer may hang (TF's note)
    for job in ("ps", "worker"):
        for index in range(len(cluster[job])):
            tf.distribute.Server(cluster, job_name=job, task_index=index, config=threads, start=True)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    Path(WORKER_INDEX_FILE).write_text("0", encoding="utf-8")  # both workers count in row 0
    return NodeConfig(
        run_id="r",
        role="chief",
        index=0,
        strategy="parameter_server",
        cluster=cluster,
        store=StoreConfig(url=f"file://{work}/store"),
        training=training,
        startup_timeout=30,
        heartbeat_interval=5,
        max_runtime=300,
    )

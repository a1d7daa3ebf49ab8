"""A node's progress report (node.reporting.Progress) outside a run, for the loop-cost benches: on a
status and a file store in a directory of its own, its log line to a file, line-buffered, as a node's
stdout is. Only the chief writes TensorBoard scalars (and syncs them to the store)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def node_reporter(work: Path, role: str, index: int, strategy: str) -> Callable[..., None]:
    """`report(step, loss, examples/s, input wait)` as node `role`-`index` of a run of `strategy`."""
    from dlinfra.contract import NodeConfig, StoreConfig
    from dlinfra.node.reporting import Progress
    from dlinfra.node.status import NodeStatus
    from dlinfra.runs.layout import RunStore
    from dlinfra.spec.training import TrainingSpec

    cluster = {"worker": ["localhost:1", "localhost:2"]}
    if strategy == "parameter_server":
        cluster |= {"chief": ["localhost:3"], "ps": ["localhost:4"]}
    work.mkdir(parents=True, exist_ok=True)
    cfg = NodeConfig(
        run_id="bench",
        role=role,
        index=index,
        strategy=strategy,
        cluster=cluster,
        store=StoreConfig(url=f"file://{work / 'store'}"),
        training=TrainingSpec(steps=10**9),
        startup_timeout=60,
        heartbeat_interval=1,
        max_runtime=60,
    )
    store = RunStore.open(cfg.store)
    log = (work / "node.log").open("a", buffering=1)
    status = NodeStatus(store, cfg.name, cfg.role, cfg.index, work)
    return Progress(cfg, store, status, work, log=log).report

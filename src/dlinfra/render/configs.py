"""From a resolved spec and its address plan to every node's NodeConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlinfra.contract import Budget, NodeConfig, StoreConfig
from dlinfra.render.addresses import AddressPlan
from dlinfra.spec.hardware import cluster_hardware
from dlinfra.spec.model import Spec

if TYPE_CHECKING:
    from dlinfra.runs.bundle import Bundle


def build_node_configs(
    spec: Spec,
    run_id: str,
    store: StoreConfig,
    plan: AddressPlan,
    code: Bundle | None = None,
    *,
    typed: bool,
    usd_per_hour: float = 0.0,
) -> dict[str, NodeConfig]:
    """`typed`: the target runs each node on its instance type (see hardware). `usd_per_hour`: what
    the whole cluster costs (Target.hourly_cost), which cluster.max_cost is kept against."""
    cluster = plan.description()
    # Heartbeats come several times per timeout so one slow write is never read as a lost node.
    heartbeat = max(1.0, min(10.0, spec.cluster.heartbeat_timeout / 4))
    hardware = cluster_hardware(spec, typed)
    dataset = spec.training.dataset
    data = StoreConfig.for_run(spec, dataset.uri) if dataset.staged and dataset.uri else None
    shapes = spec.roles()
    # Nodes that share a machine (local processes) take consecutive slices of its GPUs.
    gpu_offset: dict[str, int] = {}
    taken: dict[str, int] = {}
    cap = spec.cluster.max_cost
    budget = Budget(max_cost=cap, usd_per_hour=usd_per_hour) if cap is not None and usd_per_hour > 0 else None
    for node in plan:
        gpu_offset[node.name] = taken.get(node.host, 0)
        taken[node.host] = gpu_offset[node.name] + hardware[node.role].gpus
    return {
        node.name: NodeConfig(
            run_id=run_id,
            role=node.role,
            index=node.index,
            strategy=spec.strategy,
            cluster=cluster,
            store=store,
            training=spec.training,
            data=data,
            dispatcher=plan.dispatcher if spec.training.dispatches_files(spec.strategy) else None,
            entrypoint=code.entrypoint if code else None,
            bundle=code.sha256 if code else None,
            startup_timeout=spec.cluster.startup_timeout,
            heartbeat_interval=heartbeat,
            max_runtime=spec.cluster.max_runtime,
            budget=budget,
            max_restarts=spec.cluster.max_restarts,
            instance_type=hardware[node.role].instance_type if typed else None,
            gpus=hardware[node.role].gpus,
            gpu_offset=gpu_offset[node.name],
            spot=shapes[node.role].spot,
            act_on_rebalance=spec.cluster.spot.act_on_rebalance,
            spot_in_cluster=any(shape.spot for shape in shapes.values()),
        )
        for node in plan
    }

"""From a resolved spec and its address plan to every node's NodeConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlinfra.contract import (
    PREFLIGHT_PORT_OFFSET,
    Budget,
    NodeConfig,
    PreflightPlan,
    StoreConfig,
    SubnetLayout,
)
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
    own_machines: bool = False,
    usd_per_hour: float = 0.0,
) -> dict[str, NodeConfig]:
    """`typed`: the target runs each node on its instance type (see hardware); `own_machines`: each
    on a machine of its own (Target.own_machines). `usd_per_hour`: what the whole cluster costs
    (Target.hourly_cost), which cluster.max_cost is kept against."""
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
    preflight = _preflight(spec, cluster, typed, own_machines)
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
            preflight=preflight,
        )
        for node in plan
    }


def settle_preflight(spec: Spec, typed: bool, own_machines: bool) -> Spec:
    """cluster.preflight's defaults made explicit. Nodes on machines of their own are checked by
    default; processes sharing one machine are not (their figures measure its scheduler). A flagged
    node is replaced where the target replaces instances (emulated ones too), else it fails the run:
    another process is the same machine."""
    asked = spec.cluster.preflight
    settled = asked.model_copy(
        update={
            "checks": asked.checks or ("quick" if own_machines else "off"),
            "on_fail": asked.on_fail or ("replace" if typed else "fail"),
        }
    )
    return spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"preflight": settled})})


def _preflight(
    spec: Spec, cluster: SubnetLayout | dict[str, list[str]], typed: bool, own_machines: bool
) -> PreflightPlan | None:
    asked = settle_preflight(spec, typed, own_machines).cluster.preflight
    if asked.checks == "off":
        return None
    assert asked.on_fail is not None and asked.checks is not None
    port = cluster.port + PREFLIGHT_PORT_OFFSET if isinstance(cluster, SubnetLayout) else 0
    return PreflightPlan(
        checks=asked.checks, min_ratio=asked.min_ratio, on_fail=asked.on_fail, port=port, only=asked.only
    )

"""A node's preflight (cluster.preflight): before the first step, every node measures its device, its
links to its peers and its input, and lists its versions, all nodes at once (under mirrored, then
the strategy's all-reduce, every worker in it); the chief judges the figures (runs.preflight) and
says whether the run trains, replaces the flagged nodes, or fails.

The store is the rendezvous. A round is `preflight/<round>/`: each node first writes a record naming
its link sink, measures once every node of the round has, then writes its figures; the chief writes
the round's verdict. A node that is replaced (EXIT_INTERRUPTED, as after a spot notice) comes back
into the next round, and the others re-measure with it (under mirrored from a restart: the strategy
they formed holds the node that left); a node flagged again fails the run.

Where it runs: under parameter servers before the node serves or the chief connects, under
multi_worker_mirrored once the strategy is made (TensorFlow configures collectives before any op).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dlinfra.contract import (
    EXIT_DONE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RETRY,
    PREFLIGHT_ONLY,
    NodeConfig,
    PreflightPlan,
)
from dlinfra.errors import DlinfraError
from dlinfra.node.measure import (
    EFFORT,
    Effort,
    Sink,
    allreduce_figures,
    cpu_quota,
    device_figures,
    gradient_bytes,
    input_figures,
    link_peers,
    machine_id,
    measure_link,
    versions,
)
from dlinfra.node.status import NodeStatus
from dlinfra.node.tensorflow_import import import_tensorflow
from dlinfra.runs.layout import RunStore
from dlinfra.runs.preflight import NodeFigures, Verdict, action, judge

if TYPE_CHECKING:
    from dlinfra.training.program import Program

POLL_SECONDS = 0.5


class PreflightTimeout(DlinfraError):
    pass


# The strategy's all-reduce at the effort's size (measure.allreduce_figures), under multi_worker_mirrored
AllReduce = Callable[[Effort], dict[str, float]]


def run(
    cfg: NodeConfig, store: RunStore, status: NodeStatus, mirrored: tuple[Any, Program] | None = None
) -> int | None:
    """This node's part of cluster.preflight; an exit code when it must not go on to train or serve.
    `mirrored`: the strategy made and the program loaded, whose all-reduce is measured at the size of
    its model's gradient."""
    if cfg.preflight is None:
        return None
    import_tensorflow()  # a serving node measures with all of it (see node.serving)
    allreduce = None
    if mirrored is not None:
        strategy, program = mirrored
        allreduce = functools.partial(allreduce_figures, strategy, gradient_bytes(program.build_model))
    then, verdict = check(cfg, store, lambda state: status.update(state=state), allreduce)
    status.mark("preflight")
    said = verdict.says() if verdict else "preflight passed"
    print(said, flush=True)
    if then == "leave":  # replaced like a reclaimed spot node: elsewhere, not restarted in place
        status.stop(state="interrupted", error=said)
        return EXIT_INTERRUPTED
    if then == "fail":
        status.stop(state="failed", error=said)
        return EXIT_FAILED
    if then == "rejoin":  # a strategy formed with the replaced node: a fresh one, with its replacement
        print("restarting to form the strategy with the replacements", flush=True)
        status.stop(state="lost peer", error=said)
        return EXIT_RETRY
    if cfg.preflight.only:  # `dlinfra preflight`: the checks were the run
        if cfg.is_chief:
            store.write_marker("DONE", node=cfg.name, reason=PREFLIGHT_ONLY)
        status.stop(state="done")
        return EXIT_DONE
    return None


def check(
    cfg: NodeConfig, store: RunStore, on_state: Callable[[str], None], allreduce: AllReduce | None = None
) -> tuple[str, Verdict | None]:
    """Run this node's part of preflight; (what it does next: train | leave | rejoin | fail, the
    verdict)."""
    plan = cfg.preflight
    assert plan is not None
    round_, settled = _round(store)
    if settled is not None:  # passed before this life (a restart): not again
        return "train", settled
    sink = Sink(cfg.address.rpartition(":")[0], plan.port)
    names = [f"{role}-{i}" for role, addrs in cfg.peers.items() for i in range(len(addrs))]
    try:
        mine = NodeFigures(
            node=cfg.name,
            role=cfg.role,
            flavor=cfg.flavor,
            instance_type=cfg.instance_type,
            machine=machine_id(),
            sink=sink.address,
        )
        store.put_preflight(round_, mine)
        on_state(f"preflight round {round_}: waiting for every node")
        # A later round waits for a replacement instance to boot as well.
        timeout = cfg.startup_timeout * (1 if round_ == 1 else 3)
        ready = _wait(
            store, round_, lambda found, _: set(names) <= set(found), timeout, "every node to be ready"
        )[0]
        effort = EFFORT[plan.checks]
        # Nodes sharing a machine (local processes, emulated instances) measure in turn, in cluster
        # order: at once, each would measure its share of the machine, which moves with its load.
        before = [n for n in names[: names.index(cfg.name)] if ready[n].machine == mine.machine]
        if before:
            on_state(f"preflight round {round_}: waiting for {before[-1]} to measure (one machine)")
            _wait(
                store,
                round_,
                lambda f, _: all(f[n].measured for n in before),
                timeout,
                f"{before[-1]} to measure",
            )
        on_state(f"preflight round {round_}: measuring")
        started = time.monotonic()
        measured = mine.model_copy(
            update={
                "measured": True,
                "cpu_quota": cpu_quota(),
                "figures": {**device_figures(cfg, effort), **input_figures(cfg, effort)},
                "links": [measure_link(peer, ready[peer].sink, effort) for peer in link_peers(cfg)],
                "versions": versions(cfg.gpus),
            }
        )
        measured.seconds = round(time.monotonic() - started, 2)
        store.put_preflight(round_, measured)
        if allreduce is not None:
            # A collective takes every worker at once: after every turn, so that no node measures its
            # device while the others still run one (its trace, its gRPC threads).
            on_state(f"preflight round {round_}: all-reduce with every worker")
            _wait(
                store,
                round_,
                lambda f, _: all(f[n].measured for n in names),
                timeout,
                "every node to measure",
            )
            started = time.monotonic()
            measured.figures |= allreduce(effort)
            measured.seconds = round(measured.seconds + time.monotonic() - started, 2)
        measured.done = True
        store.put_preflight(round_, measured)
        on_state(f"preflight round {round_}: waiting for the verdict")
        if cfg.is_chief:
            verdict = _judge(cfg, plan, store, round_, names, timeout)
        else:
            said = _wait(store, round_, lambda _, v: v is not None, timeout, "the chief's verdict")[1]
            assert said is not None
            verdict = said
    finally:
        sink.close()
    if verdict.action == "replace" and cfg.name in verdict.flagged_nodes:
        return "leave", verdict
    if verdict.action == "replace" and allreduce is not None:
        return "rejoin", verdict  # the next round from a new strategy (the next life's)
    if verdict.action == "replace":  # the others measure again with the replacements
        return check(cfg, store, on_state, allreduce)
    return ("fail" if verdict.action == "fail" else "train"), verdict


def _round(store: RunStore) -> tuple[int, Verdict | None]:
    """The round this life joins, or the verdict that already let the run train."""
    last = store.preflight_rounds()
    if last == 0:
        return 1, None
    _, verdict = store.preflight_round(last)
    if verdict is None:
        return last, None
    if verdict.action == "replace":
        return last + 1, None
    return last, verdict


def _judge(
    cfg: NodeConfig, plan: PreflightPlan, store: RunStore, round_: int, names: list[str], timeout: float
) -> Verdict:
    found = _wait(
        store,
        round_,
        lambda f, _: all(n in f and f[n].done for n in names),
        timeout,
        "every node to measure",
    )[0]
    records = [found[n] for n in names]
    replaced = _replaced(store, round_)
    flags = judge(records, plan.min_ratio, store.preflight_history())
    verdict = Verdict(
        round=round_,
        action=action(flags, plan.on_fail, replaced),
        flagged=flags,
        min_ratio=plan.min_ratio,
        checks=plan.checks,
        seconds=max(r.seconds or 0 for r in records),
    )
    store.put_preflight(round_, verdict)
    if verdict.action == "fail":
        store.write_marker("FAILED", node=cfg.name, verdict="preflight", error=verdict.says())
    return verdict


def _replaced(store: RunStore, round_: int) -> set[str]:
    out: set[str] = set()
    for earlier in range(1, round_):
        _, verdict = store.preflight_round(earlier)
        if verdict is not None and verdict.action == "replace":
            out |= set(verdict.flagged_nodes)
    return out


def _wait(
    store: RunStore,
    round_: int,
    done: Callable[[dict[str, NodeFigures], Verdict | None], bool],
    timeout: float,
    what: str,
) -> tuple[dict[str, NodeFigures], Verdict | None]:
    deadline = time.monotonic() + timeout
    while True:
        found, verdict = store.preflight_round(round_)
        if done(found, verdict):
            return found, verdict
        if (marker := store.marker()) is not None:
            raise PreflightTimeout(f"the run ended ({marker.marker}) during preflight")
        if time.monotonic() > deadline:
            raise PreflightTimeout(
                f"preflight round {round_}: waited {timeout:.0f}s for {what}; "
                f"have {', '.join(sorted(found)) or 'none'}. Fix: check the missing nodes' logs "
                "(`dlinfra logs RUN --node NAME`)"
            )
        time.sleep(POLL_SECONDS)

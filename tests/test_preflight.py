"""Preflight without a cluster: the judgement on figures (a pure function), and each measurement
on the real thing (versions of two real interpreters, a real TCP link, a real cgroup quota)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from dlinfra import watching
from dlinfra.contract import PreflightPlan
from dlinfra.node.measure import (
    DEFAULT_GRADIENT_BYTES,
    Effort,
    Sink,
    _best_rate,
    cpu_quota,
    gradient_bytes,
    measure_link,
)
from dlinfra.render import build_node_configs
from dlinfra.runs.preflight import Link, NodeFigures, action, figures, judge, table
from dlinfra.runs.records import NodeState
from dlinfra.runs.stragglers import Straggler, StragglerWatch
from dlinfra.spec.loading import load_spec
from dlinfra.spec.model import Spec
from dlinfra.targets import target_for
from dlinfra.targets.aws.healing import InstanceCluster
from dlinfra.targets.base import Replaces, TargetOptions
from dlinfra.targets.local import AttachedNodes, LocalCluster
from support import cgroup_cpu_limit, run_cli, store_config

FAST = Effort(
    windows=1,
    window_seconds=0.05,
    matrix=64,
    link_bytes=4 << 20,
    link_seconds=5.0,
    pings=5,
    input_bytes=1 << 20,
    reductions=1,
)


def node(name: str, gemm: float | None = 40.0, machine: str = "m", **extra) -> NodeFigures:
    role = name.rpartition("-")[0]
    figures = {} if gemm is None else {"gemm_gflops": gemm, "conv_gflops": gemm}
    return NodeFigures(
        node=name,
        role=role,
        flavor="cpu",
        machine=machine,
        sink=f"10.0.0.{len(name)}:2224",
        measured=True,
        figures=figures,
        **extra,
    )


def test_a_node_below_the_ratio_of_its_roles_median_is_flagged_and_no_other():
    records = [node("chief-0", 10.0), node("worker-0", 40.0), node("worker-1", 41.0), node("worker-2", 25.0)]
    flags = judge(records, 0.8)
    assert {(f.node, f.figure) for f in flags} == {("worker-2", "gemm_gflops"), ("worker-2", "conv_gflops")}
    gemm = next(f for f in flags if f.figure == "gemm_gflops")
    assert gemm.reference == 40.0 and gemm.ratio == pytest.approx(25 / 40)
    assert gemm.says() == "worker-2: gemm 25 GFLOP/s, 0.62 of its role's median (40 GFLOP/s)"
    # the chief is alone in its role: a quarter of the workers' figure is no peer judgement
    assert not judge([node("chief-0", 10.0), node("worker-0", 40.0), node("worker-1", 40.0)], 0.8)


def test_a_uniformly_slow_cluster_is_caught_by_its_types_history_alone():
    slow = [
        node("worker-0", 20.0, instance_type="m5.xlarge"),
        node("worker-1", 21.0, instance_type="m5.xlarge"),
    ]
    assert not judge(slow, 0.8), "no peer stands out"
    flags = judge(slow, 0.8, {"m5.xlarge": {"gemm_gflops": 40.0}})
    assert {(f.node, f.against) for f in flags} == {("worker-0", "history"), ("worker-1", "history")}
    assert "its type's baseline (40 GFLOP/s)" in flags[0].says()
    assert not judge(slow, 0.8, {"c5.xlarge": {"gemm_gflops": 40.0}}), "another type's history"


def _link(peer: str, mb_s: float) -> Link:
    return Link(peer=peer, send_mb_s=mb_s, receive_mb_s=mb_s, latency_ms=0.1)


def test_links_are_judged_between_machines_only_and_count_for_both_ends():
    # two ps, one on a bad link: every worker's transfer to ps-1 is slow
    records = [
        node(f"worker-{i}", machine=f"w{i}", links=[_link("ps-0", 1000.0), _link("ps-1", 300.0)])
        for i in range(3)
    ] + [node("ps-0", machine="p0"), node("ps-1", machine="p1")]
    flags = judge(records, 0.8)
    assert {(f.node, f.figure) for f in flags} == {("ps-1", "link_mb_s")}
    # against the catalog's baseline for the type (m5.xlarge: 1.25 Gb/s): shown, the ceiling
    typed = [r.model_copy(update={"instance_type": "m5.xlarge"}) for r in records]
    assert figures(typed)["worker-0"]["link_of_baseline"] == pytest.approx(650 * 8 / 1000 / 1.25, abs=1e-3)
    assert "links/baseline x" in table(typed, None)[0]
    # the same figures between processes of one machine measure its scheduler: shown, not judged
    one_machine = [r.model_copy(update={"machine": "m"}) for r in records]
    assert not judge(one_machine, 0.8)
    rows = table(one_machine, None)
    assert "links MB/s" not in rows[0], rows[0]


def test_the_all_reduce_is_one_figure_per_run_held_to_its_types_history_and_the_catalog():
    # every worker times the same collective: no peer stands out, the type's history is the judge
    records = [
        node(f"worker-{i}", machine=f"w{i}", instance_type="m5.xlarge").model_copy(
            update={"figures": {"allreduce_gb_s": 0.05 + i / 1000, "allreduce_mb": 4.2}}
        )
        for i in range(3)
    ]
    assert not judge(records, 0.8)
    flags = judge(records, 0.8, {"m5.xlarge": {"allreduce_gb_s": 0.1}})
    assert {(f.node, f.figure, f.against) for f in flags} == {
        (f"worker-{i}", "allreduce_gb_s", "history") for i in range(3)
    }
    assert flags[0].says() == "worker-0: all-reduce 0.05 GB/s bus, 0.50 of its type's baseline (0.1 GB/s bus)"
    # bus bandwidth against the type's network baseline (m5.xlarge: 1.25 Gb/s): the ceiling, shown
    assert figures(records)["worker-1"]["allreduce_of_baseline"] == pytest.approx(0.051 * 8 / 1.25, abs=1e-3)
    header = table(records, None)[0]
    assert {"all-reduce GB/s bus", "all-reduce/baseline x", "reduced MB"} <= set(header), header


def test_the_all_reduce_is_measured_at_the_models_gradient_size():
    import keras

    def built() -> keras.Model:
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()])

    # Dense: 4x3 + 3 float32 trainable; BatchNormalization: gamma and beta trainable, its moving
    # statistics not (they are no gradient)
    assert gradient_bytes(built) == (4 * 3 + 3 + 3 + 3) * 4
    # a model built on its first batch has no weights yet: the default bucket
    assert gradient_bytes(lambda: keras.Sequential([keras.layers.Dense(3)])) == DEFAULT_GRADIENT_BYTES


def test_version_drift_names_the_node_and_the_package_from_two_real_interpreters(tmp_path: Path):
    """One interpreter sees a tampered numpy (a distribution ahead of site-packages on sys.path,
    what imports first); the other is the environment as installed."""
    tampered = tmp_path / "tampered"
    info = tampered / "numpy-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 0.0.1\n")
    probe = "import json; from dlinfra.node.measure import versions; print(json.dumps(versions(0)))"

    def versions_of(extra_path: str) -> dict[str, str]:
        env = {"PYTHONPATH": extra_path} if extra_path else {}
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
        )
        return json.loads(done.stdout)

    clean, odd = versions_of(""), versions_of(str(tampered))
    assert odd["package numpy"] == "0.0.1" and clean["package numpy"] != "0.0.1"
    assert clean["python"] == odd["python"] and "kernel" in clean
    records = [node(f"worker-{i}", versions=v) for i, v in enumerate([clean, odd, clean])]
    flags = judge(records, 0.8)
    assert [f.says() for f in flags] == [f"worker-1: package numpy 0.0.1 (peers: {clean['package numpy']})"]
    # two nodes that disagree: the first node's value is the reference
    assert [f.node for f in judge(records[:2], 0.8)] == ["worker-1"]
    # a GPU node runs another build: nodes are compared within their flavor only
    gpu = records[1].model_copy(update={"flavor": "gpu", "node": "worker-3"})
    assert not judge([records[0], records[2], gpu], 0.8)


def test_what_a_flagged_round_does():
    flagged = judge([node("worker-0", 40.0), node("worker-1", 10.0)], 0.8)
    assert action([], "fail", set()) == "train"
    assert action(flagged, "warn", set()) == "warn"
    assert action(flagged, "fail", set()) == "fail"
    assert action(flagged, "replace", set()) == "replace"
    assert action(flagged, "replace", {"worker-1"}) == "fail", "flagged again after its replacement"


def test_three_peers_measure_their_links_to_one_sink_over_real_tcp():
    sink = Sink("127.0.0.1", 0)
    try:
        links: list[Link] = []
        threads = [
            threading.Thread(target=lambda: links.append(measure_link("ps-0", sink.address, FAST)))
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(links) == 3
        for link in links:
            assert link.send_mb_s > 1 and link.receive_mb_s > 1 and 0 < link.latency_ms < 1000
    finally:
        sink.close()


def test_a_device_slower_than_a_window_per_op_is_timed_in_one_window_not_each_of_them():
    class Done:
        def numpy(self) -> None:
            return None

    def op(seconds: float) -> Callable[[], Done]:
        def run() -> Done:
            calls.append(seconds)
            time.sleep(seconds)
            return Done()

        return run

    effort = dataclasses.replace(FAST, windows=3, window_seconds=0.05)
    calls: list[float] = []
    assert _best_rate(op(0.2), 1e9, effort) > 0
    assert len(calls) == 2, "the warm-up and one window"
    calls.clear()
    _best_rate(op(0.0), 1e9, effort)
    assert len(calls) > 4, "a fast op: three windows, each of many ops"


def test_a_link_too_slow_for_its_bytes_is_measured_for_its_seconds_each_way():
    """A terabyte each way at loopback speed would take minutes: the seconds end each direction."""
    sink = Sink("127.0.0.1", 0)
    endless = dataclasses.replace(FAST, link_bytes=1 << 40, link_seconds=0.2)
    try:
        links: list[Link] = []
        thread = threading.Thread(
            target=lambda: links.append(measure_link("worker-1", sink.address, endless))
        )
        thread.start()
        thread.join(120)
        assert not thread.is_alive(), "the link was measured for its bytes, not its seconds"
        (link,) = links
        assert link.send_mb_s > 1 and link.receive_mb_s > 1 and 0 < link.latency_ms < 1000
    finally:
        sink.close()


def test_a_cgroup_quota_is_read_from_inside_the_throttled_process():
    limit = cgroup_cpu_limit()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.stdin.readline(); import dlinfra.node.measure as m; print(m.cpu_quota())",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with limit(child.pid, 0.25):
        out, _ = child.communicate("go\n", timeout=60)
    assert out.strip() == "0.25"
    assert cpu_quota() is None, "this test process runs unlimited"


# ---------------------------------------------------------------- the spec and its defaults


def _preflight(spec: Spec, target: str, emulate: str | None = None) -> dict[str, PreflightPlan | None]:
    chosen = target_for(target, TargetOptions(emulate_instances=emulate))
    configs = build_node_configs(
        spec,
        "r",
        store_config(spec, "s3://results-bkt/runs/r" if target == "aws" else "file:///tmp/r"),
        chosen.addresses(spec),
        typed=chosen.uses_instance_types,
        own_machines=chosen.own_machines,
    )
    return {name: cfg.preflight for name, cfg in configs.items()}


def test_defaults_check_instances_of_their_own_and_leave_processes_sharing_a_machine_alone():
    aws = Spec.model_validate({"target": "aws", "storage": {"url": "s3://results-bkt/runs"}})
    plans = _preflight(aws, "aws")
    assert set(plans.values()) == {PreflightPlan(checks="quick", min_ratio=0.8, on_fail="replace", port=2224)}
    assert set(_preflight(aws, "aws", emulate="process").values()) == {None}
    assert set(_preflight(Spec(), "local").values()) == {None}
    asked = Spec.model_validate({"cluster": {"preflight": "full"}})
    assert set(_preflight(asked, "local").values()) == {
        PreflightPlan(checks="full", min_ratio=0.8, on_fail="fail", port=0)
    }
    emulated = aws.model_copy(
        update={"cluster": Spec.model_validate({"cluster": {"preflight": "quick"}}).cluster}
    )
    assert {p.on_fail for p in _preflight(emulated, "aws", emulate="process").values() if p} == {"replace"}


def test_the_preflight_field_in_yaml(tmp_path: Path):
    for text, expected in [("quick", "quick"), ("off", "off"), ("{checks: full, min_ratio: 0.9}", "full")]:
        path = tmp_path / "e.yaml"
        path.write_text(f"cluster:\n  preflight: {text}\n")
        assert load_spec(path).cluster.preflight.checks == expected
    path.write_text("cluster:\n  preflight: fast\n")
    bad = run_cli("validate", str(path))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "cluster.preflight" in bad.stderr and "must be quick, full or off" in bad.stderr, bad.stderr
    path.write_text(yaml.safe_dump({"cluster": {"preflight": {"min_ratio": 1.5}}}))
    bad = run_cli("validate", str(path))
    assert bad.returncode == 2 and "cluster.preflight.min_ratio" in bad.stderr, bad.stderr


def test_a_types_history_is_kept_beside_the_runs_and_catches_a_uniformly_slow_cluster(tmp_path: Path):
    from dlinfra.runs import preflight_history
    from dlinfra.runs.layout import RunStore
    from dlinfra.runs.preflight import Verdict

    spec = Spec.model_validate({"storage": {"url": f"file://{tmp_path}/runs"}})
    configs = {
        f"worker-{i}": cfg.model_copy(
            update={
                "instance_type": "m5.xlarge",
                "preflight": PreflightPlan(checks="quick", min_ratio=0.8, on_fail="replace", port=0),
            }
        )
        for i, cfg in enumerate(
            build_node_configs(
                Spec.model_validate({"strategy": "multi_worker_mirrored"}),
                "r",
                store_config(spec, f"file://{tmp_path}/x"),
                target_for("local").addresses(Spec.model_validate({"strategy": "multi_worker_mirrored"})),
                typed=False,
            ).values()
        )
    }

    def run(run_id: str, gemm: float, flagged: bool = False) -> RunStore:
        store = RunStore.open(store_config(spec, f"file://{tmp_path}/runs/{run_id}"))
        preflight_history.snapshot(spec, configs, store)
        records = [node(f"worker-{i}", gemm + i, instance_type="m5.xlarge") for i in range(2)]
        flags = judge(records, 0.8, store.preflight_history())
        for r in records:
            store.put_preflight(1, r)
        verdict = Verdict(
            round=1,
            action="warn" if flags or flagged else "train",
            flagged=flags,
            min_ratio=0.8,
            checks="quick",
            seconds=1,
        )
        store.put_preflight(1, verdict)
        preflight_history.record(spec, store, run_id)
        return store

    run("r1", 40.0)
    assert run("r2", 42.0).preflight_history() == {}, "one earlier run is no baseline yet"
    third = run("r3", 20.0)
    assert third.preflight_history() == {"m5.xlarge": {"conv_gflops": 41.5, "gemm_gflops": 41.5}}
    _, verdict = third.preflight_round(1)
    assert verdict is not None and {(f.node, f.against) for f in verdict.flagged} == {
        ("worker-0", "history"),
        ("worker-1", "history"),
    }
    kept = json.loads((tmp_path / "runs" / "preflight-history" / "m5.xlarge.json").read_text())["runs"]
    assert [r["run_id"] for r in kept] == ["r1", "r2"], "a flagged run sets no baseline"


def _worker(index: int, compute: float | None = None, role: str = "worker", **extra) -> NodeState:
    return NodeState(
        node=f"{role}-{index}",
        role=role,
        index=index,
        state="training",
        started=0,
        first_started=0,
        heartbeat=0,
        compute_seconds=compute,
        **extra,
    )


def test_a_mirrored_worker_over_the_ratio_for_the_window_is_named_once_and_no_other():
    watch = StragglerWatch("multi_worker_mirrored", ratio=1.5, window=60)
    steady = {"worker-0": _worker(0, 0.10), "worker-1": _worker(1, 0.11), "worker-2": _worker(2, 0.12)}
    assert not watch.observe(0, steady)
    slow = steady | {"worker-2": _worker(2, 0.30)}  # 0.30 against the others' median 0.105: 2.9x
    assert not watch.observe(10, slow), "not before its window"
    assert not watch.observe(65, steady | {"worker-2": _worker(2, 0.14)}), "back under: its clock restarts"
    assert not watch.observe(70, slow)
    named = watch.observe(130, slow)
    assert [s.node for s in named] == ["worker-2"] and named[0].since == 70
    assert named[0].ratio == pytest.approx(0.30 / 0.105) and named[0].share is None
    assert not watch.observe(200, slow), "named once"
    assert named[0].says() == "straggler worker-2: 0.3 s per step, 2.9x its peers' median (0.105 s)"


def test_under_parameter_servers_a_straggler_is_named_with_its_share_of_the_steps():
    watch = StragglerWatch("parameter_server", ratio=1.5, window=10)

    def chief(tally: dict[str, list[float]]) -> dict[str, NodeState | None]:
        return {"chief-0": _worker(0, role="chief", workers=tally), "ps-0": None}

    watch.observe(0, chief({"worker-0": [0.1, 100], "worker-1": [0.1, 100], "worker-2": [0.1, 100]}))
    watch.observe(5, chief({"worker-0": [0.1, 150], "worker-1": [0.1, 150], "worker-2": [0.5, 110]}))
    named = watch.observe(20, chief({"worker-0": [0.1, 300], "worker-1": [0.1, 300], "worker-2": [0.5, 120]}))
    assert [s.node for s in named] == ["worker-2"]
    # since it turned slow (t=5): 10 of the 310 steps counted, a fair share a third
    assert named[0].share == pytest.approx(10 / 310) and named[0].fair == pytest.approx(1 / 3)
    assert "it ran 3% of the steps (a fair share: 33%)" in named[0].says()


def test_straggler_replace_asks_for_a_new_machine_only_where_nodes_have_their_own(tmp_path: Path):
    assert issubclass(InstanceCluster, Replaces)
    assert not issubclass(LocalCluster, Replaces) and not issubclass(AttachedNodes, Replaces)
    found = Straggler(node="worker-1", ratio=4.0, seconds=0.4, median=0.1, since=0.0)
    watching._replace(LocalCluster(run_dir=tmp_path), [found])
    assert found.replaced is False and found.says().endswith("; not replaced: the nodes share one machine")

"""Preflight on real local clusters: a node held to a fifth of a CPU by the kernel's cgroup cpu
controller (a CFS quota, what a throttled burstable instance or a noisy neighbour looks like from
inside) is named before anything trains."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from e2e.conftest import Live, aws_emulation, start_deploy, terminate_frees_private_ips_as_aws_does
from support import alive_node_pids, aws_client, cgroup_cpu_limit, run_cli

pytestmark = [pytest.mark.e2e]

QUOTA = 0.2  # CPUs
# Below the default 0.8: these nodes share two cores with the tests beside them, whose load moves one
# unthrottled node's figure against another's by up to half again (seen: 0.79 of a peer's median in
# a `dlinfra preflight` beside a CI run); the throttled worker measures about 0.3 of its peer's.
MIN_RATIO = 0.5


def _throttle_at_start(live: Live, node: str, limit, stack: contextlib.ExitStack) -> None:
    """Hold `node`'s trainer to QUOTA from its first seconds: it loads TensorFlow and waits for
    every node before it measures, and its record says the quota it measured under (asserted)."""
    deadline = time.monotonic() + 900  # on aws, after terraform's apply: minutes on a loaded machine
    while time.monotonic() < deadline:
        assert live.proc.poll() is None, live.proc.communicate()
        with contextlib.suppress(AssertionError, OSError):
            stack.enter_context(limit(live.trainer_pid(node), QUOTA))
            return
        time.sleep(0.02)
    raise AssertionError(f"{node}'s trainer never came up")


def test_quick_preflight_names_the_throttled_worker_and_the_run_fails_before_its_first_step(tmp_path):
    limit = cgroup_cpu_limit()
    asked = f"cluster.preflight={{checks: quick, on_fail: fail, min_ratio: {MIN_RATIO}}}"
    args = ("--workers", "2", "--steps", "200", "--set", asked)
    with contextlib.ExitStack() as stack:
        live = start_deploy(tmp_path, *args)
        _throttle_at_start(live, "worker-1", limit, stack)
        done = live.finish()
    assert done.returncode == 1, done.stdout + done.stderr
    store = live.store
    records = {p.stem: json.loads(p.read_text()) for p in (store / "preflight" / "1").glob("*-*.json")}
    assert sorted(records) == ["chief-0", "ps-0", "worker-0", "worker-1"]
    assert records["worker-1"]["cpu_quota"] == QUOTA, "the throttle held before worker-1 measured"
    assert all(records[n]["cpu_quota"] is None for n in ("chief-0", "ps-0", "worker-0"))
    verdict = json.loads((store / "preflight" / "1" / "verdict.json").read_text())
    assert verdict["action"] == "fail"
    assert {f["node"] for f in verdict["flagged"]} == {"worker-1"}, verdict["flagged"]
    gemm = next(f for f in verdict["flagged"] if f["figure"] == "gemm_gflops")
    assert gemm["against"] == "peers" and gemm["ratio"] < MIN_RATIO
    # its ratio is its figure over its role's median (worker-0's and its own)
    assert gemm["ratio"] == pytest.approx(
        records["worker-1"]["figures"]["gemm_gflops"]
        / (
            (records["worker-0"]["figures"]["gemm_gflops"] + records["worker-1"]["figures"]["gemm_gflops"])
            / 2
        )
    )
    marker = json.loads((store / "FAILED").read_text())
    assert marker["verdict"] == "preflight" and "worker-1: gemm" in marker["error"]
    assert f"{gemm['ratio']:.2f} of its role's median" in done.stderr
    # the table: every node, worker-1 flagged, its quota shown
    table = [line for line in done.stderr.splitlines() if "worker-1" in line and "CPU" in line]
    assert table and "gemm" in table[0], done.stderr
    # nothing trained: no step, no checkpoint, no model; the startup phases stop at preflight
    chief = live.status("chief-0")
    assert chief["step"] == 0 and "peers" not in chief["phases"] and "first step" not in chief["phases"]
    assert not (store / "checkpoints").exists() and not (store / "model").exists()
    assert "preflight" in live.status("worker-0")["phases"], "worker-0 passed its part, then left"
    # `show` draws the same table from the store
    shown = run_cli("show", live.run_dir.name, env={**os.environ, "DLINFRA_HOME": str(live.home)}, check=True)
    assert "preflight, round 1" in shown.stdout and "worker-1" in shown.stdout


@pytest.mark.terraform
def test_on_aws_a_worker_flagged_at_preflight_is_replaced_once_and_the_run_then_trains(
    moto_endpoint: str, tf_cli_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Emulated instances (processes standing in for EC2 machines, moto for EC2): the throttled
    first instance of worker-1 leaves at the verdict, the watcher ends it and re-applies the run's
    Terraform inputs, its replacement (a new process, unthrottled) measures with the others in round
    2, and the run trains to its end."""
    terminate_frees_private_ips_as_aws_does(monkeypatch)
    limit = cgroup_cpu_limit()
    aws = aws_emulation(moto_endpoint, tf_cli_config, tmp_path / "aws-home", "dlinfra-preflight")
    args = (
        *("--target", "aws", "--workers", "2", "--steps", "300", "--yes", "--emulate-instances"),
        *("--set", f"cluster.preflight={{checks: quick, min_ratio: {MIN_RATIO}}}", *aws["args"]),
    )
    with contextlib.ExitStack() as stack:
        live = start_deploy(tmp_path, *args, env=aws["env"])
        _throttle_at_start(live, "worker-1", limit, stack)
        first = live.trainer_pid("worker-1")
        done = live.finish(timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    round_1 = json.loads(s3_text(moto_endpoint, live, "preflight/1/verdict.json"))
    assert round_1["action"] == "replace" and {f["node"] for f in round_1["flagged"]} == {"worker-1"}
    assert json.loads(s3_text(moto_endpoint, live, "preflight/1/worker-1.json"))["cpu_quota"] == QUOTA
    round_2 = json.loads(s3_text(moto_endpoint, live, "preflight/2/verdict.json"))
    assert round_2["action"] == "train" and round_2["flagged"] == [], round_2
    assert json.loads(s3_text(moto_endpoint, live, "preflight/2/worker-1.json"))["cpu_quota"] is None
    heals = live.run_dir.joinpath("manifest.json").read_text()
    heals = json.loads(heals)["heals"]
    assert [(h["node"], h["reason"]) for h in heals] == [("worker-1", "preflight")], heals
    assert "was flagged by preflight: re-applying the run's Terraform inputs" in done.stdout + done.stderr
    assert live.trainer_pid("worker-1") != first
    metrics = json.loads(s3_text(moto_endpoint, live, "metrics.json"))
    assert metrics["steps"] >= 300
    # round 2 passed unflagged: its figures start each type's history, beside the runs
    history = json.loads(s3_text(moto_endpoint, live, "../preflight-history/g4dn.xlarge.json"))
    assert [r["run_id"] for r in history["runs"]] == [live.run_dir.name]
    assert history["runs"][0]["figures"]["gemm_gflops"] > 0
    # every node's status says it passed preflight in its last life: worker-1 a restart it is not
    status = json.loads(s3_text(moto_endpoint, live, "status/worker-1.json"))
    assert status["restarts"] == 0 and "preflight" in status["phases"]


def s3_text(endpoint: str, live: Live, key: str) -> str:
    """A key of the run's S3 store, which the run's manifest names."""
    store = json.loads(live.run_dir.joinpath("manifest.json").read_text())["store"]["url"]
    bucket, _, prefix = store.removeprefix("s3://").partition("/")
    s3 = aws_client(endpoint, "s3")
    key = os.path.normpath(f"{prefix}/{key}")  # `../` names a key beside the run's
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()


@pytest.mark.parametrize("strategy", ["parameter_server", "multi_worker_mirrored"])
def test_a_worker_throttled_mid_run_is_named_a_straggler_and_no_other(tmp_path: Path, strategy: str):
    """worker-1 is held to a twentieth of a CPU after step 100. Under mirrored every worker's step
    waits for it in the all-reduce, so each worker's own pass is what names it; under parameter
    servers the chief's calls say which worker ran them and for how long."""
    limit = cgroup_cpu_limit()
    # 3x, not the default 1.5x: these workers share two cores with each other and with the tests
    # beside, whose load moves one worker's figure against another's by half again (seen); a worker
    # on a twentieth of a CPU is many times slower
    args = (
        *("--workers", "3", "--steps", "1000000", "--strategy", strategy),
        *("--set", "cluster.straggler={ratio: 3, window: 10}"),
    )
    live = start_deploy(tmp_path, *args)
    live.wait_for_step("worker-0" if strategy == "multi_worker_mirrored" else "chief-0", 100)
    with limit(live.trainer_pid("worker-1"), 0.05):
        throttled = time.time()
        named = _wait_for_file(live.store / "stragglers.json", timeout=300)
        live.proc.send_signal(signal.SIGINT)  # enough: the run is stopped and torn down
        done = live.finish()
    assert done.returncode == 130, done.stdout + done.stderr  # Ctrl-C: STOPPED, torn down
    stragglers = json.loads(named.read_text())["named"]
    assert list(stragglers) == ["worker-1"], stragglers
    found = stragglers["worker-1"]
    # a twentieth of a CPU shows as several times slower, not as the noise of a shared machine
    assert found["ratio"] >= 4 and found["seconds"] >= 4 * found["median"], found
    assert found["since"] >= throttled - 1, "named for what happened after the throttle"
    if strategy == "parameter_server":
        assert found["fair"] == pytest.approx(1 / 3) and found["share"] < found["fair"], found
    assert "straggler worker-1" in done.stdout, done.stdout[-3000:]
    status = run_cli("status", live.run_dir.name, env={**os.environ, "DLINFRA_HOME": str(live.home)})
    assert "straggler worker-1:" in status.stdout and "x its peers' median" in status.stdout, status.stdout


def _wait_for_file(path: Path, timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} in {timeout:.0f}s"
        time.sleep(0.2)
    return path


def test_dlinfra_preflight_checks_a_fresh_cluster_prints_the_table_and_trains_nothing(tmp_path: Path):
    env = {**os.environ, "DLINFRA_HOME": str(tmp_path / "home")}
    args = (
        "--workers",
        "2",
        "--strategy",
        "multi_worker_mirrored",
        "--set",
        f"cluster.preflight.min_ratio={MIN_RATIO}",
    )
    done = run_cli("preflight", *args, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "preflight, round 1" in done.stdout and "preflight passed (quick" in done.stdout
    assert "eval accuracy" not in done.stdout, "no result table: nothing trained"
    run = next((tmp_path / "home" / "runs").iterdir())
    marker = json.loads((run / "store" / "DONE").read_text())
    assert marker["reason"] == "preflight only"
    records = sorted(p.stem for p in (run / "store" / "preflight" / "1").glob("worker-*.json"))
    assert records == ["worker-0", "worker-1"]
    assert not (run / "store" / "model").exists() and not (run / "store" / "checkpoints").exists()
    statuses = [json.loads((run / "store" / "status" / f"{n}.json").read_text()) for n in records]
    assert all(s["step"] == 0 and s["state"] == "done" for s in statuses), statuses
    assert not alive_node_pids(str(tmp_path)), "torn down"

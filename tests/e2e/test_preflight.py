"""Preflight on real local clusters: a node held to a twentieth of a CPU by the kernel's cgroup cpu
controller (a CFS quota, what a throttled burstable instance or a noisy neighbour looks like from
inside) is named before anything trains."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from dlinfra.node.measure import DEFAULT_GRADIENT_BYTES
from dlinfra.runs.stragglers import Straggler
from e2e.conftest import Live, aws_emulation, start_deploy, terminate_frees_private_ips_as_aws_does
from support import DEVICE_FIGURES, alive_node_pids, aws_client, cgroup_cpu_limit, device_flags, run_cli

pytestmark = [pytest.mark.e2e]

QUOTA = 0.05  # CPUs: a node at a fifth of a CPU was no slower than its peers beside a loaded CI run
# Far below the default 0.8: these nodes share two cores with the tests beside them, whose load moves
# one unthrottled node's figure against another's by half (seen beside CI runs: 0.79 of a peer's
# median in a `dlinfra preflight`, and a conv at 0.46 of its one peer's in a mirrored round 2); the
# throttled worker measures a tenth of its peers' (0.07 to 0.12 of them, seen beside a CI run).
MIN_RATIO = 0.3
RUN_CPUS = 0.6  # a whole run's hold, where it trains on until stopped: its throttled node leaves it


def _throttle_while_measuring(
    live: Live, node: str, limit, record: Callable[[], dict | None], every: float = 0.02
) -> int:
    """Hold `node`'s trainer to QUOTA from its preflight record saying it is ready (it then waits for
    every node, and for the nodes before it on this machine to measure) until its figures are in;
    its pid. Its record says the quota it measured under (asserted by the tests): a late throttle
    fails loudly. Only while measuring: at QUOTA, loading TensorFlow alone would take minutes."""
    _until(live, lambda: record() is not None, 900, f"{node}'s preflight record", every)
    pid = live.trainer_pid(node)
    with limit(pid, QUOTA):
        _until(live, lambda: (record() or {}).get("measured"), 600, f"{node}'s figures", every)
    return pid


def _until(live: Live, done: Callable[[], Any], timeout: float, what: str, every: float = 0.02) -> None:
    """Polls `done` every `every` s: a local file's read is cheap; a call to moto costs the test and
    the server CPU the nodes measuring beside them need, so those poll a few times a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert live.proc.poll() is None, live.proc.communicate()
        with contextlib.suppress(OSError, ValueError, KeyError, ClientError):  # not yet, or mid-write
            if done():
                return
        time.sleep(every)
    raise AssertionError(f"no {what} in {timeout:.0f}s")


def _local_record(live: Live, node: str) -> Callable[[], dict | None]:
    path = live.store / "preflight" / "1" / f"{node}.json"
    return lambda: json.loads(path.read_text()) if path.exists() else None


def test_quick_preflight_names_the_throttled_worker_and_the_run_fails_before_its_first_step(tmp_path):
    limit = cgroup_cpu_limit()
    asked = f"cluster.preflight={{checks: quick, on_fail: fail, min_ratio: {MIN_RATIO}}}"
    args = ("--workers", "2", "--steps", "200", "--set", asked)
    live = start_deploy(tmp_path, *args)
    _throttle_while_measuring(live, "worker-1", limit, _local_record(live, "worker-1"))
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
    device = device_flags(verdict, "worker-1", MIN_RATIO)
    for flag in device:
        # its ratio is its figure over its role's median (worker-0's and its own)
        mine, peer = (records[n]["figures"][flag["figure"]] for n in ("worker-1", "worker-0"))
        assert flag["ratio"] == pytest.approx(mine / ((mine + peer) / 2))
        assert f"{flag['ratio']:.2f} of its role's median" in done.stderr
    marker = json.loads((store / "FAILED").read_text())
    label = DEVICE_FIGURES[device[0]["figure"]]
    assert marker["verdict"] == "preflight" and f"worker-1: {label}" in marker["error"]
    # the table: every node, worker-1 flagged, its quota shown
    table = [line for line in done.stderr.splitlines() if "worker-1" in line and "CPU" in line]
    assert table and label in table[0], done.stderr
    # nothing trained: no step, no checkpoint, no model; the startup phases stop at preflight
    chief = live.status("chief-0")
    assert chief["step"] == 0 and "peers" not in chief["phases"] and "first step" not in chief["phases"]
    assert not (store / "checkpoints").exists() and not (store / "model").exists()
    assert "preflight" in live.status("worker-0")["phases"], "worker-0 passed its part, then left"
    # `show` draws the same table from the store
    shown = run_cli("show", live.run_dir.name, env={**os.environ, "DLINFRA_HOME": str(live.home)}, check=True)
    assert "preflight, round 1" in shown.stdout and "worker-1" in shown.stdout


def test_under_mirrored_a_flagged_worker_leaves_and_the_strategy_forms_again_with_its_replacement(
    tmp_path: Path,
):
    """on_fail: replace on local processes: the launcher starts a node that left as a replaced
    instance's stand-in (a new process, outside the throttle). The strategy the others formed holds
    the worker that left, so they restart too and form a new one with it: round 2 measures the
    replacement, the all-reduce included, and the run trains."""
    limit = cgroup_cpu_limit()
    asked = f"cluster.preflight={{checks: quick, on_fail: replace, min_ratio: {MIN_RATIO}}}"
    args = ("--workers", "2", "--steps", "30", "--strategy", "multi_worker_mirrored", "--set", asked)
    live = start_deploy(tmp_path, *args)
    _throttle_while_measuring(live, "worker-1", limit, _local_record(live, "worker-1"))
    done = live.finish()
    assert done.returncode == 0, done.stdout + done.stderr
    rounds = [json.loads((live.store / "preflight" / str(r) / "verdict.json").read_text()) for r in (1, 2)]
    assert rounds[0]["action"] == "replace" and {f["node"] for f in rounds[0]["flagged"]} == {"worker-1"}
    assert rounds[1]["action"] == "train" and rounds[1]["flagged"] == [], rounds[1]
    again = json.loads((live.store / "preflight" / "2" / "worker-1.json").read_text())
    assert again["cpu_quota"] is None and again["figures"]["allreduce_gb_s"] > 0, again
    # worker-1 left and worker-0 restarted to form a new strategy, whichever the launcher saw first
    # (it restarts every member of an all-reduce together, as TensorFlow's recovery asks)
    for name in ("worker-0", "worker-1"):
        assert len(re.findall(rf"dlinfra node {name} of run", live.log(name).read_text())) == 2, name
    assert live.metrics["steps"] >= 30
    assert "preflight, round 2" in done.stdout, done.stdout


@pytest.mark.full  # two heals in a row (replaced at preflight, then as a straggler); the verdicts are in the
# default tier, on local clusters, above and below
@pytest.mark.terraform
def test_on_aws_a_worker_flagged_at_preflight_is_replaced_once_and_a_straggler_is_replaced_too(
    moto_endpoint: str, tf_cli_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Emulated instances (processes standing in for EC2 machines, moto for EC2): the throttled
    first instance of worker-1 leaves at the verdict, the watcher ends it and re-applies the run's
    Terraform inputs, its replacement (a new process, unthrottled) measures with the others in round
    2, and the run trains. Then that replacement is throttled mid-run: named a straggler, its
    instance is replaced the same way (straggler.action: replace), and the third worker-1 trains."""
    terminate_frees_private_ips_as_aws_does(monkeypatch)
    limit = cgroup_cpu_limit()
    aws = aws_emulation(moto_endpoint, tf_cli_config, tmp_path / "aws-home", "dlinfra-preflight")
    args = (
        *("--target", "aws", "--workers", "2", "--steps", "1000000", "--yes", "--emulate-instances"),
        *("--set", f"cluster.preflight={{checks: quick, min_ratio: {MIN_RATIO}}}", *aws["args"]),
        # 3x: see test_a_worker_throttled_mid_run_is_named_a_straggler_and_no_other
        *("--set", "cluster.straggler={ratio: 3, window: 10, action: replace}"),
    )
    # the run trains flat out until the test has seen both replacements: held to RUN_CPUS, its part
    # of a loaded machine (364 CPU-s of a CI run unheld)
    live = start_deploy(tmp_path, *args, env=aws["env"], cpus=RUN_CPUS)
    try:
        first = _throttle_while_measuring(
            live,
            "worker-1",
            limit,
            lambda: json.loads(s3_text(moto_endpoint, live, "preflight/1/worker-1.json")),
            every=0.25,
        )
        verdict_in = lambda: s3_text(moto_endpoint, live, "preflight/1/verdict.json")  # noqa: E731
        _until(live, verdict_in, 600, "verdict", every=0.25)
        verdict = json.loads(s3_text(moto_endpoint, live, "preflight/1/verdict.json"))
        assert verdict["action"] == "replace", verdict  # now: a run that trained would go on for long
        second = _next_life(live, "worker-1", first)
        live.wait_for_step("chief-0", 100, timeout=600)
        with limit(second, 0.05):
            slow_at = time.time()
            _wait_for_heals(live, 2)
        third = _next_life(live, "worker-1", second)
        # the third worker-1 takes calls: its row of the chief's tally grows after its heal
        counted = _steps_of(moto_endpoint, live, "worker-1")
        deadline = time.monotonic() + 300
        while _steps_of(moto_endpoint, live, "worker-1") <= counted:
            assert time.monotonic() < deadline and live.proc.poll() is None, "the third worker-1 took no call"
            time.sleep(1)
    finally:  # a million steps: never left training beside the next tests, whatever failed
        live.proc.send_signal(signal.SIGINT)  # enough: the run is stopped and torn down
    done = live.finish(timeout=900)
    assert done.returncode == 130, done.stdout + done.stderr
    round_1 = json.loads(s3_text(moto_endpoint, live, "preflight/1/verdict.json"))
    assert round_1["action"] == "replace" and {f["node"] for f in round_1["flagged"]} == {"worker-1"}
    assert json.loads(s3_text(moto_endpoint, live, "preflight/1/worker-1.json"))["cpu_quota"] == QUOTA
    round_2 = json.loads(s3_text(moto_endpoint, live, "preflight/2/verdict.json"))
    assert round_2["action"] == "train" and round_2["flagged"] == [], round_2
    # its replacement measured unthrottled: under the run's hold (None where cgroups are read-only)
    replacement = json.loads(s3_text(moto_endpoint, live, "preflight/2/worker-1.json"))
    assert replacement["cpu_quota"] in (None, RUN_CPUS)
    heals = json.loads(live.run_dir.joinpath("manifest.json").read_text())["heals"]
    assert [(h["node"], h["reason"]) for h in heals] == [("worker-1", "preflight"), ("worker-1", "straggler")]
    said = done.stdout + done.stderr
    assert "was flagged by preflight: re-applying the run's Terraform inputs" in said
    assert "is a straggler: re-applying the run's Terraform inputs" in said
    assert len({first, second, third}) == 3
    named = json.loads(s3_text(moto_endpoint, live, "stragglers.json"))["named"]
    assert list(named) == ["worker-1"] and named["worker-1"]["replaced"] is True, named
    assert named["worker-1"]["since"] >= slow_at - 1, "named for what happened after the throttle"
    assert "straggler worker-1" in said  # on the watch line (Ctrl-C prints no result)
    assert Straggler.model_validate(named["worker-1"]).says().endswith("; its instance is replaced")
    # round 2 passed unflagged: its figures start each type's history, beside the runs
    history = json.loads(s3_text(moto_endpoint, live, "../preflight-history/g4dn.xlarge.json"))
    assert [r["run_id"] for r in history["runs"]] == [live.run_dir.name]
    assert history["runs"][0]["figures"]["gemm_gflops"] > 0
    # worker-1's last instance did not measure again: its run's preflight had passed
    status = json.loads(s3_text(moto_endpoint, live, "status/worker-1.json"))
    assert status["restarts"] == 0 and "preflight" in status["phases"]
    assert not (s3_keys(moto_endpoint, live, "preflight/3/")), "no third round"


def _next_life(live: Live, node: str, pid: int, timeout: float = 600) -> int:
    """The pid of `node`'s trainer once a new one (its replacement's) is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert live.proc.poll() is None, live.proc.communicate()
        with contextlib.suppress(AssertionError, OSError, ValueError):
            if (now := live.trainer_pid(node)) != pid:
                return now
        time.sleep(0.1)
    raise AssertionError(f"{node} was not replaced in {timeout:.0f}s")


def _steps_of(endpoint: str, live: Live, worker: str) -> float:
    """The steps the chief's status counts for `worker` (its row of the ps's tally), from the store."""
    return float(json.loads(s3_text(endpoint, live, "status/chief-0.json"))["workers"][worker][1])


def _wait_for_heals(live: Live, count: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert live.proc.poll() is None, live.proc.communicate()
        with contextlib.suppress(OSError, ValueError):
            if len(json.loads(live.run_dir.joinpath("manifest.json").read_text())["heals"]) >= count:
                return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} heals in {timeout:.0f}s")


def s3_keys(endpoint: str, live: Live, prefix: str) -> list[str]:
    store = json.loads(live.run_dir.joinpath("manifest.json").read_text())["store"]["url"]
    bucket, _, root = store.removeprefix("s3://").partition("/")
    found = aws_client(endpoint, "s3").list_objects_v2(Bucket=bucket, Prefix=f"{root}/{prefix}")
    return [o["Key"] for o in found.get("Contents", [])]


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
    # the strategy's own all-reduce, both workers in it, at the built-in model's gradient size
    measured = [
        json.loads((run / "store" / "preflight" / "1" / f"{n}.json").read_text())["figures"] for n in records
    ]
    assert all(m["allreduce_gb_s"] > 0 for m in measured), measured
    assert (
        measured[0]["allreduce_mb"] == measured[1]["allreduce_mb"] != round(DEFAULT_GRADIENT_BYTES / 1e6, 1)
    )
    assert "all-reduce" in done.stdout
    assert not (run / "store" / "model").exists() and not (run / "store" / "checkpoints").exists()
    statuses = [json.loads((run / "store" / "status" / f"{n}.json").read_text()) for n in records]
    assert all(s["step"] == 0 and s["state"] == "done" for s in statuses), statuses
    assert not alive_node_pids(str(tmp_path)), "torn down"

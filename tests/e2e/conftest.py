"""Shared cluster runs: each real TensorFlow cluster is deployed once per module and inspected by
many tests (deploying is the expensive part; 2 cores)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dlinfra.node.status import read_state, state_file
from own_files import OWN_KEYS, write_own_digits
from support import FAKE_CREDS, alive_node_pids, aws_client, cgroup_cpu_limit, cli_process, run_cli

OWN_TRAIN_FILES = 16


@pytest.fixture(autouse=True)
def _no_node_outlives_its_test(tmp_path: Path) -> Iterator[None]:
    """A test that fails half-way must not leave its nodes training beside the next tests: a Ctrl-C
    test that failed before its SIGINT once left four trainers at full CPU for the rest of a CI run
    (its nodes run in process groups of their own, so killing the CLI does not reach them)."""
    yield
    for pid in alive_node_pids(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


NODE_LOG_TAIL = 25  # lines of each node's log in a failed test's report


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed cluster test reports the tail of every node log written while it ran: a CI machine
    is gone when the failure is read, and the CLI's output names only the chief's log (a CI run
    failed on a stall whose cause was in a worker's log)."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    base = item.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    logs = [p for p in base.glob("**/runs/*/logs/*.log") if p.stat().st_mtime >= call.start]
    for log in sorted(logs)[:12]:
        tail = log.read_text(errors="replace").splitlines()[-NODE_LOG_TAIL:]
        report.sections.append((f"node log {log.parent.parent.name}/{log.name}", "\n".join(tail)))


@dataclass
class Deployed:
    result: subprocess.CompletedProcess[str]
    home: Path
    run_dir: Path

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "manifest.json").read_text())

    @property
    def store(self) -> Path:
        return self.run_dir / "store"

    @property
    def metrics(self) -> dict[str, Any]:
        return json.loads((self.store / "metrics.json").read_text())


def deploy(tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> Deployed:
    home = tmp / "home"
    full_env = dict(os.environ, DLINFRA_HOME=str(home), **(env or {}))
    result = run_cli("deploy", *args, env=full_env, cwd=tmp, timeout=timeout)
    runs = sorted((home / "runs").iterdir()) if (home / "runs").exists() else []
    assert runs, result.stdout + result.stderr
    return Deployed(result, home, runs[-1])


class Live:
    """A `dlinfra deploy` running in the background, watched through its run dir and file store
    (what a fault-injection test needs: node pids, steps, logs while the run goes on)."""

    def __init__(
        self, tmp: Path, args: tuple[str, ...], env: dict[str, str] | None, cpus: float | None = None
    ):
        """`cpus`: the run's whole process tree (CLI, terraform, nodes) held to that many CPUs until
        it finishes, where cgroups can be written: a run that trains until the test has seen enough
        then does less of it on a loaded machine (a node throttled on its own leaves the hold)."""
        self.home = tmp / "home"
        full_env = {**os.environ, **(env or {}), "DLINFRA_HOME": str(self.home)}
        self.proc = cli_process("deploy", *args, env=full_env, cwd=tmp)
        self._held = contextlib.ExitStack()
        if cpus is not None:
            self._held.enter_context(cgroup_cpu_limit(required=False)(self.proc.pid, cpus))
            # a test that fails before finish() still releases the hold (and its cgroup) once it lets go
            weakref.finalize(self, self._held.close)

    @property
    def run_dir(self) -> Path:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = sorted((self.home / "runs").glob("*/manifest.json"))
            if runs:
                return runs[-1].parent
            assert self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.2)
        raise AssertionError("no run dir after 60 s")

    @property
    def store(self) -> Path:
        return self.run_dir / "store"

    @property
    def nodes(self) -> list[str]:
        return sorted(p.stem for p in (self.store / "status").glob("*.json"))

    @property
    def metrics(self) -> dict[str, Any]:
        return json.loads((self.store / "metrics.json").read_text())

    def status(self, node: str) -> dict[str, Any]:
        return json.loads((self.store / "status" / f"{node}.json").read_text())

    def log(self, node: str) -> Path:
        return self.run_dir / "logs" / f"{node}.log"

    def wait_for_step(self, node: str, step: int, timeout: float = 300) -> None:
        """Until `node` logged a progress line at or past `step` (its log is line-buffered)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            log = self.log(node)
            if log.exists():
                steps = re.findall(r" step (\d+)/", log.read_text(errors="replace"))
                if steps and int(steps[-1]) >= step:
                    return
            time.sleep(0.1)
        raise AssertionError(f"{node} did not reach step {step} in {timeout:.0f}s")

    def trainer_pid(self, node: str) -> int:
        """The pid of `node`'s trainer in its current life, from the state file it writes once up: the
        store's copy comes a beat later, a whole run later for a short run at the default beat."""
        state = read_state(state_file(self.run_dir / "work" / node))
        assert state is not None, f"{node}'s trainer is not up"
        return int(state["pid"])

    def script_pid_at(
        self, node: str, reached: Callable[[dict[str, Any]], bool], timeout: float = 300
    ) -> int:
        """The pid of `node`'s script (its agent's state file names it) once `reached` holds of that state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            state = read_state(state_file(self.run_dir / "work" / node))
            if state is not None and state.get("state") == "running" and reached(state):
                return int(state["pid"])
            time.sleep(0.1)
        raise AssertionError(f"{node} did not get there in {timeout:.0f}s")

    def published_status(
        self, node: str, until: Callable[[dict[str, Any]], bool] = lambda s: True, timeout: float = 120
    ) -> dict[str, Any]:
        """`node`'s status in the store once it satisfies `until`: its beacon publishes once a beat,
        after the trainer's log line, and that store copy is what other nodes and the watcher read."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            with contextlib.suppress(OSError, json.JSONDecodeError):  # not yet written, or mid-write
                if until(status := self.status(node)):
                    return status
            time.sleep(0.1)
        raise AssertionError(f"{node}'s published status did not come in {timeout:.0f}s")

    def finish(self, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)  # the CLI tears its cluster down on Ctrl-C
            out, err = self.proc.communicate(timeout=60)
            raise AssertionError(f"deploy still running after {timeout:.0f}s:\n{out}\n{err}") from None
        finally:
            self._held.close()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


def aws_emulation(
    endpoint: str, tf_cli_config: Path, home: Path, bucket: str, make_bucket: bool = True
) -> dict[str, Any]:
    """What an aws-target deploy against the moto server at `endpoint` needs: an environment of fake
    keys and nothing of the caller's AWS settings, results in s3://`bucket`/runs (made here unless
    the test makes it, with `dlinfra setup`), moto's AMI."""
    s3 = aws_client(endpoint, "s3")
    if make_bucket and bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=bucket)
    ami = aws_client(endpoint, "ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        | FAKE_CREDS
        | {
            "DLINFRA_HOME": str(home),
            "TF_CLI_CONFIG_FILE": str(tf_cli_config),
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    args = [
        "--endpoint-url",
        endpoint,
        "--set",
        f"storage.url=s3://{bucket}/runs",
        "--set",
        f"aws.ami={ami}",
        # Emulated instances are processes on this GPU-less machine: the g4dn workers train on its
        # CPU (they would fail their device check asking for the T4 they do not have here).
        "--set",
        "cluster.workers.gpus=0",
    ]
    return {"env": env, "home": home, "args": args, "endpoint": endpoint, "cwd": home, "ami": ami}


def s3_json(s3: Any, bucket: str, key: str) -> Any:
    try:
        return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


def wait_for(what: str, ready: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := ready():
            return found
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def set_up_controller(
    aws: dict[str, Any], bucket: str, emulate: str, idle_minutes: float, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], str]:
    """`dlinfra setup --controller` of `bucket` against the emulation `aws` (`emulate`: the
    instance as a process or a VM), asserted to succeed; (what setup said, the instance's id)."""
    made = run_cli(
        "setup", "--bucket", bucket, "--endpoint-url", aws["endpoint"], "--controller", "--ami", aws["ami"],
        "--idle-minutes", str(idle_minutes), emulate, env=env, cwd=aws["cwd"], timeout=900,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    registered = s3_json(aws_client(aws["endpoint"], "s3"), bucket, "controller/controller.json")
    return made, registered["instance_id"]


def instance_state(endpoint: str, instance_id: str) -> str:
    found = aws_client(endpoint, "ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(found[0]["Instances"][0]["State"]["Name"])


def left_of(endpoint: str, run_id: str) -> dict[str, list[str]]:
    """What of the run is still in moto, by its run tag: instances not terminated, VPCs, NAT
    gateways not deleted, Elastic IPs."""
    ec2 = aws_client(endpoint, "ec2")
    tagged = [{"Name": "tag:dlinfra:run-id", "Values": [run_id]}]
    tag = {"Key": "dlinfra:run-id", "Value": run_id}  # checked on each: moto's NAT gateways ignore the filter
    reservations = ec2.describe_instances(Filters=tagged)["Reservations"]
    return {
        "instances": [
            i["InstanceId"]
            for r in reservations
            for i in r["Instances"]
            if i["State"]["Name"] != "terminated" and tag in i.get("Tags", [])
        ],
        "vpcs": [v["VpcId"] for v in ec2.describe_vpcs(Filters=tagged)["Vpcs"] if tag in v.get("Tags", [])],
        "nat_gateways": [
            n["NatGatewayId"]
            for n in ec2.describe_nat_gateways(Filters=tagged)["NatGateways"]
            if n["State"] != "deleted" and tag in n.get("Tags", [])
        ],
        "eips": [
            a["AllocationId"]
            for a in ec2.describe_addresses(Filters=tagged)["Addresses"]
            if tag in a.get("Tags", [])
        ],
    }


def release_private_ip_as_aws_does(instance: dict[str, Any]) -> None:
    """Stand-in for AWS behaviour moto lacks: terminating an instance deletes its primary network
    interface and frees its private IP; moto keeps the IP taken until the instance object is
    garbage-collected. The moto server runs in this process, so free it where moto keeps it."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    subnet = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_subnet(instance["SubnetId"])
    subnet.del_subnet_ip(instance["PrivateIpAddress"])


def terminate_frees_private_ips_as_aws_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in for AWS behaviour moto lacks (see release_private_ip_as_aws_does): a terminated
    instance's private IP is free again, so a replacement that destroys the old instance first (as
    healing does after a spot notice) can take it. Patched in this process, where the server runs."""
    from moto.ec2.models.instances import InstanceBackend

    from stoppable_moto import freeing_private_ips

    monkeypatch.setattr(
        InstanceBackend, "terminate_instances", freeing_private_ips(InstanceBackend.terminate_instances)
    )


def start_deploy(tmp: Path, *args: str, env: dict[str, str] | None = None, cpus: float | None = None) -> Live:
    return Live(tmp, args, env, cpus)


@pytest.fixture(scope="session")
def s3_own_files(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A user's own TFRecord files (not packed by dlinfra: tests/own_files.py) in moto's S3, 16 train
    files under s3://own-data/digits/train/ and 2 under …/validation/."""
    s3 = aws_client(moto_endpoint, "s3")
    s3.create_bucket(Bucket="own-data")
    root = write_own_digits(tmp_path_factory.mktemp("own"), OWN_TRAIN_FILES)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), "own-data", f"digits/{path.relative_to(root).as_posix()}")
    return "s3://own-data/digits"


def own_files_args(uri: str) -> list[str]:
    """`--set`s that train the built-in model on them, by globs and their keys."""
    own = {
        "format": "tfrecord",
        "uri": f"{uri}/train/train-*",
        "eval_uri": f"{uri}/validation/validation-*",
        "features.image": OWN_KEYS["image"],
        "features.label": OWN_KEYS["label"],
        "shape": "[8,8,1]",
        "classes": "10",
    }
    return [arg for key, value in own.items() for arg in ("--set", f"training.dataset.{key}={value}")]


@pytest.fixture(scope="session")
def ps_run(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    """The README's main job: built-in digits example, 1 chief + 3 workers + 1 ps."""
    return deploy(tmp_path_factory.mktemp("ps"), "--workers", "3")


@pytest.fixture(scope="session")
def mirrored_run(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    return deploy(tmp_path_factory.mktemp("mwms"), "--strategy", "multi_worker_mirrored", "--workers", "2")


def kill_at(live: Live, node: str, fraction: float, *, steps: int, trainer: str = "chief-0") -> int:
    """SIGKILL `node`'s trainer (its own process group) once `trainer` logged `fraction` of the
    `steps`: the node's beacon then ends the same way, and the launcher restarts the node."""
    live.wait_for_step(trainer, int(steps * fraction))
    pid = live.trainer_pid(node)
    os.killpg(pid, signal.SIGKILL)
    return pid

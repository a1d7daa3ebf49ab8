"""The aws target: tfvars from the address plan and user-data, Terraform plan/apply, watch, destroy.

Every run gets its own copy of the Terraform stack in its run dir (state included, unless the spec
names a state bucket), so concurrent runs never share state and a run's HCL is pinned with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dlinfra import __version__
from dlinfra.bundle import Bundle, file_sha256
from dlinfra.deploy import Outcome, Prepared, Snapshot, prepare, run_store, watch
from dlinfra.errors import CredentialsError, DlinfraError, SpecError, TerraformError
from dlinfra.node.status import run_marker
from dlinfra.pricing import NAT_GATEWAY_USD_PER_HOUR, ON_DEMAND_USD_PER_HOUR, PRICE_SOURCE, PRICE_TABLE_DATE
from dlinfra.run import Run, utc_now
from dlinfra.spec import Spec
from dlinfra.store import Store
from dlinfra.targets.local import LocalCluster
from dlinfra.terraform import Terraform, find_terraform
from dlinfra.wheel import node_wheel

MAX_HEAL_ATTEMPTS = 3
INFRA = Path(__file__).resolve().parent.parent / "infra"
Log = Callable[[str], None]


def install_requirement() -> str:
    """What cloud-init pip-installs on an instance: exactly this dlinfra version."""
    return f"dlinfra[train,aws]=={__version__}"


# ---------------------------------------------------------------- pre-flight checks


def _session(spec: Spec) -> Any:
    import boto3

    return boto3.session.Session(region_name=spec.aws.region)


def _client(spec: Spec, service: str) -> Any:
    from botocore.config import Config

    return _session(spec).client(
        service,
        endpoint_url=spec.aws.endpoint_url,
        config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=20),
    )


def preflight(spec: Spec) -> str:
    """Terraform, region, credentials, endpoint, bucket: fail before anything is planned."""
    find_terraform()
    bucket = _bucket_of(spec)
    import botocore.exceptions as bx

    known = set(_session(spec).get_available_regions("ec2"))
    for partition in ("aws-us-gov", "aws-cn"):
        known |= set(_session(spec).get_available_regions("ec2", partition_name=partition))
    if spec.aws.region not in known:
        raise SpecError(
            [f"aws.region: {spec.aws.region!r} is not an AWS region. Fix: use one like us-east-1"]
        )
    if spec.aws.endpoint_url and not spec.aws.ami:
        raise SpecError(
            [
                "aws.ami: an emulator endpoint has no Deep Learning AMI parameter. "
                "Fix: set aws.ami to an image id the endpoint lists (describe-images --owners amazon)"
            ]
        )
    try:
        identity = _client(spec, "sts").get_caller_identity()
        _client(spec, "s3").head_bucket(Bucket=bucket)
    except bx.NoCredentialsError:
        raise CredentialsError(
            "no AWS credentials found. Fix: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY), "
            "or run `aws sso login`"
        ) from None
    except bx.EndpointConnectionError:
        where = spec.aws.endpoint_url or f"AWS in {spec.aws.region}"
        raise DlinfraError(
            f"cannot reach {where}. Fix: check the network, or start the emulator / correct aws.endpoint_url"
        ) from None
    except bx.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise DlinfraError(
                f"storage.url: bucket {bucket!r} does not exist. "
                f"Fix: `dlinfra setup --bucket {bucket}` creates it once"
            ) from None
        raise CredentialsError(
            f"AWS refused the credentials ({code}). Fix: refresh them (`aws sso login`)"
        ) from None
    return str(identity.get("Account", ""))


def _bucket_of(spec: Spec) -> str:
    url = spec.storage.url or ""
    if not url.startswith("s3://"):
        raise SpecError(
            [
                "storage.url: the aws target needs an s3:// store that outlives the cluster. "
                "Fix: `dlinfra setup --bucket NAME`, then set storage.url: s3://NAME/runs"
            ]
        )
    return url[len("s3://") :].split("/", 1)[0]


# ---------------------------------------------------------------- tfvars and the stack copy


def tfvars(spec: Spec, prepared: Prepared) -> dict[str, Any]:
    """The root stack's inputs: one instance group per role, one user-data per node."""
    run_id = prepared.run.id
    store_url = prepared.run.manifest()["store_url"]
    bucket, _, prefix = store_url[len("s3://") :].partition("/")
    types = {
        "chief": spec.cluster.chief.instance_type,
        "ps": spec.cluster.ps.instance_type,
        "worker": spec.cluster.workers.instance_type,
    }
    roles: dict[str, Any] = {}
    for node in prepared.plan:
        group = roles.setdefault(
            node.role,
            {
                "instance_type": types[node.role],
                "spot": spec.cluster.workers.spot and node.role == "worker",
                # gradient traffic flows between workers and ps: keep them on one low-latency spine
                # (emulators have no placement groups: moto lacks CreatePlacementGroup)
                "placement_group": node.role in ("worker", "ps") and not spec.aws.endpoint_url,
                "root_volume_gb": spec.aws.root_volume_gb,
                "nodes": {},
            },
        )
        group["nodes"][node.name] = {"private_ip": node.host, "user_data": prepared.user_data[node.name]}
    return {
        "run_id": run_id,
        "region": spec.aws.region,
        "endpoint_url": spec.aws.endpoint_url,
        "ami_id": spec.aws.ami,
        "network": {
            "vpc_cidr": spec.aws.vpc_cidr,
            "subnet_cidr": spec.aws.subnet_cidr,
            "egress": spec.aws.egress,
        },
        "tf_ports": {"from": spec.cluster.port, "to": spec.cluster.port},
        "bucket": bucket,
        "prefix": prefix,
        "roles": roles,
        "ssm_access": spec.aws.ssm_access,
        "tags": {**spec.aws.tags, "dlinfra:run-id": run_id, "dlinfra:experiment": spec.name},
    }


def _copy_hcl(stack: str, root: Path) -> None:
    """A root stack and the modules it references, side by side as in the package (no tests)."""
    for part in (stack, "modules"):
        shutil.copytree(INFRA / part, root / part, ignore=shutil.ignore_patterns("tests", ".terraform*"))


def _stack(run: Run, spec: Spec, log: Log) -> tuple[Terraform, Path]:
    """The run's own copy of the HCL (stack + modules), initialised."""
    root = run.dir / "terraform"
    if not root.exists():
        _copy_hcl("stack", root)
        if spec.aws.state_bucket:
            backend: dict[str, Any] = {
                "bucket": spec.aws.state_bucket,
                "key": f"dlinfra/{run.id}/terraform.tfstate",
                "region": spec.aws.region,
                "use_lockfile": True,
            }
            if spec.aws.endpoint_url:
                backend |= {
                    "endpoints": {"s3": spec.aws.endpoint_url},
                    "use_path_style": True,
                    "skip_credentials_validation": True,
                    "skip_requesting_account_id": True,
                }
            (root / "stack" / "backend.tf.json").write_text(
                json.dumps({"terraform": {"backend": {"s3": backend}}}, indent=2)
            )
    tf = Terraform(root / "stack", log=log)
    if not (root / "stack" / ".terraform").exists():
        tf.init()
    return tf, root / "stack"


# ---------------------------------------------------------------- plan


@dataclass
class PlanSummary:
    add: int
    change: int
    destroy: int
    roles: list[dict[str, Any]]  # role, nodes, instance_type, usd_per_hour
    usd_per_hour: float
    unknown_types: list[str]
    nat_gateway: bool

    def text(self, run_id: str) -> str:
        lines = [
            f"Plan for run {run_id}: {self.add} to add, {self.change} to change, {self.destroy} to destroy."
        ]
        for r in self.roles:
            price = "?" if r["usd_per_hour"] is None else f"${r['usd_per_hour']:.3f}/h"
            lines.append(f"  {r['role']:<7} {r['nodes']:>3} x {r['instance_type']:<14} {price}")
        lines.append(self._cost_line())
        return "\n".join(lines)

    def markdown(self, run_id: str, name: str) -> str:
        rows = "\n".join(
            f"| {r['role']} | {r['nodes']} | `{r['instance_type']}` | "
            + ("unknown" if r["usd_per_hour"] is None else f"${r['usd_per_hour']:.3f}")
            + " |"
            for r in self.roles
        )
        return (
            f"### dlinfra plan: `{name}` (run `{run_id}`)\n\n"
            f"**{self.add}** to add, **{self.change}** to change, **{self.destroy}** to destroy.\n\n"
            "| role | nodes | instance type | $/hour (all nodes) |\n|---|---:|---|---:|\n"
            f"{rows}\n\n{self._cost_line()}\n"
        )

    def _cost_line(self) -> str:
        nat = f" + NAT gateway ${NAT_GATEWAY_USD_PER_HOUR:.3f}/h" if self.nat_gateway else ""
        warn = f" (no price for {', '.join(self.unknown_types)}: not counted)" if self.unknown_types else ""
        return (
            f"Estimated ${self.usd_per_hour:.2f}/hour on demand{nat}{warn}. "
            f"Prices: {PRICE_SOURCE}, as of {PRICE_TABLE_DATE}."
        )


def summarize(plan_json: dict[str, Any], variables: dict[str, Any]) -> PlanSummary:
    counts = {"create": 0, "update": 0, "delete": 0}
    for change in plan_json.get("resource_changes", []):
        for action in change.get("change", {}).get("actions", []):
            if action in counts:
                counts[action] += 1
    roles = []
    total = 0.0
    unknown: list[str] = []
    for role, group in variables["roles"].items():
        price = ON_DEMAND_USD_PER_HOUR.get(group["instance_type"])
        n = len(group["nodes"])
        if price is None:
            unknown.append(group["instance_type"])
        else:
            total += price * n
        roles.append(
            {
                "role": role,
                "nodes": n,
                "instance_type": group["instance_type"],
                "usd_per_hour": None if price is None else price * n,
            }
        )
    return PlanSummary(
        counts["create"],
        counts["update"],
        counts["delete"],
        roles,
        total,
        unknown,
        variables["network"]["egress"] == "nat",
    )


@dataclass
class Planned:
    prepared: Prepared
    terraform: Terraform
    plan_file: Path
    summary: PlanSummary
    markdown_path: Path


def plan(
    spec: Spec,
    spec_path: Path | None,
    argv: list[str],
    log: Log,
    code: Bundle | None = None,
    pins: dict[str, Any] | None = None,
    wheel: Path | None = None,
) -> Planned:
    """`code`, `pins`, `wheel`: what a rerun carries over from the original run."""
    preflight(spec)
    wheel = wheel or node_wheel()
    prepared = prepare(spec, spec_path, argv, install_requirement(), code=code, pins=pins, wheel=wheel)
    run = prepared.run
    variables = tfvars(spec, prepared)
    var_file = run.dir / "tfvars.json"
    text = json.dumps(variables, indent=2, sort_keys=True) + "\n"
    var_file.write_text(text, encoding="utf-8")
    tf, root = _stack(run, spec, log)
    # Provider versions as resolved by init: a rerun months later must see what this run used.
    shutil.copy2(root / ".terraform.lock.hcl", run.dir / "terraform.lock.hcl")
    store = prepared.store
    store.put_file("terraform/.terraform.lock.hcl", root / ".terraform.lock.hcl")
    store.put_bytes("terraform/tfvars.json", text.encode())
    run.update_manifest(
        tfvars_sha256=hashlib.sha256(text.encode()).hexdigest(),
        terraform_lock_sha256=file_sha256(root / ".terraform.lock.hcl"),
    )
    plan_file = run.dir / "tfplan"
    tf.plan(var_file, plan_file)
    summary = summarize(tf.show_json(plan_file), variables)
    markdown = run.dir / "plan.md"
    markdown.write_text(summary.markdown(run.id, spec.name), encoding="utf-8")
    run.update_manifest(
        status="PLANNED",
        plan={
            "add": summary.add,
            "change": summary.change,
            "destroy": summary.destroy,
            "usd_per_hour": summary.usd_per_hour,
        },
    )
    return Planned(prepared, tf, plan_file, summary, markdown)


# ---------------------------------------------------------------- deploy and destroy


@dataclass
class InstanceCluster:
    """The run's EC2 instances. Each supervises its own agent (systemd); the watcher adds healing:
    an instance that vanished while its node was still working (spot reclaim, manual termination)
    is replaced by re-applying the run's own Terraform inputs, so it comes back at the same private
    IP with the same user-data, and only that instance changes. `emulated` boots each instance's
    user-data as a local process instead (an emulator has no machines)."""

    spec: Spec
    run: Run
    terraform: Terraform
    instances: dict[str, str]  # node → instance id
    log: Log
    emulated: LocalCluster | None = None
    check_every: float = 5.0
    _checked: float = 0.0
    _failed_heals: int = 0

    def poll(self) -> dict[str, int | None]:
        if time.monotonic() - self._checked >= self.check_every:
            if gone := self._vanished():
                try:
                    self._heal(gone)
                    self._failed_heals = 0
                except TerraformError as exc:  # e.g. the old IP not yet released: try at the next check
                    self._failed_heals += 1
                    if self._failed_heals >= MAX_HEAL_ATTEMPTS:
                        raise
                    self.log(f"heal attempt {self._failed_heals} failed, retrying: {exc}")
            self._checked = time.monotonic()
        return self.emulated.poll() if self.emulated else {}

    def exit_codes(self) -> dict[str, int | None]:
        return self.emulated.exit_codes() if self.emulated else {}

    def stop(self) -> None:
        if self.emulated:
            self.emulated.stop()

    @cached_property
    def _store(self) -> Store:
        return run_store(self.run)

    @cached_property
    def _ec2(self) -> Any:
        return _client(self.spec, "ec2")

    def _vanished(self) -> list[str]:
        store = self._store
        if run_marker(store) is not None:
            return []
        reservations = self._ec2.describe_instances(
            Filters=[{"Name": "instance-id", "Values": list(self.instances.values())}]
        )["Reservations"]
        states = {i["InstanceId"]: i["State"]["Name"] for r in reservations for i in r["Instances"]}
        gone = []
        for name, instance_id in sorted(self.instances.items()):
            # Only once terminated: a shutting-down instance still holds the private IP its
            # replacement needs.
            if states.get(instance_id, "terminated") != "terminated":
                continue
            status = store.get_json(f"status/{name}.json") or {}
            if status.get("state") in ("done", "failed", "stopped"):
                continue  # the node ended its own life and powered off
            gone.append(name)
            # A fresh instance needs minutes to boot before its first heartbeat: not a lost node.
            store.put_json(f"status/{name}.json", {**status, "state": "replacing", "heartbeat": time.time()})
        return gone

    def _heal(self, gone: list[str]) -> None:
        for name in gone:
            self.log(
                f"instance {self.instances[name]} of {name} is gone: re-applying the run's Terraform inputs"
            )
            if self.emulated:
                self.emulated.kill(name)  # its process was that instance
        plan_file = self.run.dir / "heal.tfplan"
        # Targeted: drift elsewhere (an emulator's, or a console edit) must not ride along with a heal.
        targets = tuple(instance_address(name) for name in gone)
        self.terraform.plan(self.run.dir / "tfvars.json", plan_file, targets=targets)
        _check_heal_plan(self.terraform.show_json(plan_file), gone)
        self.terraform.apply(plan_file)
        outputs = self.terraform.output()["instances"]
        user_data = instance_user_data(self.spec, {name: outputs[name] for name in gone})
        heals = self.run.manifest().get("heals", [])
        for name in gone:
            new_id = outputs[name]["id"]
            heals.append({"node": name, "old": self.instances[name], "new": new_id, "time": utc_now()})
            self.log(f"{name}: replaced by {new_id} at {outputs[name]['private_ip']}")
            self.instances[name] = new_id
            if self.emulated:
                self.emulated.replace(name, user_data[name])
        self.run.update_manifest(heals=heals, instances=dict(self.instances))


def instance_address(node: str) -> str:
    """The Terraform address of a node's instance in the root stack (module per role, one per node)."""
    role = node.rsplit("-", 1)[0]
    return f'module.role["{role}"].aws_instance.this["{node}"]'


def _check_heal_plan(plan_json: dict[str, Any], gone: list[str]) -> None:
    """Healing may create the vanished instances and nothing else may be destroyed: a plan that
    would touch other resources means the inputs or the cloud drifted, and a human must look."""
    for change in plan_json.get("resource_changes", []):
        actions = change["change"]["actions"]
        if actions in (["no-op"], ["read"], ["update"]):
            continue
        if change["type"] == "aws_instance" and change.get("index") in gone and actions == ["create"]:
            continue
        raise DlinfraError(
            f"healing stopped: re-applying would {'/'.join(actions)} {change['address']}, not only replace "
            f"{', '.join(gone)}. Fix: inspect with `terraform plan` in the run's terraform/stack dir"
        )


def deploy(
    spec: Spec,
    spec_path: Path | None,
    argv: list[str],
    approve: Callable[[str], bool],
    keep: bool,
    emulate: bool,
    on_update: Callable[[Snapshot], None],
    started: float,
    log: Log,
    code: Bundle | None = None,
    pins: dict[str, Any] | None = None,
    wheel: Path | None = None,
) -> Outcome:
    if emulate and not spec.aws.endpoint_url:
        raise SpecError(
            ["--emulate-instances: only with an emulator. Fix: add --endpoint-url http://HOST:PORT"]
        )
    planned = plan(spec, spec_path, argv, log, code, pins, wheel)
    run = planned.prepared.run
    if not approve(planned.summary.text(run.id)):
        run.update_manifest(status="CANCELLED")
        raise DlinfraError(f"apply cancelled; nothing was created. The plan stays in {run.dir}")
    t0 = time.time()
    try:
        planned.terraform.apply(planned.plan_file)
        outputs = planned.terraform.output()
        run.update_manifest(
            status="APPLIED",
            apply_seconds=round(time.time() - t0, 1),
            instances={k: v["id"] for k, v in outputs["instances"].items()},
        )
        log(f"applied in {time.time() - t0:.0f}s: {len(outputs['instances'])} instances")
        cluster = InstanceCluster(
            spec, run, planned.terraform, {k: v["id"] for k, v in outputs["instances"].items()}, log
        )
        if emulate:
            cluster.emulated = LocalCluster(
                run.dir, remap=True, restart_together=spec.strategy == "multi_worker_mirrored"
            )
            cluster.emulated.start(instance_user_data(spec, outputs["instances"]))
            run.update_manifest(pids=cluster.emulated.pids())
        return watch(planned.prepared, cluster, on_update, spec.cluster.heartbeat_timeout, started=started)
    finally:
        if not keep:
            log(destroy(run))


def instance_user_data(spec: Spec, instances: dict[str, dict[str, Any]]) -> dict[str, str]:
    """What EC2 holds as each instance's user-data, read back through the API."""
    ec2 = _client(spec, "ec2")
    out = {}
    for name, inst in instances.items():
        attr = ec2.describe_instance_attribute(InstanceId=inst["id"], Attribute="userData")
        out[name] = base64.b64decode(attr["UserData"]["Value"]).decode()
    return out


def destroy(run: Run) -> str:
    spec = run.spec()
    t0 = time.time()
    tf, _ = _stack(run, spec, log=lambda line: None)
    tf.destroy(run.dir / "tfvars.json")
    seconds = round(time.time() - t0, 1)
    run.update_manifest(destroyed=True, destroy_seconds=seconds)
    return f"run {run.id}: stack destroyed in {seconds:.0f}s (the results bucket is untouched)"


def setup_bucket(bucket: str, region: str, endpoint_url: str | None, log: Log) -> str:
    """Create the long-lived results bucket once, in its own stack and state (never a run's)."""
    from dlinfra.run import home

    root = home() / "setup" / bucket
    if not root.exists():
        _copy_hcl("bucket", root)
    var_file = root / "bucket.tfvars.json"
    var_file.write_text(
        json.dumps(
            {
                "bucket": bucket,
                "region": region,
                "endpoint_url": endpoint_url,
                "tags": {"dlinfra:purpose": "results"},
            },
            indent=2,
        )
    )
    tf = Terraform(root / "bucket", log=log)
    tf.init()
    tf.plan(var_file, root / "bucket.tfplan")
    tf.apply(root / "bucket.tfplan")
    return f"bucket s3://{bucket} ready (state in {root}); set storage.url: s3://{bucket}/runs"

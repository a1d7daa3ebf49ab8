"""The run's EC2 instances while it trains. Each instance supervises its own agent (systemd); the
watcher adds healing: an instance that vanished while its node was still working (spot reclaim,
manual termination) is replaced by re-applying the run's own Terraform inputs, so it comes back at
the same private IP with the same user-data, and only that instance changes."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from dlinfra.errors import DlinfraError, RunFailed, TerraformError
from dlinfra.layout import RunStore
from dlinfra.records import Heal, NodeState
from dlinfra.run import Run, utc_now
from dlinfra.spec import Spec
from dlinfra.targets.aws import stack, tfvars
from dlinfra.targets.aws.preflight import client
from dlinfra.targets.aws.vms import VmCluster
from dlinfra.targets.base import Log
from dlinfra.targets.local import AttachedNodes, LocalCluster
from dlinfra.terraform import Terraform

MAX_HEAL_ATTEMPTS = 3


@dataclass
class InstanceCluster:
    """`emulated` boots each instance's user-data as a local process or a VM instead (an emulator
    has no machines)."""

    spec: Spec
    run: Run
    terraform: Terraform
    instances: dict[str, str]  # node → instance id
    log: Log
    emulated: LocalCluster | VmCluster | AttachedNodes | None = None
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
                        error = f"could not replace {', '.join(gone)} in {MAX_HEAL_ATTEMPTS} attempts: {exc}"
                        self._store.write_marker("FAILED", node=gone[0], verdict="lost", error=error)
                        raise RunFailed(f"run {self.run.id} failed: {error}") from None
                    self.log(f"heal attempt {self._failed_heals} failed, retrying: {exc}")
            self._checked = time.monotonic()
        return self.emulated.poll() if self.emulated else {}

    def exit_codes(self) -> dict[str, int | None]:
        return self.emulated.exit_codes() if self.emulated else {}

    def stop(self) -> None:
        if self.emulated:
            self.emulated.stop()

    @cached_property
    def _store(self) -> RunStore:
        return self.run.store()

    @cached_property
    def _ec2(self) -> Any:
        return client(self.spec, "ec2")

    def _vanished(self) -> list[str]:
        store = self._store
        if store.marker() is not None:
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
            status = store.status(name)
            if status is not None and status.finished:
                continue  # the node ended its own life and powered off
            gone.append(name)
            # A fresh instance needs minutes to boot before its first beat: not a lost node.
            store.put_status(_replacing(name, status))
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
        targets = tuple(tfvars.instance_address(name) for name in gone)
        self.terraform.plan(stack.var_file(self.run), plan_file, targets=targets)
        check_heal_plan(self.terraform.show_json(plan_file), gone)
        # Bounded: the provider retries a taken IP for minutes, and the watch loop waits on this.
        self.terraform.apply(plan_file, timeout=self.spec.aws.heal_timeout)
        applied = tfvars.instances(self.terraform.output())
        replaced = {name: applied[name] for name in gone}
        user_data = instance_user_data(self._ec2, replaced)
        heals = self.run.manifest().heals
        for name, instance in replaced.items():
            heals.append(Heal(node=name, old=self.instances[name], new=instance["id"], time=utc_now()))
            self.log(f"{name}: replaced by {instance['id']} at {instance['private_ip']}")
            self.instances[name] = instance["id"]
            if isinstance(self.emulated, LocalCluster | VmCluster):
                self.emulated.replace(name, user_data[name])
            elif self.emulated is not None:  # re-attached: nothing here can boot its process again
                self.log(f"{name}: an emulated instance of a detached run cannot be booted again here")
        self.run.update_manifest(heals=heals, instances=dict(self.instances))


def _replacing(name: str, previous: NodeState | None) -> NodeState:
    now = time.time()
    if previous is not None:
        return previous.model_copy(update={"state": "replacing", "heartbeat": now})
    role, _, index = name.rpartition("-")
    return NodeState(
        node=name,
        role=role,
        index=int(index),
        state="replacing",
        started=now,
        first_started=now,
        heartbeat=now,
    )


def check_heal_plan(plan_json: dict[str, Any], gone: list[str]) -> None:
    """Healing may create the vanished instances and nothing else may be destroyed: a plan that
    would touch other resources means the inputs or the cloud drifted, and a human must look."""
    for change in plan_json.get("resource_changes", []):
        actions = change["change"]["actions"]
        if actions in (["no-op"], ["read"], ["update"]) or tfvars.creates_node_instance(change, gone):
            continue
        raise DlinfraError(
            f"healing stopped: re-applying would {'/'.join(actions)} {change['address']}, not only replace "
            f"{', '.join(gone)}. Fix: inspect with `terraform plan` in the run's terraform/stack dir"
        )


def instance_user_data(ec2: Any, instances: dict[str, dict[str, str]]) -> dict[str, str]:
    """What EC2 holds as each instance's user-data, read back through the API."""
    out = {}
    for name, inst in instances.items():
        attr = ec2.describe_instance_attribute(InstanceId=inst["id"], Attribute="userData")
        out[name] = base64.b64decode(attr["UserData"]["Value"]).decode()
    return out

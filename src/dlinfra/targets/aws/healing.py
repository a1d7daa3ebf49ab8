"""The run's EC2 instances while it trains. Each instance supervises its own agent (systemd); the
watcher adds healing: an instance that vanished while its node was still working (spot reclaim,
manual termination) is replaced by re-applying the run's own Terraform inputs, so it comes back at
the same private IP with the same user-data, and only that instance changes."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError, RunFailed, TerraformError
from dlinfra.layout import RunStore
from dlinfra.records import Heal, NodeState, Notice
from dlinfra.run import Run, utc_now
from dlinfra.spec import Spec
from dlinfra.targets.aws import spot, stack, tfvars
from dlinfra.targets.aws.preflight import client
from dlinfra.targets.aws.vms import VmCluster
from dlinfra.targets.base import Log
from dlinfra.targets.local import AttachedNodes, LocalCluster
from dlinfra.terraform import Terraform

MAX_HEAL_ATTEMPTS = 3
HEAL_TFVARS = "tfvars.heal.json"  # the run's inputs as heals changed them (a node moved on demand)


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
    _retry_at: float = 0.0  # a capacity wait: no heal before this (monotonic)
    _capacity_since: float | None = None
    _capacity_attempts: int = 0
    _up: set[str] = field(default_factory=set)  # nodes that left for a notice, instance not yet terminated

    def poll(self) -> dict[str, int | None]:
        now = time.monotonic()
        if now - self._checked >= self.check_every and now >= self._retry_at:
            self._check()
            self._checked = time.monotonic()
        return self.emulated.poll() if self.emulated else {}

    def _check(self) -> None:
        states = self._states()
        if states is None:
            return
        gone, left = self._vanished(states), self._left_for_notice(states)
        if not gone and not left:
            return
        try:
            self._heal(sorted({*gone, *left}), left)
            self._failed_heals = 0
            self._capacity_since = None
        except CapacityWait as wait:  # cluster.workers.spot.fallback: wait
            self._retry_at = time.monotonic() + wait.seconds
            self.log(str(wait))
        except TerraformError as exc:  # e.g. the old IP not yet released: try at the next check
            self._failed_heals += 1
            names = sorted({*gone, *left})
            if self._failed_heals >= MAX_HEAL_ATTEMPTS:
                error = f"could not replace {', '.join(names)} in {MAX_HEAL_ATTEMPTS} attempts: {exc}"
                self._store.write_marker("FAILED", node=names[0], verdict="lost", error=error)
                raise RunFailed(f"run {self.run.id} failed: {error}") from None
            self.log(f"heal attempt {self._failed_heals} failed, retrying: {exc}")

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

    def _states(self) -> dict[str, str] | None:
        """instance id → EC2 state; None once the run ended (nothing left to heal)."""
        if self._store.marker() is not None:
            return None
        reservations = self._ec2.describe_instances(
            Filters=[{"Name": "instance-id", "Values": list(self.instances.values())}]
        )["Reservations"]
        return {i["InstanceId"]: i["State"]["Name"] for r in reservations for i in r["Instances"]}

    def _vanished(self, states: dict[str, str]) -> list[str]:
        store = self._store
        gone = []
        for name, instance_id in sorted(self.instances.items()):
            # Only once terminated: a shutting-down instance still holds the private IP its
            # replacement needs.
            if states.get(instance_id, "terminated") != "terminated":
                continue
            status = store.status(name)
            if status is not None and status.finished:
                continue  # the node ended its own life and powered off
            if status is not None and status.interrupted:
                continue  # left for a spot notice: replaced as such (its notice names the time)
            gone.append(name)
            # A fresh instance needs minutes to boot before its first beat: not a lost node.
            store.put_status(_replacing(name, status))
        return gone

    def _left_for_notice(self, states: dict[str, str]) -> dict[str, Notice]:
        """Nodes that left ahead of a spot reclaim: replaced now, not after the heartbeat timeout or
        the terminated state (their instances are destroyed first, which frees their IPs)."""
        if not any(shape.spot for shape in self.spec.roles().values()):
            return {}
        left = spot.left_for_notice(self._store.notices(), self.instances, self.run.manifest().heals)
        for name in left:
            status = self._store.status(name)
            self._store.put_status(_replacing(name, status, "replacing (interrupted)"))
        self._up = {n for n in left if states.get(self.instances[n], "terminated") != "terminated"}
        return left

    def _heal(self, gone: list[str], notices: dict[str, Notice]) -> None:
        started = time.time()
        for name in gone:
            why = "left for a spot notice" if name in notices else "is gone"
            self.log(
                f"instance {self.instances[name]} of {name} {why}: re-applying the run's Terraform inputs"
            )
            if self.emulated:
                self.emulated.kill(name)  # its process was that instance
        replace = tuple(sorted(self._up & set(gone)))
        on_demand = self._apply_replacements(gone, replace)
        applied = tfvars.instances(self.terraform.output())
        replaced = {name: applied[name] for name in gone}
        user_data = instance_user_data(self._ec2, replaced)
        heals = self.run.manifest().heals
        for name, instance in replaced.items():
            notice = notices.get(name)
            heals.append(
                Heal(
                    node=name,
                    old=self.instances[name],
                    new=instance["id"],
                    time=utc_now(),
                    started=started,
                    reason="interrupted" if notice else "vanished",
                    noticed=notice.noticed if notice else None,
                    on_demand=name in on_demand,
                )
            )
            self.log(f"{name}: replaced by {instance['id']} at {instance['private_ip']}")
            self.instances[name] = instance["id"]
            if isinstance(self.emulated, LocalCluster | VmCluster):
                self.emulated.replace(name, user_data[name])
            elif self.emulated is not None:  # re-attached: nothing here can boot its process again
                self.log(f"{name}: an emulated instance of a detached run cannot be booted again here")
        self.run.update_manifest(heals=heals, instances=dict(self.instances))

    def _apply_replacements(self, gone: list[str], replace: tuple[str, ...]) -> list[str]:
        """Plan and apply the targeted re-apply; a spot node that finds no capacity is handled as
        cluster.workers.spot.fallback says. Returns the nodes that went on demand."""
        plan_file = self.run.dir / "heal.tfplan"
        # Targeted: drift elsewhere (an emulator's, or a console edit) must not ride along with a heal.
        targets = tuple(tfvars.instance_address(name) for name in gone)
        replacing = tuple(tfvars.instance_address(name) for name in replace)
        # Replacing only instances the watcher just saw up (nodes that left for a notice): refreshing
        # the target and its dependencies would only cost time the notice does not have.
        refresh = not set(gone) <= set(replace)
        self.terraform.plan(self._var_file(), plan_file, targets=targets, replace=replacing, refresh=refresh)
        check_heal_plan(self.terraform.show_json(plan_file), gone, replace)
        try:
            # Bounded: the provider retries a taken IP for minutes, and the watch loop waits on this.
            self.terraform.apply(plan_file, timeout=self.spec.aws.heal_timeout)
            return []
        except TerraformError as exc:
            shapes = self.spec.roles()
            spot_nodes = [n for n in gone if shapes[n.rsplit("-", 1)[0]].spot]
            if not spot_nodes or not spot.is_capacity_error(str(exc)):
                raise
            error = str(exc)
        now = time.monotonic()
        self._capacity_since = self._capacity_since or now
        self._capacity_attempts += 1
        decision = spot.decide(
            self.spec.cluster.workers.spot.fallback,
            spot_nodes,
            error,
            self._capacity_attempts,
            now - self._capacity_since,
            self.spec.aws.heal_timeout,
        )
        if decision.action == "retry":
            raise CapacityWait(decision.message, decision.wait)
        if decision.action == "fail":
            self._store.write_marker("FAILED", node=spot_nodes[0], verdict="lost", error=decision.message)
            raise RunFailed(f"run {self.run.id} failed: {decision.message}")
        self.log(decision.message)
        variables = json.loads(self._var_file().read_text(encoding="utf-8"))
        heal_vars = self.run.dir / HEAL_TFVARS
        heal_vars.write_text(json.dumps(tfvars.on_demand(variables, spot_nodes), indent=2) + "\n")
        self.terraform.plan(heal_vars, plan_file, targets=targets)
        check_heal_plan(self.terraform.show_json(plan_file), gone, tuple(gone))
        self.terraform.apply(plan_file, timeout=self.spec.aws.heal_timeout)
        return spot_nodes

    def _var_file(self) -> Path:
        """The run's inputs, or once a replacement went on demand, those inputs with that change."""
        heal_vars = self.run.dir / HEAL_TFVARS
        return heal_vars if heal_vars.exists() else stack.var_file(self.run)


class CapacityWait(Exception):
    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


def _replacing(name: str, previous: NodeState | None, state: str = "replacing") -> NodeState:
    now = time.time()
    if previous is not None:
        return previous.model_copy(update={"state": state, "heartbeat": now})
    role, _, index = name.rpartition("-")
    return NodeState(
        node=name,
        role=role,
        index=int(index),
        state=state,
        started=now,
        first_started=now,
        heartbeat=now,
    )


def check_heal_plan(plan_json: dict[str, Any], gone: list[str], replacing: tuple[str, ...] = ()) -> None:
    """Healing may create the vanished instances (destroying first those `replacing`, still up after a
    spot notice) and nothing else may be destroyed: a plan that would touch other resources means the
    inputs or the cloud drifted, and a human must look."""
    for change in plan_json.get("resource_changes", []):
        actions = change["change"]["actions"]
        if actions in (["no-op"], ["read"], ["update"]) or tfvars.creates_node_instance(
            change, gone, replacing
        ):
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

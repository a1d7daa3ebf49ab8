"""The run's EC2 instances while it trains. Each instance supervises its own agent (systemd); the
watcher adds healing: an instance that vanished while its node was still working (spot reclaim,
manual termination) is replaced by re-applying the run's own Terraform inputs, so it comes back at
the same private IP with the same user-data, and only that instance changes."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError, RunFailed, TerraformError
from dlinfra.runs.layout import RunStore
from dlinfra.runs.manifest import Heal, HealReason
from dlinfra.runs.records import NodeState, Notice
from dlinfra.runs.run import Run, utc_now
from dlinfra.spec.model import Spec
from dlinfra.targets.aws import spot, stack, tfvars
from dlinfra.targets.aws.preflight import client
from dlinfra.targets.aws.vms import VmCluster
from dlinfra.targets.base import Log
from dlinfra.targets.local import AttachedNodes, LocalCluster
from dlinfra.terraform import PlannedChange, Terraform

MAX_HEAL_ATTEMPTS = 3
HEAL_TFVARS = "tfvars.heal.json"  # the run's inputs as heals changed them (a node moved on demand)
TERMINATE_POLL = 1.0  # seconds between looks at an instance healing ended itself
NOTICE_CHECK_EVERY = 1.0  # while a node that got a spot notice is on its way out
SUPERVISE_EVERY = 0.5  # an emulated instance's supervisor, during a heal (what LocalCluster.poll does)


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
    _leaving: bool = False  # a node acted on a spot notice and has not left yet
    _preflight_over: bool = False  # its verdict let the run train: nothing left to replace for it
    _stragglers: list[str] = field(default_factory=list)  # to replace at the next check (straggler.action)

    def poll(self) -> dict[str, int | None]:
        now = time.monotonic()
        every = NOTICE_CHECK_EVERY if self._leaving else self.check_every
        if now - self._checked >= every and now >= self._retry_at:
            self._check()
            self._checked = time.monotonic()
        return self.emulated.poll() if self.emulated else {}

    def _check(self) -> None:
        states = self._states()
        if states is None:
            return
        gone, left, flagged = self._vanished(states), self._left_for_notice(), self._left_at_preflight()
        slow = [name for name in self._stragglers if name not in gone]
        if not gone and not left and not flagged and not slow:
            return
        reasons: dict[str, HealReason] = {name: "preflight" for name in flagged}
        reasons |= {name: "straggler" for name in slow}
        try:
            self._heal(sorted({*gone, *left, *reasons}), left, states, reasons)
            self._stragglers.clear()
            self._failed_heals = 0
            self._capacity_since = None
        except CapacityWait as wait:  # cluster.workers.spot.fallback: wait
            self._retry_at = time.monotonic() + wait.seconds
            self.log(str(wait))
        except (TerraformError, StillRunning) as exc:  # e.g. the old IP not yet released: try again
            self._failed_heals += 1
            names = sorted({*gone, *left, *reasons})
            if self._failed_heals >= MAX_HEAL_ATTEMPTS:
                error = f"could not replace {', '.join(names)} in {MAX_HEAL_ATTEMPTS} attempts: {exc}"
                self._store.write_marker("FAILED", node=names[0], verdict="lost", error=error)
                raise RunFailed(f"run {self.run.id} failed: {error}") from None
            self.log(f"heal attempt {self._failed_heals} failed, retrying: {exc}")

    def replace_straggler(self, name: str) -> None:
        if name in self.instances and name not in self._stragglers:
            self._stragglers.append(name)
            self._checked = 0.0

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
        return self._describe(list(self.instances.values()))

    def _describe(self, ids: list[str]) -> dict[str, str]:
        found = self._ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])["Reservations"]
        return {i["InstanceId"]: i["State"]["Name"] for r in found for i in r["Instances"]}

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

    def _left_for_notice(self) -> dict[str, Notice]:
        """Nodes that left ahead of a spot reclaim: replaced now, not after the heartbeat timeout or
        the terminated state (healing ends their instances first, which frees their IPs)."""
        if not any(shape.spot for shape in self.spec.roles().values()):
            return {}
        notices = self._store.notices()
        left = spot.left_for_notice(notices, self.instances, self.run.manifest().heals)
        # Within the two minutes EC2 gives: a node that died instead of leaving is the heartbeat's.
        self._leaving = any(
            n.acted and n.left is None and n.node in self.instances and time.time() - n.noticed < 120
            for n in notices
        )
        for name in left:
            status = self._store.status(name)
            self._store.put_status(_replacing(name, status, "replacing (interrupted)"))
        return left

    def _left_at_preflight(self) -> list[str]:
        """Nodes a preflight round flagged for replacement that left: replaced once each (a node
        flagged again fails the run: runs.preflight.action). The others are in the next round by then."""
        if self._preflight_over or self.spec.cluster.preflight.checks == "off":
            return []
        store = self._store
        asked: set[str] = set()
        verdict = None
        for round_ in range(1, store.preflight_rounds() + 1):
            verdict = store.preflight_round(round_)[1]
            if verdict is not None and verdict.action == "replace":
                asked |= set(verdict.flagged_nodes)
        # a last round that let the run train (or failed it) ends preflight: no more looks each check
        self._preflight_over = verdict is not None and verdict.action != "replace"
        answered = {h.node for h in self.run.manifest().heals if h.reason == "preflight"}
        left = []
        for name in sorted(asked - answered):
            status = store.status(name)
            if name in self.instances and status is not None and status.interrupted:
                store.put_status(_replacing(name, status, "replacing (interrupted)"))
                left.append(name)
        return left

    def _heal(
        self,
        gone: list[str],
        notices: dict[str, Notice],
        states: dict[str, str],
        reasons: dict[str, HealReason],
    ) -> None:
        """Replace the instances of `gone`: vanished, left for a spot `notices`, or for `reasons`
        (preflight flagged it, a straggler)."""
        started = time.time()
        for name in gone:
            why = "left for a spot notice" if name in notices else "is gone"
            why = {"preflight": "was flagged by preflight", "straggler": "is a straggler"}.get(
                reasons.get(name, ""), why
            )
            self.log(
                f"instance {self.instances[name]} of {name} {why}: re-applying the run's Terraform inputs"
            )
            if self.emulated:
                self.emulated.kill(name)  # its process was that instance
        with self._supervisors_go_on(skip=gone):
            self._terminate([n for n in gone if states.get(self.instances[n], "terminated") != "terminated"])
            for name in (n for n in gone if reasons.get(n) == "straggler"):  # its node writes no more
                self._store.put_status(_replacing(name, self._store.status(name), "replacing (straggler)"))
            on_demand, outputs = self._apply_replacements(gone)
        applied = tfvars.instances(outputs)
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
                    reason=reasons.get(name) or ("interrupted" if notice else "vanished"),
                    noticed=notice.noticed if notice else None,
                    on_demand=name in on_demand,
                )
            )
            self.log(f"{name}: replaced by {instance['id']} at {instance['private_ip']}")
            self.instances[name] = instance["id"]
            if self.emulated is not None:
                self.emulated.replace(name, user_data[name])
        self.run.update_manifest(heals=heals, instances=dict(self.instances))

    @contextlib.contextmanager
    def _supervisors_go_on(self, skip: list[str]) -> Iterator[None]:
        """While a heal applies, the other emulated instances' supervisors go on restarting their
        nodes, as systemd on each EC2 instance does: a node that lost its peer to the heal restarted
        only after the apply, 25 s later, and the run failed as that node lost (bench_chaos, seed
        714). Processes only: an emulated VM has its own systemd."""
        if not isinstance(self.emulated, LocalCluster):
            yield
            return
        emulated, done = self.emulated, threading.Event()

        def supervise() -> None:
            while not done.wait(SUPERVISE_EVERY):
                try:
                    emulated.poll(skip=skip)
                except Exception as exc:  # a launch that failed: the next look tries again
                    self.log(f"emulated instances: {exc}")

        thread = threading.Thread(target=supervise, name="emulated-supervisors", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _terminate(self, names: list[str]) -> None:
        """End the instances of nodes that left for a spot notice (EC2 reclaims them within two minutes
        anyway) and wait until EC2 says terminated: only then is each private IP free for its
        replacement, and the heal's plan, which refreshes them, sees them gone and only creates.
        Destroying them through a `-replace` plan would add the provider's fixed 10 s wait."""
        if not names:
            return
        ids = [self.instances[name] for name in names]
        self._ec2.terminate_instances(InstanceIds=ids)
        deadline = time.monotonic() + self.spec.aws.heal_timeout
        while any(state != "terminated" for state in self._describe(ids).values()):
            if time.monotonic() > deadline:
                raise StillRunning(
                    f"{', '.join(ids)} not terminated {self.spec.aws.heal_timeout:.0f}s after healing ended "
                    "them (aws.heal_timeout)"
                )
            time.sleep(TERMINATE_POLL)

    def _apply_replacements(self, gone: list[str]) -> tuple[list[str], dict[str, Any]]:
        """Plan and apply the targeted re-apply; a spot node that finds no capacity is handled as
        cluster.workers.spot.fallback says. Returns the nodes that went on demand, and the stack's
        outputs after the apply."""
        plan_file = self.run.dir / "heal.tfplan"
        # Targeted: drift elsewhere (an emulator's, or a console edit) must not ride along with a heal.
        targets = tuple(tfvars.instance_address(name) for name in gone)
        check_heal_plan(self.terraform.plan(self._var_file(), plan_file, targets=targets), gone)
        try:
            # Bounded: the provider retries a taken IP for minutes, and the watch loop waits on this.
            return [], self.terraform.apply(plan_file, timeout=self.spec.aws.heal_timeout)
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
        check_heal_plan(self.terraform.plan(heal_vars, plan_file, targets=targets), gone)
        return spot_nodes, self.terraform.apply(plan_file, timeout=self.spec.aws.heal_timeout)

    def _var_file(self) -> Path:
        """The run's inputs, or once a replacement went on demand, those inputs with that change."""
        heal_vars = self.run.dir / HEAL_TFVARS
        return heal_vars if heal_vars.exists() else stack.var_file(self.run)


class StillRunning(Exception):
    """An instance healing terminated has not reached `terminated` yet: its IP is not free."""


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


def check_heal_plan(changes: list[PlannedChange], gone: list[str]) -> None:
    """Healing may create the vanished nodes' instances (or replace one a failed attempt left tainted)
    and nothing else may be created or destroyed: a plan that would touch other resources means the
    inputs or the cloud drifted, and a human must look."""
    instances = {tfvars.instance_address(name) for name in gone}
    for change in changes:
        if change.action in ("noop", "read", "update"):
            continue
        if change.address in instances and change.action in ("create", "replace"):
            continue
        raise DlinfraError(
            f"healing stopped: re-applying would {change.action} {change.address}, not only replace "
            f"{', '.join(gone)}. Fix: inspect with `terraform plan` in the run's terraform/stack dir"
        )


def instance_user_data(ec2: Any, instances: dict[str, dict[str, str]]) -> dict[str, str]:
    """What EC2 holds as each instance's user-data, read back through the API."""
    out = {}
    for name, inst in instances.items():
        attr = ec2.describe_instance_attribute(InstanceId=inst["id"], Attribute="userData")
        out[name] = base64.b64decode(attr["UserData"]["Value"]).decode()
    return out

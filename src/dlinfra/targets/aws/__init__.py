"""The aws target: a run is a Terraform stack (VPC, security group, per-role instance groups, IAM)
whose instances boot from the rendered user-data and report to the S3 results store.

    preflight.py  terraform, region, credentials, endpoint, bucket — before anything is planned
    tfvars.py     the Python ↔ HCL contract (the only Python that knows HCL names)
    stack.py      the run's copy of the stack: inputs, pins, destroy; the results-bucket stack
    review.py     plan summary, dated prices, vCPU quotas
    review_diff.py  a pull request's review: base vs head of an experiment
    emulator.py   a throwaway moto for plans without credentials (`dlinfra plan --emulated`)
    healing.py    the running instances: replace a vanished one in place
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from dlinfra.environment.lock import Platform
from dlinfra.errors import SpecError
from dlinfra.images.vm import VM_PLATFORM
from dlinfra.prepare import NodeInstall, release_requirement
from dlinfra.render import AddressPlan, private_ip_plan
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.manifest import ImagePin, PlanCounts
from dlinfra.runs.store import parse_s3_url
from dlinfra.spec.catalog import machine_of
from dlinfra.spec.pass_env import AWS_FIX as AWS_PASS_ENV_FIX
from dlinfra.spec.pricing import HourlyCost
from dlinfra.targets.aws import amis, egress, emulator, preflight, review, stack, tfvars
from dlinfra.targets.base import Review, TargetOptions

if TYPE_CHECKING:
    from dlinfra.contract import NodeConfig
    from dlinfra.prepare import Prepared
    from dlinfra.runs.run import Run
    from dlinfra.spec.model import Spec
    from dlinfra.targets.aws.healing import InstanceCluster


class AwsTarget:
    name: ClassVar[str] = "aws"
    uses_instance_types: ClassVar[bool] = True
    user_data_limit: ClassVar[int | None] = 16384  # EC2's cap on raw (not base64) user-data
    leaves_resources: ClassVar[bool] = True

    def __init__(self, options: TargetOptions):
        self.options = options
        # run id → its instances as provision's apply output them, for start (no `terraform output`)
        self._applied: dict[str, dict[str, dict[str, str]]] = {}

    def addresses(self, spec: Spec) -> AddressPlan:
        return private_ip_plan(spec)

    def node_install(self, spec: Spec, pinned_wheel: Path | None = None) -> NodeInstall:
        from dlinfra.runs.wheel import node_wheel_started

        wheel = pinned_wheel or node_wheel_started()
        return NodeInstall(release_requirement(), wheel, self.node_platform(spec))

    def node_platform(self, spec: Spec) -> Platform:
        """What the lock is resolved for: the processes that stand in for instances run here; the
        VMs boot Debian 12's Python; instances, the image's (aws.python) on their architecture."""
        if self.options.emulate_instances == "process":
            return Platform.here()
        if self.options.emulate_instances == "vm":
            return VM_PLATFORM
        return Platform(spec.aws.python, machine_of(spec.cluster.workers.instance_type))

    def capacity(self, spec: Spec) -> list[str]:
        if spec.training.pass_env:  # an instance gets its role, nothing of the deploying shell
            raise SpecError([AWS_PASS_ENV_FIX])
        return []  # a machine per node, of the type it asks for; the plan checks the vCPU quotas

    def preflight(self, spec: Spec) -> None:
        preflight.preflight(spec, self.options.emulate_instances)

    @property
    def own_machines(self) -> bool:
        return self.options.emulate_instances is None

    def settle(
        self, spec: Spec, configs: dict[str, NodeConfig], locks: Callable[[], dict[str, str]]
    ) -> tuple[Spec, str | None]:
        if spec.aws.egress != "auto":
            return spec, None
        if self.options.emulate_instances == "vm":
            settled = egress.Settled("nat", "the VMs boot local images, not AMIs")
        else:
            flavors = amis.role_flavors(configs)
            images = amis.choose(spec, flavors, preflight.client(spec, "ec2"), {})
            region = egress.bucket_region(preflight.client(spec, "s3"))
            settled = egress.settle(spec, images, flavors, locks, region)
        aws = spec.aws.model_copy(update={"egress": settled.egress})
        return spec.model_copy(update={"aws": aws}), settled.line()

    def plan(self, prepared: Prepared) -> Review:
        prepared = _rerun_base_ami(prepared)
        run = prepared.run
        tf = stack.run_stack(run, self.options.log)
        images = self._images(prepared)
        inputs = stack.write_inputs(run, tfvars.stack_tfvars(prepared, images), tf, prepared.upload)
        plan_file = run.dir / "tfplan"
        tf.plan(inputs, plan_file, lock=prepared.upload)  # a read-only role cannot write a state lock
        plan_json = tf.show_json(plan_file)
        base_ami = tfvars.planned_ami(plan_json)
        summary = review.summarize(plan_json, run.id, prepared.spec, amis.describe(images, base_ami))
        markdown, text = summary.markdown(), summary.text()
        if prepared.spec.aws.endpoint_url:  # nothing of this plan was checked by AWS: say what to confirm
            emulator.mark_run(run.dir, prepared.spec)
            markdown += "\n" + emulator.note_markdown(prepared.spec)
            text += "\n" + emulator.note_text(prepared.spec)
        (run.dir / "plan.md").write_text(markdown, encoding="utf-8")
        counts = PlanCounts(
            add=summary.add, change=summary.change, destroy=summary.destroy, usd_per_hour=summary.cost.known
        )
        run.update_manifest(status="PLANNED", plan=counts, ami_id=base_ami)
        return Review(
            text,
            markdown,
            needs_approval=True,
            plan_file=plan_file,
            counts=(summary.add, summary.change, summary.destroy),
        )

    def _images(self, prepared: Prepared) -> dict[str, ImagePin | None]:
        """Each role's AMI; VMs boot a local image instead (chosen when they start)."""
        manifest = prepared.run.manifest()
        if self.options.emulate_instances == "vm":
            return {}
        # a rerun boots the AMIs its original booted (not the local images of a VM-emulated original)
        images = manifest.images if manifest.rerun_of else {}
        pinned = {role: pin for role, pin in images.items() if pin.id.startswith("ami-")}
        ec2 = preflight.client(prepared.spec, "ec2")
        pinned_ami = manifest.rerun_of and manifest.ami_id == prepared.spec.aws.ami
        amis.check_exists(prepared.spec, ec2, manifest.rerun_of if pinned_ami else None)
        chosen = amis.choose(prepared.spec, amis.role_flavors(prepared.configs), ec2, pinned)
        prepared.run.update_manifest(images={role: pin for role, pin in chosen.items() if pin})
        return chosen

    def provision(self, prepared: Prepared, plan: Review) -> None:
        assert plan.plan_file is not None
        run, t0 = prepared.run, time.time()
        tf = stack.run_stack(run, self.options.log)
        instances = self._applied[run.id] = tfvars.instances(tf.apply(plan.plan_file))
        run.update_manifest(
            status="APPLIED",
            apply_seconds=round(time.time() - t0, 1),
            instances={name: i["id"] for name, i in instances.items()},
        )
        self.options.log(f"applied in {time.time() - t0:.0f}s: {len(instances)} instances")

    def start(self, prepared: Prepared) -> InstanceCluster:
        """Instances boot by themselves; with --emulate-instances their user-data, read back from
        the emulator, boots local processes instead."""
        from dlinfra.targets.aws.healing import InstanceCluster, instance_user_data
        from dlinfra.targets.local import LocalCluster, node_environments

        run, spec = prepared.run, prepared.spec
        tf = stack.run_stack(run, self.options.log)
        instances = self._applied.get(run.id) or tfvars.instances(tf.output())
        cluster = InstanceCluster(spec, run, tf, {n: i["id"] for n, i in instances.items()}, self.options.log)
        if self.options.emulate_instances == "vm":
            from dlinfra.targets.aws.vms import VmCluster, node_image

            manifest = run.manifest()
            wheel = run.dir / "code" / manifest.wheel.name if manifest.wheel else None
            lock = manifest.environment.get("cpu")  # VMs train on CPUs
            image = node_image(spec.aws.image, wheel, lock.sha256 if lock else None, self.options.log)
            ec2 = preflight.client(spec, "ec2")
            vms = VmCluster(spec, run, image, ec2, cluster.instances, self.options.log)
            cluster.emulated = vms
            try:
                vms.start(
                    instance_user_data(ec2, instances), {n: i["private_ip"] for n, i in instances.items()}
                )
            except BaseException:
                vms.stop(grace=0)
                raise
            run.update_manifest(images=dict.fromkeys(spec.roles(), image.pin()))
        elif self.options.emulate_instances:
            mirrored = spec.strategy == "multi_worker_mirrored"
            cluster.emulated = LocalCluster(
                run.dir,
                remap=True,
                restart_together=mirrored,
                record=lambda pids: run.update_manifest(pids=pids),
                replace_interrupted=False,  # an interrupted instance is replaced by healing
                environments=node_environments(prepared, self.options.log),
            )
            try:
                cluster.emulated.start(instance_user_data(preflight.client(spec, "ec2"), instances))
            except BaseException:
                cluster.emulated.stop()
                raise
        return cluster

    def attach(self, prepared: Prepared) -> InstanceCluster:
        from dlinfra.targets.aws.healing import InstanceCluster
        from dlinfra.targets.local import AttachedNodes, node_environments

        run, spec = prepared.run, prepared.spec
        manifest = run.manifest()
        tf = stack.run_stack(run, self.options.log)
        cluster = InstanceCluster(spec, run, tf, dict(manifest.instances), self.options.log)
        if manifest.pids:  # emulated instances: local processes a detached deploy left running
            cluster.emulated = AttachedNodes(
                run.id,
                dict(manifest.pids),
                run_dir=run.dir,
                environments=lambda: node_environments(prepared, self.options.log),
                record=lambda pids: run.update_manifest(pids=pids),
            )
        return cluster

    def controller(self, spec: Spec) -> ControllerStore | None:
        """The results bucket's controller, when one has registered there and the spec allows it."""
        url = spec.storage.url or ""
        if spec.aws.controller == "off" or not url.startswith("s3://"):
            return None
        bucket, _ = parse_s3_url(url)
        found = ControllerStore.of_bucket(
            bucket, spec.storage.endpoint_url or spec.aws.endpoint_url, spec.aws.region
        )
        if found.info() is None:
            return None
        if spec.aws.state_bucket not in (None, bucket):
            self.options.log(
                f"the account's controller reaches Terraform state in s3://{bucket} only (its role and "
                f"VPC endpoint), not aws.state_bucket {spec.aws.state_bucket}: this run is not handed "
                "to it. Fix: leave aws.state_bucket out to hand runs over"
            )
            return None
        return found

    def ready_for_controller(self, run: Run) -> None:
        """The run's state into the state bucket (the results bucket if none is set), where the
        controller acts from."""
        spec = run.spec()
        bucket = spec.aws.state_bucket or parse_s3_url(spec.storage.url or "")[0]
        stack.move_state(run, bucket, self.options.log)

    def wake_controller(self, spec: Spec, store: ControllerStore) -> bool:
        """Its instance started if it is stopped (or went silent): a run was just handed to it."""
        from dlinfra.targets.aws import controller

        return controller.wake(store, spec.aws.region, spec.aws.endpoint_url, self.options.log)

    def teardown(self, run: Run) -> str:
        from dlinfra.targets.aws.vms import stop_leftover_vms

        stop_leftover_vms(run)  # a deploy that died leaves its VMs running: they were its instances
        return stack.destroy(run)

    def hourly_cost(self, spec: Spec) -> HourlyCost:
        return review.hourly_cost(spec)


TARGET = AwsTarget


def _rerun_base_ami(prepared: Prepared) -> Prepared:
    """A rerun boots the base AMI its original resolved (the SSM parameter may name a newer one by
    now), unless the rerun names an AMI of its own (`--set aws.ami=…`)."""
    manifest, spec = prepared.run.manifest(), prepared.spec
    if not (manifest.rerun_of and manifest.ami_id and spec.aws.ami is None):
        return prepared
    aws = spec.aws.model_copy(update={"ami": manifest.ami_id})
    return dataclasses.replace(prepared, spec=spec.model_copy(update={"aws": aws}))

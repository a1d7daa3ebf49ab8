"""Node AMIs: the image recipe (dlinfra.images.Recipe) run once on a builder instance, then imaged.

    bake        wheel → s3://bucket/prefix/images/<digest>/ ; apply infra/image (one builder whose
                user-data fetches the wheel, runs the recipe, uploads /etc/dlinfra/image.json as the
                completion marker) ; wait for the marker ; apply again with create_ami ; take the AMI
                out of the state (an image is an artifact that outlives its builder, as with Packer) ;
                destroy the builder, its network and its role
    find_baked  the newest AMI this account baked for a dlinfra version and flavor

Why `aws_ami_from_instance` on a plain instance rather than EC2 Image Builder: the builder runs the
very recipe the local backend runs in a chroot (one script, one digest, one ImageRecord on every
backend), whereas Image Builder wants it re-expressed as components, a recipe, an infrastructure
configuration and a pipeline: four more long-lived resource kinds to version, share and clean up. A
builder instance and CreateImage are plain EC2, which moto emulates, so the whole flow is tested
offline with real Terraform; Image Builder is not emulated there.

The digest (recipe, flavor, lock, wheel, dlinfra version) tags the AMI and keys everything: a second bake
of the same digest returns the AMI already registered. The base AMI is recorded (tag
dlinfra:base-ami) but is not part of the digest: a newer Deep Learning AMI does not re-bake by itself.

This module and infra/image/ are the only places that know the image stack's variable, output,
resource and tag names; the builder's own side (its cloud-config, and waiting for its report) is
targets.aws.builder.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlinfra import __version__
from dlinfra.errors import DlinfraError
from dlinfra.images import ImageRecord, Recipe
from dlinfra.runs.run import home
from dlinfra.spec.model import Spec
from dlinfra.targets.aws import preflight
from dlinfra.targets.aws.builder import (
    FAILED,
    LOCK,
    MARKER,
    ami_name,
    builder_user_data,
    image_prefix,
    wait_for_builder,
)
from dlinfra.targets.aws.stack import INFRA
from dlinfra.targets.base import Log
from dlinfra.terraform import Terraform

STACK = "image"
AMI_ADDRESS = "aws_ami_from_instance.this[0]"
OUT_BUILDER, OUT_AMI = "builder_instance_id", "ami_id"

TAG_DIGEST = "dlinfra:image-digest"
TAG_VERSION = "dlinfra:version"
TAG_FLAVOR = "dlinfra:flavor"
TAG_WHEEL = "dlinfra:wheel-sha256"
TAG_LOCK = "dlinfra:lock-sha256"


def work_dir(recipe: Recipe) -> Path:
    return home() / "images" / "aws" / recipe.digest[:16]


def image_tfvars(spec: Spec, recipe: Recipe, user_data: str, *, create_ami: bool) -> dict[str, Any]:
    """infra/image/variables.tf."""
    bucket, prefix = image_prefix(spec, recipe.digest)
    return {
        "image": {
            "name": ami_name(recipe),
            "digest": recipe.digest,
            "version": __version__,
            "flavor": recipe.flavor,
            "wheel_sha256": recipe.wheel_sha256,
            "lock_sha256": recipe.lock.sha256,
        },
        "create_ami": create_ami,
        "region": spec.aws.region,
        "endpoint_url": spec.aws.endpoint_url,
        "base_ami_id": spec.aws.ami,
        "user_data": user_data,
        # Nodes launched from the AMI need at least the root volume it was baked on.
        "root_volume_gb": spec.aws.root_volume_gb,
        "ssm_access": spec.aws.ssm_access,
        "network": spec.aws.network(),
        "bucket": bucket,
        "prefix": prefix,
        "tags": dict(spec.aws.tags),
    }


def _images(ec2: Any, filters: dict[str, str]) -> list[dict[str, Any]]:
    response = ec2.describe_images(
        Owners=["self"],
        Filters=[{"Name": f"tag:{key}", "Values": [value]} for key, value in filters.items()],
    )
    images = [i for i in response.get("Images", []) if i.get("State", "available") == "available"]
    return sorted(images, key=lambda i: i.get("CreationDate", ""), reverse=True)


def find_baked(ec2: Any, version: str, flavor: str) -> dict[str, Any] | None:
    """The newest AMI this account baked for `version` and `flavor`: {id, digest, wheel_sha256,
    lock_sha256, name}, or None."""
    for image in _images(ec2, {TAG_VERSION: version, TAG_FLAVOR: flavor}):
        tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
        return {
            "id": image["ImageId"],
            "digest": tags.get(TAG_DIGEST),
            "wheel_sha256": tags.get(TAG_WHEEL),
            "lock_sha256": tags.get(TAG_LOCK),
            "name": image.get("Name"),
        }
    return None


def bake(
    spec: Spec,
    recipe: Recipe,
    log: Log,
    *,
    builder_done: Callable[[ImageRecord], None] | None = None,
    timeout: float = 3600,
) -> str:
    """Bake `recipe` into an AMI and return its id (an AMI already baked from this digest is returned
    as is). `timeout`: seconds the builder may take from launch to its completion marker.
    `builder_done` is called with the record the builder reported, before the AMI is registered."""
    preflight.preflight(spec, None)  # also: an s3:// store, and an explicit AMI on emulators
    ec2, s3 = preflight.client(spec, "ec2"), preflight.client(spec, "s3")
    tag = recipe.digest[:12]
    root = work_dir(recipe)
    inputs = root / "image.tfvars.json"

    if existing := _images(ec2, {TAG_DIGEST: recipe.digest}):
        ami = existing[0]["ImageId"]
        log(f"image {tag}: {ami} ({existing[0].get('Name')}) is already baked")
        if _has_state(root):
            _remove_leftovers(_stack(root, log), inputs, log, keep_ami=True)
        return str(ami)

    bucket, prefix = image_prefix(spec, recipe.digest)
    user_data = builder_user_data(spec, recipe, timeout)
    tf = _stack(root, log)
    if _has_state(root):
        _remove_leftovers(tf, inputs, log, keep_ami=False)

    # A marker from an earlier, interrupted bake would image a builder that has not run yet.
    for key in (MARKER, FAILED):
        s3.delete_object(Bucket=bucket, Key=f"{prefix}/{key}")
    s3.upload_file(str(recipe.wheel), bucket, f"{prefix}/{recipe.wheel.name}")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{LOCK}", Body=recipe.lock.text.encode())
    log(f"image {tag}: {recipe.wheel.name} and its lock → s3://{bucket}/{prefix}/")

    _write(inputs, image_tfvars(spec, recipe, user_data, create_ami=False))
    t0 = time.monotonic()
    try:
        # No saved plan to review: the builder's stack is dlinfra's own, sized by nothing the user
        # chose but the network (and each terraform command loads the whole AWS provider).
        events = tf.run(["apply", "-input=false", "-json", "-auto-approve", f"-var-file={inputs}"])
        builder = str(tf.outputs_of(events)[OUT_BUILDER])
        log(f"image {tag}: builder {builder} runs the recipe (up to {timeout:.0f}s)")
        record = wait_for_builder(spec, recipe, ec2, s3, builder, root, timeout)
        built = record.tensorflow or "no TensorFlow"
        log(f"image {tag}: builder done in {time.monotonic() - t0:.0f}s ({built})")
        if builder_done is not None:
            builder_done(record)
        ami = _register(tf, spec, recipe, user_data, inputs, root)
        log(f"image {tag}: registered {ami} ({ami_name(recipe)})")
        tf.run(["state", "rm", AMI_ADDRESS], json_events=False)
    except BaseException:
        log(f"image {tag}: destroying the builder")
        tf.destroy(inputs)
        raise
    tf.destroy(inputs)
    log(f"image {tag}: {ami} baked in {time.monotonic() - t0:.0f}s; builder destroyed")
    return ami


def _stack(root: Path, log: Log) -> Terraform:
    """The image stack's working copy, one per digest: the HCL refreshed from the package (a
    checkout's HCL changes under one version), state and providers (.terraform) kept."""
    skip = shutil.ignore_patterns("tests", ".terraform*")
    for part in (STACK, "modules"):
        shutil.copytree(INFRA / part, root / part, dirs_exist_ok=True, ignore=skip)
    tf = Terraform(root / STACK, log=log)
    tf.init()
    return tf


def _write(path: Path, variables: dict[str, Any]) -> None:
    path.write_text(json.dumps(variables, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _has_state(root: Path) -> bool:
    state = root / STACK / "terraform.tfstate"
    return state.is_file() and bool(json.loads(state.read_text(encoding="utf-8") or "{}").get("resources"))


def _remove_leftovers(tf: Terraform, inputs: Path, log: Log, *, keep_ami: bool) -> None:
    """What an interrupted bake left (a builder, its network): destroyed. A registered AMI is kept
    when it is the one being returned; a half-made one goes with the rest."""
    log(f"removing what an interrupted bake left in {tf.workdir}")
    if keep_ami and AMI_ADDRESS in tf.run(["state", "list"], json_events=False, quiet=True).split():
        tf.run(["state", "rm", AMI_ADDRESS], json_events=False)
    tf.destroy(inputs)


def _register(tf: Terraform, spec: Spec, recipe: Recipe, user_data: str, inputs: Path, root: Path) -> str:
    """The second apply: only the AMI. Without a refresh, because the state was written by this bake
    minutes ago and emulators read some builder attributes back differently (moto: its security
    groups, its public IP); and checked, because replacing the builder now would image a fresh
    instance that never ran the recipe."""
    _write(inputs, image_tfvars(spec, recipe, user_data, create_ami=True))
    plan_file = root / "ami.tfplan"
    tf.run(["plan", "-input=false", "-json", "-refresh=false", f"-var-file={inputs}", f"-out={plan_file}"])
    unexpected = [
        f"{change['address']} ({'/'.join(change['change']['actions'])})"
        for change in tf.show_json(plan_file).get("resource_changes", [])
        if change["change"]["actions"] not in (["no-op"], ["read"])
        and not (change["type"] == "aws_ami_from_instance" and change["change"]["actions"] == ["create"])
    ]
    if unexpected:
        raise DlinfraError(
            "registering the AMI would also change the builder's stack: "
            f"{', '.join(unexpected)}. Nothing was registered; the builder is destroyed"
        )
    return str(tf.apply(plan_file)[OUT_AMI])

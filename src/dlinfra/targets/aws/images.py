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
resource and tag names.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dlinfra import __version__
from dlinfra.errors import DlinfraError
from dlinfra.images import IMAGE_JSON_PATH, ImageRecord, Recipe, pip_options, terraform_tools
from dlinfra.runs.run import home
from dlinfra.runs.store import parse_s3_url
from dlinfra.spec.model import Spec
from dlinfra.targets.aws import preflight
from dlinfra.targets.aws.stack import INFRA
from dlinfra.targets.base import Log
from dlinfra.terraform import Terraform

STACK = "image"
AMI_ADDRESS = "aws_ami_from_instance.this[0]"
OUT_BUILDER, OUT_AMI = "builder_instance_id", "ami_id"
POLL_SECONDS = 5.0
# The builder powers itself off this long after the bake's own deadline, should the CLI that
# would destroy it be gone (CreateImage reboots it first, which cancels the scheduled shutdown).
WATCHDOG_GRACE_MINUTES = 15

WHEEL_DIR = "/opt/dlinfra-wheel"
RECIPE_PATH = "/usr/local/lib/dlinfra/image-recipe.sh"
TOOLS_SCRIPT = "/usr/local/lib/dlinfra/terraform-tools.sh"
TOOLS_DIR = f"{WHEEL_DIR}/terraform-tools"
EXTRA_CA_PATH = "/usr/local/share/ca-certificates/dlinfra-extra-ca.crt"
BUILD_LOG = "/var/log/cloud-init-output.log"
MARKER = "image.json"
LOCK = "env.lock"  # the recipe's lock, beside its wheel (the digest covers both)
FAILED = "builder-failed.log"

TAG_DIGEST = "dlinfra:image-digest"
TAG_VERSION = "dlinfra:version"
TAG_FLAVOR = "dlinfra:flavor"
TAG_WHEEL = "dlinfra:wheel-sha256"
TAG_LOCK = "dlinfra:lock-sha256"

_AMI_NAME_CHARS = re.compile(r"[^A-Za-z0-9()\[\] ./'@_-]")


def image_prefix(spec: Spec, digest: str) -> tuple[str, str]:
    """(bucket, key prefix) of one image's wheel and markers: s3://bucket/prefix/images/<digest>."""
    bucket, prefix = parse_s3_url(spec.storage.url or "")
    return bucket, "/".join(p for p in (prefix, "images", digest) if p)


def ami_name(recipe: Recipe) -> str:
    """dlinfra-<version>-<flavor>-<digest12>, with what AMI names may not hold (a local version's
    '+') replaced."""
    return _AMI_NAME_CHARS.sub("-", f"dlinfra-{__version__}-{recipe.flavor}-{recipe.digest[:12]}")


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


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks: the recipe stays readable in the console and in
    describe-instance-attribute."""


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    ),
)


def _pip_options(spec: Spec) -> str:
    return pip_options(spec.aws.pip_index_url, spec.aws.pip_extra_ca is not None)


def builder_user_data(spec: Spec, recipe: Recipe, timeout: float) -> str:
    """The builder's cloud-config: fetch the wheel, run the recipe, report. Success uploads the image
    record (the marker bake waits for); failure uploads the build log, so bake fails at once."""
    bucket, prefix = image_prefix(spec, recipe.digest)
    s3 = f"s3://{bucket}/{prefix}"
    wheel = recipe.wheel.name
    paths = (f"{WHEEL_DIR}/{wheel}", f"{WHEEL_DIR}/{LOCK}")
    files: list[dict[str, str]] = [
        {
            "path": RECIPE_PATH,
            "owner": "root:root",
            "permissions": "0755",
            "content": recipe.render(*paths, _pip_options(spec), "aws", TOOLS_DIR if recipe.tools else None),
        }
    ]
    recipe_steps = f"sh {RECIPE_PATH}"
    if recipe.tools:  # the controller's terraform and providers, fetched and checked before the recipe
        script = terraform_tools.fetch_script(TOOLS_DIR)
        files.append({"path": TOOLS_SCRIPT, "owner": "root:root", "permissions": "0755", "content": script})
        recipe_steps = f"sh {TOOLS_SCRIPT} && {recipe_steps}"
    commands: list[Any] = [
        ["shutdown", "-h", f"+{math.ceil(timeout / 60) + WATCHDOG_GRACE_MINUTES}"],
        ["mkdir", "-p", WHEEL_DIR],
    ]
    if extra_ca := getattr(spec.aws, "pip_extra_ca", None):
        files.append(
            {"path": EXTRA_CA_PATH, "owner": "root:root", "permissions": "0644", "content": extra_ca}
        )
        commands.append(["update-ca-certificates"])
    # The base AMI's own AWS CLI fetches the wheel and the lock.
    commands.append(["aws", "s3", "cp", f"{s3}/{wheel}", f"{WHEEL_DIR}/"])
    commands.append(["aws", "s3", "cp", f"{s3}/{LOCK}", f"{WHEEL_DIR}/{LOCK}"])
    # One shell line: the marker only when the recipe succeeded, the log only when it did not.
    commands.append(
        f"{recipe_steps} && aws s3 cp {IMAGE_JSON_PATH} {s3}/{MARKER} || aws s3 cp {BUILD_LOG} {s3}/{FAILED}"
    )
    header = (
        "#cloud-config\n"
        f"# dlinfra {__version__} image builder: recipe {recipe.digest[:16]} ({recipe.flavor}) "
        f"for AMI {ami_name(recipe)}.\n"
    )
    body = yaml.dump(
        {"write_files": files, "runcmd": commands},
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=None,
        width=4096,  # long s3:// lines unfolded, as an operator would type them
    )
    return header + body


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
        record = _wait_for_builder(spec, recipe, ec2, s3, builder, root, timeout)
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


def _wait_for_builder(
    spec: Spec, recipe: Recipe, ec2: Any, s3: Any, builder: str, root: Path, timeout: float
) -> ImageRecord:
    bucket, prefix = image_prefix(spec, recipe.digest)
    deadline = time.monotonic() + timeout
    while True:
        marker = _get(s3, bucket, f"{prefix}/{MARKER}")
        if marker is not None:
            return _checked_record(marker, recipe, bucket, prefix)
        failed = _get(s3, bucket, f"{prefix}/{FAILED}")
        if failed is not None:
            tail = "\n".join(failed.decode(errors="replace").splitlines()[-30:])
            raise DlinfraError(
                f"the image recipe failed on builder {builder} (full log: s3://{bucket}/{prefix}/{FAILED}). "
                f"Its last lines:\n{tail}"
            )
        state = _instance_state(ec2, builder)
        if state not in ("pending", "running"):
            raise DlinfraError(
                f"builder {builder} is {state} before finishing the recipe. "
                f"{_console_hint(spec, ec2, builder, root)}"
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DlinfraError(
                f"builder {builder} did not finish the image recipe in {timeout:.0f}s "
                f"(no s3://{bucket}/{prefix}/{MARKER}). {_console_hint(spec, ec2, builder, root)} "
                "A slow mirror or a GPU flavor's CUDA wheels may need a longer timeout."
            )
        time.sleep(min(POLL_SECONDS, remaining))


def _get(s3: Any, bucket: str, key: str) -> bytes | None:
    import botocore.exceptions as bx

    try:
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except bx.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise


def _checked_record(marker: bytes, recipe: Recipe, bucket: str, prefix: str) -> ImageRecord:
    where = f"s3://{bucket}/{prefix}/{MARKER}"
    try:
        record = ImageRecord.model_validate_json(marker)
    except ValueError as exc:
        raise DlinfraError(f"{where} is not an image record ({exc}): the recipe is broken") from None
    if (record.recipe_digest, record.wheel_sha256) != (recipe.digest, recipe.wheel_sha256):
        raise DlinfraError(
            f"{where} records recipe {record.recipe_digest[:12]} with wheel {record.wheel_sha256[:12]}, "
            f"not {recipe.digest[:12]} with {recipe.wheel_sha256[:12]}: another build wrote it"
        )
    return record


def _instance_state(ec2: Any, instance_id: str) -> str:
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return next((str(i["State"]["Name"]) for r in reservations for i in r["Instances"]), "gone")


def _console_hint(spec: Spec, ec2: Any, builder: str, root: Path) -> str:
    """Where to look: the console output, saved before the builder is destroyed (EC2 keeps it only
    for a while after termination), and the command that shows it."""
    command = f"aws ec2 get-console-output --instance-id {builder} --region {spec.aws.region} --latest"
    if spec.aws.endpoint_url:
        command += f" --endpoint-url {spec.aws.endpoint_url}"
    hint = f"Look at the builder's console: `{command}`"
    try:
        output = ec2.get_console_output(InstanceId=builder, Latest=True).get("Output") or ""
    except Exception:  # the hint must not hide the error it explains
        return hint
    saved = root / "builder-console.log"
    saved.write_text(output, encoding="utf-8")  # botocore has decoded it already
    return f"{hint} (saved in {saved})"


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

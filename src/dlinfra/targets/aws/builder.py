"""The image builder: the one instance a bake launches, what it is told to do and how bake waits for it.

Its cloud-config (builder_user_data) fetches the wheel and its lock from s3://bucket/prefix/images/<digest>/,
runs the recipe and reports through that same prefix: the image record (MARKER) when the recipe
succeeded, the build log (FAILED) when it did not. wait_for_builder reads those two objects and the
instance's state, so a failed or stopped builder fails the bake at once with the builder's own
words, and a silent one fails it at the deadline with where to look. The Terraform side of a bake
(the stack, its variables, the AMI) is in targets.aws.images.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import yaml

from dlinfra import __version__
from dlinfra.errors import DlinfraError
from dlinfra.images import IMAGE_JSON_PATH, ImageRecord, Recipe, pip_options, terraform_tools
from dlinfra.runs.store import parse_s3_url
from dlinfra.spec.model import Spec

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

_AMI_NAME_CHARS = re.compile(r"[^A-Za-z0-9()\[\] ./'@_-]")


def image_prefix(spec: Spec, digest: str) -> tuple[str, str]:
    """(bucket, key prefix) of one image's wheel and markers: s3://bucket/prefix/images/<digest>."""
    bucket, prefix = parse_s3_url(spec.storage.url or "")
    return bucket, "/".join(p for p in (prefix, "images", digest) if p)


def ami_name(recipe: Recipe) -> str:
    """dlinfra-<version>-<flavor>-<digest12>, with what AMI names may not hold (a local version's
    '+') replaced."""
    return _AMI_NAME_CHARS.sub("-", f"dlinfra-{__version__}-{recipe.flavor}-{recipe.digest[:12]}")


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


def wait_for_builder(
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

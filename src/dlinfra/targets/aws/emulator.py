"""A throwaway AWS emulator for plans that need no cloud credentials (`dlinfra plan --emulated`).

moto starts on a free loopback port for one plan and stops after it. The plan itself runs in a child
process whose environment holds no AWS setting of the caller's (no keys, profiles or config files)
and fake keys that only the emulator accepts: a real credential can neither reach the emulator nor
be spent by mistake, and nothing is written to a real bucket. What an emulator cannot tell (the real
AMI, the account's quotas, prices outside the catalog) is listed with every such plan.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.runs.store import parse_s3_url
from dlinfra.spec.catalog import catalog
from dlinfra.spec.model import Spec
from dlinfra.targets.aws.review import quota_usage

# Where an experiment without an s3:// store keeps its results in the emulator (a plan needs one).
PLACEHOLDER_BUCKET = "dlinfra-emulated-plan"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "emulator", "AWS_SECRET_ACCESS_KEY": "emulator-only"}
MARKER = "EMULATED-PLAN.md"  # in the run dir of every plan made against an emulator


@dataclass(frozen=True)
class Emulator:
    """A running emulator and what the plan needs set to use it."""

    endpoint_url: str
    region: str
    ami: str
    storage_url: str | None  # the placeholder store, when the experiment names no s3:// one

    def overrides(self) -> list[str]:
        """`--set` values pointing the experiment at the emulator, for the plan only."""
        sets = [f"aws.endpoint_url={self.endpoint_url}", f"aws.ami={self.ami}"]
        return sets + ([f"storage.url={self.storage_url}"] if self.storage_url else [])

    def child_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The caller's environment without any AWS setting, plus keys only the emulator takes."""
        env = {k: v for k, v in environ.items() if not k.startswith("AWS_")}
        return (
            env
            | FAKE_CREDENTIALS
            | {
                "AWS_DEFAULT_REGION": self.region,
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_EC2_METADATA_DISABLED": "true",
            }
        )


@contextmanager
def throwaway(spec: Spec) -> Iterator[Emulator]:
    """moto on 127.0.0.1 (a port the kernel picks), holding the buckets the plan reads and an AMI."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise DlinfraError(
            "--emulated needs the emulator (moto). Fix: pip install 'dlinfra[emulator]'"
        ) from None
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request would bury the plan
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        region = spec.aws.region
        url = spec.storage.url or ""
        storage_url = None if url.startswith("s3://") else f"s3://{PLACEHOLDER_BUCKET}/runs"
        buckets = {parse_s3_url(storage_url or url)[0]} | ({spec.aws.state_bucket} - {None})
        s3 = _client(endpoint, region, "s3")
        where = {"CreateBucketConfiguration": {"LocationConstraint": region}} if region != "us-east-1" else {}
        for bucket in sorted(b for b in buckets if b):
            s3.create_bucket(Bucket=bucket, **where)
        images = _client(endpoint, region, "ec2").describe_images(Owners=["amazon"])["Images"]
        if not images:
            raise DlinfraError(f"--emulated: the emulator has no AMI in {region}. Fix: plan in us-east-1")
        yield Emulator(endpoint, region, sorted(i["ImageId"] for i in images)[0], storage_url)
    finally:
        server.stop()


def _client(endpoint: str, region: str, service: str) -> Any:
    import boto3

    keys = FAKE_CREDENTIALS
    return boto3.session.Session(
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        region_name=region,
    ).client(service, endpoint_url=endpoint)


def confirm_on_aws(spec: Spec) -> list[str]:
    """What a plan against an emulator cannot show: each item needs real AWS to confirm."""
    region = spec.aws.region
    vcpus = ", ".join(f"{n} vCPUs of {name}" for name, n in quota_usage(spec).items()) or "no known types"
    prices = (
        f"$/h are the catalog's on-demand prices for {region} ({catalog().price_note()}); spot and "
        "savings plans differ"
        if region in catalog().regions
        else f"the catalog has no prices for {region}: $/h is unknown there"
    )
    items = [
        f"AMI: the emulator's `{spec.aws.ami}` stood in; AWS resolves the experiment's aws.ami, a baked "
        "dlinfra image or the Deep Learning AMI, and checks that it exists in the region",
        f"quotas: the emulator enforces none; this cluster needs {vcpus}",
        f"prices: {prices}",
        "permissions: the emulator accepts any request; on AWS the plan role must be allowed to read",
    ]
    if spec.storage.url == f"s3://{PLACEHOLDER_BUCKET}/runs":
        items.append(
            "storage.url: the experiment names no s3:// store; AWS needs one (`dlinfra setup --bucket NAME`)"
        )
    return items


def note_markdown(spec: Spec) -> str:
    items = "\n".join(f"- {item}" for item in confirm_on_aws(spec))
    return f"**Emulated plan** (no AWS account was used). To confirm on real AWS:\n{items}\n"


def note_text(spec: Spec) -> str:
    items = "\n".join(f"  - {item.replace('`', '')}" for item in confirm_on_aws(spec))
    return f"Emulated plan (no AWS account was used); to confirm on real AWS:\n{items}"


def mark_run(run_dir: Path, spec: Spec) -> None:
    """A run dir planned against an emulator says so, and where: nothing of it exists on AWS."""
    where = f"This run was planned against the emulator at {spec.aws.endpoint_url}, not AWS.\n\n"
    (run_dir / MARKER).write_text(where + note_markdown(spec), encoding="utf-8")

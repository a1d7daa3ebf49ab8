"""Before anything is planned: terraform, region, credentials, endpoint and the results bucket."""

from __future__ import annotations

from typing import Any

from dlinfra.errors import CredentialsError, DlinfraError, SpecError
from dlinfra.runs.store import parse_s3_url
from dlinfra.spec.hardware import host_gpu_problems, machine_gpus
from dlinfra.spec.input import shown
from dlinfra.spec.model import Spec
from dlinfra.terraform import find_terraform


def client(spec: Spec, service: str) -> Any:
    """A boto3 client for the spec's region and endpoint, failing fast (the CLI is waiting)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session(region_name=spec.aws.region).client(
        service,
        endpoint_url=spec.aws.endpoint_url,
        config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=20),
    )


def results_bucket(spec: Spec) -> str:
    url = spec.storage.url or ""
    if not url.startswith("s3://"):
        raise SpecError(
            [
                "storage.url: the aws target needs an s3:// store that outlives the cluster. "
                "Fix: `dlinfra setup --bucket NAME`, then set storage.url: s3://NAME/runs"
            ]
        )
    return parse_s3_url(url)[0]


def preflight(spec: Spec, emulate_instances: str | None) -> str:
    """Fail before anything is planned; returns the AWS account id."""
    if emulate_instances and not spec.aws.endpoint_url:
        raise SpecError(
            ["--emulate-instances: only with an emulator. Fix: add --endpoint-url http://HOST:PORT"]
        )
    if emulate_instances not in (None, "process", "vm"):
        raise SpecError([f"--emulate-instances={emulate_instances}: Fix: use process or vm"])
    if emulate_instances:
        # emulated instances run on this machine (qemu passes no GPU through): known now, not at boot
        gpus = 0 if emulate_instances == "vm" else machine_gpus()
        if found := host_gpu_problems(spec, True, gpus, f"emulated instances ({emulate_instances})"):
            raise SpecError([f"{'.'.join(p.loc)}: {p.message}. Fix: {p.fix}" for p in found])
    if emulate_instances == "vm":
        from dlinfra.targets.aws.vms import preflight_problems

        if problems := preflight_problems(spec):
            raise SpecError(problems)
    find_terraform()
    bucket = results_bucket(spec)
    _check_region(spec)
    if spec.aws.endpoint_url and not spec.aws.ami and not spec.aws.ami_ssm_parameter:
        raise SpecError(
            [
                "aws.ami: an emulator endpoint has no Deep Learning AMI parameter. Fix: set aws.ami to an "
                "image id the endpoint lists (describe-images --owners amazon), or aws.ami_ssm_parameter "
                "to a parameter of the emulator's that names one"
            ]
        )
    import botocore.exceptions as bx

    try:
        identity = client(spec, "sts").get_caller_identity()
        client(spec, "s3").head_bucket(Bucket=bucket)
    except bx.NoCredentialsError:
        raise CredentialsError(
            "no AWS credentials found. Fix: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY), or run `aws sso login`"
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
                f"storage.url: bucket {shown(bucket)} does not exist. "
                f"Fix: `dlinfra setup --bucket {bucket}` creates it once"
            ) from None
        raise CredentialsError(
            f"AWS refused the credentials ({code}). Fix: refresh them (`aws sso login`)"
        ) from None
    return str(identity.get("Account", ""))


def _check_region(spec: Spec) -> None:
    import boto3

    session = boto3.session.Session(region_name=spec.aws.region)
    known = set(session.get_available_regions("ec2"))
    for partition in ("aws-us-gov", "aws-cn"):
        known |= set(session.get_available_regions("ec2", partition_name=partition))
    if spec.aws.region not in known:
        raise SpecError(
            [f"aws.region: {shown(spec.aws.region)} is not an AWS region. Fix: use one like us-east-1"]
        )

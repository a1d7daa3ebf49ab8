"""The grammar of the names and URLs people give dlinfra, in one place: experiment names, run ids,
S3 buckets and URLs, regions, HTTP endpoints. A value that matches cannot leave its directory,
break a shell command line or an IAM policy, or carry a credential into a rendered file."""

from __future__ import annotations

import re

from dlinfra.spec.input import shown

# Run ids (name + 21 chars) name IAM roles, which AWS caps at 64 characters with our affixes.
NAME = r"[a-z][a-z0-9-]{0,26}"
NAME_RE = rf"^{NAME}$"
# name-YYYYMMDD-HHMMSS-xxxx (run.new_run_id): one directory name under runs/, never a path
RUN_ID_RE = re.compile(rf"{NAME}-\d{{8}}-\d{{6}}-[0-9a-f]{{4}}")
BUCKET_RE = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"  # S3's bucket naming rules
# a prefix lands in shell command lines (aws s3 cp) and IAM policies: plain characters only
S3_URL_RE = rf"s3://{BUCKET_RE}(/[A-Za-z0-9._=/-]*)?"
REGION_RE = r"^[a-z]{2}(-gov)?-[a-z]+-\d$"
INSTANCE_TYPE_RE = r"^[a-z0-9-]+\.[a-z0-9-]+$"  # family.size, as EC2 (and the stack's validation) spell it


def http_url(v: str | None) -> str | None:
    """An http(s) endpoint without a trailing slash; ValueError (for pydantic) otherwise."""
    if v is not None and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", v):
        raise ValueError(f"must be an http(s) URL like http://127.0.0.1:5000 (got {shown(v)})")
    if v and "@" in v.split("/")[2]:
        raise ValueError(
            "must not carry credentials (user:password@): URLs land in user-data, which anyone who may "
            "describe the instance can read, and in plans and logs. Use an endpoint the nodes reach "
            "without a password (in the VPC, or behind the instance profile)"
        )
    return v.rstrip("/") if v else v


def endpoint_problems(url: str | None) -> list[str]:
    """What is wrong with an --endpoint-url flag (none: real AWS)."""
    try:
        http_url(url)
    except ValueError as exc:
        return [f"--endpoint-url: {exc}. Fix: e.g. http://127.0.0.1:5000"]
    return []


def bucket_problems(bucket: str, region: str) -> list[str]:
    """What is wrong with a bucket name and region given as flags (`dlinfra setup`)."""
    problems = []
    if not re.fullmatch(BUCKET_RE, bucket):
        problems.append(
            f"--bucket {shown(bucket)}: not an S3 bucket name. Fix: 3-63 lowercase letters, digits, "
            "dots and dashes, starting and ending with a letter or digit"
        )
    if not re.fullmatch(REGION_RE, region):
        problems.append(f"--region {shown(region)}: not an AWS region. Fix: e.g. us-east-1, eu-west-1")
    return problems

"""`aws.egress: auto`, settled once per run before anything is rendered: `none` (no NAT gateway, no
route to the internet: nothing of the network bills by the hour, run or no run) when nothing a node
does needs the internet, else `nat`. A node needs it to install at boot (a base AMI, or a baked one
holding another lock than the run's: a changed requirement), to read data outside its region's S3
(the gateway endpoint reaches only that), or for Session Manager (its endpoints are on the internet).
What a user's own program fetches at run time cannot be known here: the plan says how to allow it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlinfra.runs.manifest import ImagePin
from dlinfra.runs.store import parse_s3_url
from dlinfra.spec.model import Spec

RUNTIME_DOWNLOADS = "a program that downloads at run time needs --set aws.egress=nat"


@dataclass(frozen=True)
class Settled:
    egress: str  # nat or none
    why: str

    def line(self) -> str:
        if self.egress == "none":
            return f"aws.egress auto → none: {self.why}; no NAT gateway ({RUNTIME_DOWNLOADS})"
        return f"aws.egress auto → nat: {self.why}"


def settle(
    spec: Spec,
    images: dict[str, ImagePin | None],
    flavors: dict[str, str],
    locks: Callable[[], dict[str, str]],
    bucket_region: Callable[[str], str | None],
) -> Settled:
    """`images`: each role's AMI (None: the base one, installing at boot); `flavors`: each role's
    image flavor; `locks`: flavor → the run's lock digest (asked only when every role is baked);
    `bucket_region`: a bucket's region, None when it cannot be told."""
    if spec.aws.ssm_access:
        return Settled("nat", "aws.ssm_access: Session Manager's endpoints are outside the VPC")
    if base := sorted(role for role in flavors if images.get(role) is None):
        return Settled("nat", f"{', '.join(base)} boot the base AMI and install at boot")
    run = locks()
    stale = sorted(role for role, pin in images.items() if pin and pin.lock_sha256 != run[flavors[role]])
    if stale:
        return Settled("nat", f"the baked image of {', '.join(stale)} holds another lock than this run's")
    if problem := _data_outside(spec, bucket_region):
        return Settled("nat", problem)
    return Settled("none", "every node boots a baked image holding this run's lock, its data is in S3 here")


def _data_outside(spec: Spec, bucket_region: Callable[[str], str | None]) -> str | None:
    ds = spec.training.dataset
    for field, uri in (("uri", ds.uri), ("eval_uri", ds.eval_uri)):
        if not uri:
            continue
        where = f"training.dataset.{field} ({uri})"
        if not uri.startswith("s3://"):
            return f"{where} is read from outside S3"
        region = bucket_region(parse_s3_url(uri)[0])
        if region != spec.aws.region:
            return f"{where} is in {region or 'a region not known'}, not {spec.aws.region}"
    return None


def bucket_region(s3: Any) -> Callable[[str], str | None]:
    """S3 says a bucket's region in a header even when it refuses the request itself."""
    from botocore.exceptions import ClientError

    def region(bucket: str) -> str | None:
        try:
            response = s3.head_bucket(Bucket=bucket)
        except ClientError as exc:
            response = exc.response
        return response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")

    return region

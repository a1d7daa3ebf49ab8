"""The `aws:` section of an experiment spec. Its network ranges are checked each on its own (private,
a size AWS accepts) and together (the subnets inside the VPC, apart from each other) when the spec
is read, so a range Terraform's preconditions would refuse is never planned."""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Iterator
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from dlinfra.spec.grammar import BUCKET_RE, REGION_RE, http_url
from dlinfra.spec.input import StrictModel, shown

# AWS's tag rules; dlinfra adds Name, dlinfra:run-id, :experiment and :role to the 50 EC2 allows.
TAG_KEY = re.compile(r"[\w .:/=+\-@]{1,128}")
TAG_VALUE = re.compile(r"[\w .:/=+\-@]{0,256}")
MAX_TAGS = 46
Python = Literal["3.10", "3.11", "3.12", "3.13"]
PYTHONS: tuple[str, ...] = get_args(Python)
# AWS: VPCs and subnets are /16 to /28.
PREFIXES = range(16, 29)
# The NAT gateway's public subnet needs few addresses; a /24 keeps the derived range easy to read.
PUBLIC_PREFIX = 24


def checked_cidr(value: str) -> str:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"must be an IPv4 CIDR like 10.42.1.0/24 ({exc})") from None
    if not net.is_private:
        raise ValueError(f"must be a private range (10/8, 172.16/12, 192.168/16), got {value}")
    if net.prefixlen not in PREFIXES:
        raise ValueError(f"must be /16 to /28 (AWS's VPC and subnet sizes), got /{net.prefixlen}")
    return value


def public_subnet(vpc_cidr: str, subnet_cidr: str, public_cidr: str | None) -> str | None:
    """The NAT gateway's subnet: `public_cidr` when given (checked), else the first /24 (or, in a
    small VPC, the largest block) of the VPC clear of the cluster subnet. None: there is no room."""
    vpc, subnet = ipaddress.IPv4Network(vpc_cidr), ipaddress.IPv4Network(subnet_cidr)
    if public_cidr is None:
        return next((str(c) for c in _candidates(vpc) if not c.overlaps(subnet)), None)
    public = ipaddress.IPv4Network(public_cidr)
    where = "is not inside aws.vpc_cidr" if not public.subnet_of(vpc) else "overlaps aws.subnet_cidr"
    if where.startswith("is not") or public.overlaps(subnet):
        clear = next((str(c) for c in _candidates(vpc) if not c.overlaps(subnet)), None)
        fix = f"set it to {clear}, or leave it out to get that" if clear else "use a smaller aws.subnet_cidr"
        raise ValueError(
            f"aws.public_subnet_cidr {public_cidr} {where} ({vpc_cidr if 'vpc' in where else subnet_cidr})"
            f". Fix: {fix}"
        )
    return public_cidr


def _example(vpc: ipaddress.IPv4Network) -> str:
    blocks = list(itertools.islice(vpc.subnets(new_prefix=max(24, vpc.prefixlen + 1)), 2))
    return str(blocks[-1])


def _candidates(vpc: ipaddress.IPv4Network) -> Iterator[ipaddress.IPv4Network]:
    for prefix in range(max(PUBLIC_PREFIX, vpc.prefixlen + 1), PREFIXES.stop):
        yield from vpc.subnets(new_prefix=prefix)


class AwsSpec(StrictModel):
    region: str = Field("us-east-1", pattern=REGION_RE)
    endpoint_url: str | None = Field(
        None, description="Emulator endpoint for every AWS service (moto, LocalStack)."
    )
    ami: str | None = Field(
        None, pattern=r"^ami-[0-9a-f]{8,17}$", description="AMI id; default: the Deep Learning AMI."
    )
    ami_ssm_parameter: str | None = Field(
        None,
        pattern=r"^/[A-Za-z0-9_.\-/]+$",
        description="SSM parameter naming the base AMI when aws.ami is not set (another AMI family, "
        "an ARM one); default: the Deep Learning Base OSS Nvidia Driver GPU AMI's. A run records the "
        "AMI it resolved, and its reruns boot that one.",
    )
    python: Python = Field(
        "3.12",
        description="The Python of the nodes' image, which the run's environment is locked for "
        "(3.12: the default Deep Learning AMI's, Ubuntu 24.04).",
    )
    vpc_cidr: str = "10.42.0.0/16"
    subnet_cidr: str = Field("10.42.1.0/24", description="The cluster's subnet, inside vpc_cidr.")
    public_subnet_cidr: str | None = Field(
        None,
        description="egress nat: the NAT gateway's subnet, inside vpc_cidr and apart from subnet_cidr "
        "(default: the first such /24).",
    )
    egress: Literal["auto", "nat", "public_ip", "none"] = Field(
        "auto",
        description="How nodes reach the internet (package mirrors, data outside the region's S3). auto: "
        "none when every node boots a baked image holding the run's whole environment and its data is "
        "in this region's S3 (no NAT gateway at all), else nat; nat: a NAT gateway (billed per hour "
        "and GB); public_ip: public IPs, no NAT; none: only S3 of the region and the cluster's peers.",
    )
    state_bucket: str | None = Field(
        None,
        pattern=f"^{BUCKET_RE}$",
        description="S3 bucket for Terraform state (default: local in the run dir).",
    )
    controller: Literal["auto", "off"] = Field(
        "auto",
        description="auto: `deploy` hands the run to the account's controller when the results bucket "
        "has one (`dlinfra setup --controller`), which heals it, enforces its limits and tears it down "
        "with no laptop watching (deploy follows it as a viewer; --detach exits); off: never (deploy "
        "owns the run; after --detach it waits for `dlinfra watch`).",
    )
    root_volume_gb: int = Field(100, ge=8, le=16384)
    ssm_access: bool = Field(
        False,
        description="Session Manager shells on nodes (its channels only, not the account's SSM parameters); "
        "there is never SSH.",
    )
    tags: dict[str, str] = Field(default_factory=dict, description="Tags on every resource of the run.")
    heal_timeout: float = Field(
        300, gt=0, le=3600, description="Seconds one replacement of a vanished instance may take (3 tries)."
    )
    image: Literal["auto", "baked", "base"] = Field(
        "auto",
        description="auto: the AMI `dlinfra image build --target aws` baked for this dlinfra, else the base "
        "AMI with an install at boot; baked: that AMI or an error; base: always install at boot.",
    )
    pip_index_url: str | None = Field(
        None, description="Package index nodes install from (a private mirror); default: PyPI."
    )
    pip_extra_ca: str | None = Field(
        None, description="PEM certificate nodes trust besides the system's (a mirror's or a proxy's CA)."
    )

    @field_validator("python", mode="before")
    @classmethod
    def _python_as_written(cls, v: Any) -> Any:
        """YAML reads an unquoted 3.10 as the number 3.1: the version the user meant is recoverable
        only as a hint, never silently (3.1 itself is no version dlinfra knows)."""
        if isinstance(v, float | int) and not isinstance(v, bool):
            if repr(v) in PYTHONS:
                return repr(v)  # 3.12 unquoted can mean nothing else
            meant = [p for p in PYTHONS if float(p) == v] or [PYTHONS[-1]]
            raise ValueError(
                f"{v!r} is a number to YAML, which reads 3.10 as 3.1. Fix: quote the version: "
                f"python: '{meant[0]}'"
            )
        return v

    @field_validator("pip_extra_ca")
    @classmethod
    def _pem(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if "PRIVATE KEY" in v:
            raise ValueError("holds a private key: give only the CA's certificate (it lands in user-data)")
        if not re.search(r"-----BEGIN CERTIFICATE-----\n[\s\S]+?\n-----END CERTIFICATE-----", v):
            raise ValueError(
                "must be PEM text with its line breaks: -----BEGIN CERTIFICATE-----, base64 lines, "
                "-----END CERTIFICATE----- (in YAML, a block scalar: `pip_extra_ca: |`)"
            )
        return v.strip() + "\n"

    @field_validator("endpoint_url", "pip_index_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return http_url(v)

    @field_validator("vpc_cidr", "subnet_cidr", "public_subnet_cidr")
    @classmethod
    def _cidr(cls, v: str | None) -> str | None:
        return None if v is None else checked_cidr(v)

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_TAGS:
            raise ValueError(f"{len(v)} tags: EC2 takes 50 and dlinfra adds 4. Fix: at most {MAX_TAGS}")
        for key, value in v.items():
            if not TAG_KEY.fullmatch(key) or key.lower().startswith("aws:") or not TAG_VALUE.fullmatch(value):
                raise ValueError(
                    f"tag {shown(key)}: {shown(value)} is not a tag AWS takes. Fix: keys of 1-128 and "
                    "values of at most 256 letters, digits, spaces and + - = . _ : / @, keys not starting "
                    "with aws:"
                )
        return v

    @model_validator(mode="after")
    def _ranges(self) -> AwsSpec:
        vpc = ipaddress.IPv4Network(self.vpc_cidr)
        if not ipaddress.IPv4Network(self.subnet_cidr).subnet_of(vpc):
            raise ValueError(
                f"aws.subnet_cidr {self.subnet_cidr} is not inside aws.vpc_cidr {self.vpc_cidr}. "
                f"Fix: set aws.subnet_cidr to a range of the VPC, e.g. {_example(vpc)}"
            )
        if self.network()["public_subnet_cidr"] is None and self.egress in ("nat", "auto"):
            raise ValueError(
                f"aws.subnet_cidr {self.subnet_cidr} leaves no room in aws.vpc_cidr {self.vpc_cidr} for "
                "the NAT gateway's public subnet. Fix: use a smaller aws.subnet_cidr, or set aws.egress "
                "to public_ip or none"
            )
        return self

    @property
    def needs_nat(self) -> bool:
        """A NAT gateway, or perhaps one (auto before the run settles it: priced as one)."""
        return self.egress in ("nat", "auto")

    def network(self) -> dict[str, Any]:
        """The ranges as the stacks' `network` input takes them (egress auto, unsettled: nat, as for
        the image builder, which installs from the index)."""
        return {
            "vpc_cidr": self.vpc_cidr,
            "subnet_cidr": self.subnet_cidr,
            "public_subnet_cidr": public_subnet(self.vpc_cidr, self.subnet_cidr, self.public_subnet_cidr),
            "egress": "nat" if self.egress == "auto" else self.egress,
        }

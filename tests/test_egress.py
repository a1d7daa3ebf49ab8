"""aws.egress auto: no NAT gateway exactly when no node needs the internet (targets.aws.egress). The
rule on its own here; tests/infra/test_image_moto.py plans both outcomes against moto with terraform."""

from __future__ import annotations

import pytest

from dlinfra.runs.manifest import ImagePin
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.model import Spec
from dlinfra.targets.aws import egress, review
from support import aws_client

LOCK = "1" * 64
FLAVORS = {"chief": "cpu", "worker": "gpu"}


def _spec(*sets: str) -> Spec:
    return load_spec(None, Overrides(target="aws", sets=list(sets)))


def _baked(lock: str = LOCK) -> ImagePin:
    return ImagePin(id="ami-0123456789abcdef0", digest="d" * 64, dlinfra_version="0.1.0", lock_sha256=lock)


def _settle(spec: Spec, images: dict[str, ImagePin | None], regions: dict[str, str] | None = None):
    asked: list[str] = []

    def locks() -> dict[str, str]:
        asked.append("locks")
        return {"cpu": LOCK, "gpu": LOCK}

    settled = egress.settle(spec, images, FLAVORS, locks, (regions or {}).get)
    return settled, asked


def test_auto_is_none_only_when_every_role_is_baked_with_the_runs_lock_and_its_data_is_here() -> None:
    settled, _ = _settle(_spec(), {"chief": _baked(), "worker": _baked()})
    assert settled.egress == "none"
    assert "no NAT gateway" in settled.line() and "--set aws.egress=nat" in settled.line()


@pytest.mark.parametrize(
    ("sets", "images", "why"),
    [
        ((), {"chief": None, "worker": None}, "chief, worker boot the base AMI and install at boot"),
        ((), {"chief": _baked(), "worker": _baked("2" * 64)}, "the baked image of worker holds another lock"),
        ((), {"chief": _baked(), "worker": _baked(None)}, "the baked image of worker holds another lock"),
        (("aws.ssm_access=true",), {"chief": _baked(), "worker": _baked()}, "aws.ssm_access"),
    ],
)
def test_auto_is_nat_when_a_node_installs_or_needs_the_internet(
    sets: tuple[str, ...], images: dict[str, ImagePin | None], why: str
) -> None:
    settled, _ = _settle(_spec(*sets), images)
    assert settled.egress == "nat" and why in settled.line(), settled.line()


def test_the_locks_are_resolved_only_when_every_role_is_baked() -> None:
    assert _settle(_spec(), {"chief": None, "worker": _baked()})[1] == []
    assert _settle(_spec(), {"chief": _baked(), "worker": _baked()})[1] == ["locks"]


OWN = (  # the built-in model reads them: it needs their eval set, shape and classes (spec.dataset)
    "training.dataset.format=tfrecord",
    "training.dataset.uri=s3://own-data/shards/train-*.tfrecord",
    "training.dataset.eval_uri=s3://own-data/shards/eval-*.tfrecord",
    "training.dataset.shape=[28, 28, 1]",
    "training.dataset.classes=10",
)
CIFAR = ("training.dataset.format=cifar10", "training.dataset.uri=https://example.org/cifar-10-python.tar.gz")


@pytest.mark.parametrize(
    ("sets", "regions", "egress_", "why"),
    [
        (OWN, {"own-data": "us-east-1"}, "none", "its data is in S3 here"),
        (OWN, {"own-data": "eu-west-1"}, "nat", "is in eu-west-1, not us-east-1"),
        (OWN, {}, "nat", "is in a region not known"),
        (
            CIFAR,
            {},
            "nat",
            "training.dataset.uri (https://example.org/cifar-10-python.tar.gz) is read from outside S3",
        ),
    ],
)
def test_data_outside_the_regions_s3_needs_a_nat_gateway(
    sets: tuple[str, ...], regions: dict[str, str], egress_: str, why: str
) -> None:
    settled, _ = _settle(_spec(*sets), {"chief": _baked(), "worker": _baked()}, regions)
    assert settled.egress == egress_ and why in settled.line(), settled.line()


def test_an_unsettled_auto_is_priced_with_the_nat_gateway_and_a_settled_none_without() -> None:
    auto, none = _spec(), _spec("aws.egress=none")
    assert review.NAT_GATEWAY in review.hourly_cost(auto).extras
    assert review.NAT_GATEWAY not in review.hourly_cost(none).extras
    assert auto.aws.network()["egress"] == "nat", "an unsettled auto (the image builder) installs: nat"


def test_a_buckets_region_is_read_even_where_s3_refuses_the_request(moto_endpoint: str) -> None:
    s3 = aws_client(moto_endpoint, "s3")
    s3.create_bucket(Bucket="egress-far", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    region = egress.bucket_region(s3)
    assert region("egress-far") == "eu-west-1"
    assert region("egress-no-such-bucket") is None

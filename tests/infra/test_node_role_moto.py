"""The node role held to its policies: `modules/node_iam` applied by real Terraform to a moto server of
its own, the role assumed, and every S3 call a node makes tried with the role's credentials (moto
checks an assumed role's actions and resources once auth is on; it ignores policy conditions). What a
node needs is allowed, the rest is denied: the run's prefix, the packed data set's objects (the
`read_objects` the aws target derives from `training.dataset.uri`), and nothing else.

Auth is switched on only after the apply (moto's `reset-auth`), so the setup runs as moto's root: the
one action left free is the AssumeRole a node's instance profile does for it on EC2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from infra.conftest import MotoServer, allowed, as_role

from dlinfra.spec.model import Spec
from dlinfra.targets.aws.tfvars import read_objects

pytestmark = [pytest.mark.terraform, pytest.mark.slow]

RESULTS, PREFIX = "dlinfra-results", "runs/r1"
DATA_URI = "s3://team-data/digits/v1"


@pytest.fixture(scope="module")
def node_s3(
    own_moto: MotoServer, infra_dir: Path, tf_cli_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """S3 as a node sees it: the role's temporary credentials, auth on."""

    # The module applied as it is, as the root: the provider it declares finds moto by the
    # environment (AWS_ENDPOINT_URL, AWS_REGION), so no provider block of the test's own.
    module = shutil.copytree(
        infra_dir / "modules" / "node_iam",
        tmp_path_factory.mktemp("node-role") / "node_iam",
        ignore=shutil.ignore_patterns("tests"),
    )
    spec = Spec.model_validate(
        {"name": "x", "target": "aws", "training": {"dataset": {"format": "tfrecord", "uri": DATA_URI}}}
    )
    objects = read_objects(spec)
    assert objects == ["team-data/digits/v1/*"]
    inputs = {"name": "dlinfra-r1-node", "bucket": RESULTS, "prefix": PREFIX, "read_objects": objects}
    (module / "run.tfvars.json").write_text(json.dumps(inputs))
    tf = own_moto.terraform(module, tf_cli_config)
    tf.env["AWS_ENDPOINT_URL"] = own_moto.endpoint_url
    tf.init()
    tf.apply("-var-file=run.tfvars.json")
    arn = tf.output()["role_arn"]

    s3 = own_moto.client("s3")
    for bucket in (RESULTS, "team-data"):
        s3.create_bucket(Bucket=bucket)
    for key in (
        "digits/v1/manifest.json",
        "digits/v1/train-00000-of-00016.tfrecord",
        "digits/v2/manifest.json",
        "secrets/key",
    ):
        s3.put_object(Bucket="team-data", Key=key, Body=b"x")
    s3.put_object(Bucket=RESULTS, Key="runs/r2/metrics.json", Body=b"{}")
    return as_role(own_moto, arn, "worker-0", ("s3",))["s3"]


def test_a_node_reads_the_packed_data_prefix_and_nothing_else_of_that_bucket(
    node_s3: Any, tmp_path: Path
) -> None:
    assert allowed(lambda: node_s3.get_object(Bucket="team-data", Key="digits/v1/manifest.json"))
    # what staging does: a streamed download of each shard, after its HEAD
    shard = "digits/v1/train-00000-of-00016.tfrecord"
    assert allowed(lambda: node_s3.download_file("team-data", shard, str(tmp_path / "shard")))
    assert not allowed(lambda: node_s3.get_object(Bucket="team-data", Key="digits/v2/manifest.json"))
    assert not allowed(lambda: node_s3.get_object(Bucket="team-data", Key="secrets/key"))
    assert not allowed(
        lambda: node_s3.put_object(Bucket="team-data", Key="digits/v1/manifest.json", Body=b"{}")
    )
    assert not allowed(lambda: node_s3.list_buckets())


def test_a_node_writes_its_run_prefix_but_not_the_pins_nor_another_run(node_s3: Any) -> None:
    assert allowed(
        lambda: node_s3.put_object(Bucket=RESULTS, Key=f"{PREFIX}/status/worker-0.json", Body=b"{}")
    )
    assert allowed(lambda: node_s3.get_object(Bucket=RESULTS, Key=f"{PREFIX}/status/worker-0.json"))
    assert allowed(lambda: node_s3.list_objects_v2(Bucket=RESULTS, Prefix=f"{PREFIX}/"))
    for pinned in ("code/bundle.tar.gz", "manifest.json", "terraform/run.tfvars.json"):
        assert not allowed(
            lambda key=pinned: node_s3.put_object(Bucket=RESULTS, Key=f"{PREFIX}/{key}", Body=b"x")
        )
    assert not allowed(lambda: node_s3.get_object(Bucket=RESULTS, Key="runs/r2/metrics.json"))
    assert not allowed(lambda: node_s3.put_object(Bucket=RESULTS, Key="runs/r2/metrics.json", Body=b"{}"))
    assert not allowed(lambda: node_s3.delete_object(Bucket=RESULTS, Key=f"{PREFIX}/status/worker-0.json"))

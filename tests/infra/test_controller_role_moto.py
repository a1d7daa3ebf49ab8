"""The controller role held to its policy: `modules/controller_iam` applied by real Terraform to a moto
server of its own, the role assumed, and the calls a controller makes tried with its credentials.

What moto judges (auth on): every call's action, and S3's resources (bucket and key). It ignores
policy conditions, and judges other services' calls against resource `*`, so the tag conditions and
the IAM resource scoping are checked by the module's `terraform test` (the policy's shape), not here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from infra.conftest import MotoServer, allowed, as_role

pytestmark = [pytest.mark.terraform, pytest.mark.slow]

RESULTS, STATES, OTHER = "dlinfra-results", "team-states", "team-private"


@pytest.fixture(scope="module")
def controller(
    own_moto: MotoServer, infra_dir: Path, tf_cli_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """S3, EC2, IAM and SSM as the controller sees them: the role's credentials, auth on."""
    where = tmp_path_factory.mktemp("controller-role")
    outputs = apply_controller_role(own_moto, infra_dir, tf_cli_config, where, RESULTS, STATES)
    s3 = own_moto.client("s3")
    for bucket in (RESULTS, STATES, OTHER):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=RESULTS, Key="runs/r1/owner.json", Body=b"{}")
    s3.put_object(Bucket=RESULTS, Key="setup/terraform.tfstate", Body=b"{}")
    s3.put_object(Bucket=OTHER, Key="data/secret", Body=b"x")
    ec2 = own_moto.client("ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    itself = [{"ResourceType": "instance", "Tags": [{"Key": "dlinfra:role", "Value": "controller"}]}]
    launched = ec2.run_instances(
        ImageId=ami, MinCount=1, MaxCount=1, InstanceType="t3.micro", TagSpecifications=itself
    )
    clients = as_role(own_moto, outputs["role_arn"], "controller", ("s3", "ec2", "iam", "sts"))
    return clients | {"instance": launched["Instances"][0]["InstanceId"]}


def apply_controller_role(
    moto: MotoServer, infra_dir: Path, tf_cli_config: Path, where: Path, bucket: str, state_bucket: str
) -> dict[str, Any]:
    """modules/controller_iam applied by real Terraform to `moto` (auth still off); its outputs."""
    module = shutil.copytree(
        infra_dir / "modules" / "controller_iam",
        where / "controller_iam",
        ignore=shutil.ignore_patterns("tests"),
    )
    (module / "run.tfvars.json").write_text(json.dumps({"bucket": bucket, "state_bucket": state_bucket}))
    tf = moto.terraform(module, tf_cli_config)
    tf.env["AWS_ENDPOINT_URL"] = moto.endpoint_url
    tf.init()
    tf.apply("-var-file=run.tfvars.json")
    outputs = tf.output()
    assert outputs["instance_profile_name"] == "dlinfra-controller"
    return outputs


def test_the_controller_reaches_every_runs_store_and_state_and_nothing_else_in_s3(
    controller: dict[str, Any],
) -> None:
    s3 = controller["s3"]
    # a run's lease, the way runs.ownership takes it (a conditional write), and its hand-over
    assert allowed(lambda: s3.get_object(Bucket=RESULTS, Key="runs/r1/owner.json"))
    assert allowed(
        lambda: s3.put_object(Bucket=RESULTS, Key="runs/r2/owner.json", Body=b"{}", IfNoneMatch="*")
    )
    assert allowed(lambda: s3.put_object(Bucket=RESULTS, Key="controller/handovers/r2.json", Body=b"{}"))
    assert allowed(lambda: s3.list_objects_v2(Bucket=RESULTS, Prefix="runs/"))
    # the run stack's state and its lock file (use_lockfile), where tfvars.state_backend keys them
    for key in ("dlinfra/r2/terraform.tfstate", "dlinfra/r2/terraform.tfstate.tflock"):
        assert allowed(lambda key=key: s3.put_object(Bucket=STATES, Key=key, Body=b"{}"))
    assert allowed(lambda: s3.delete_object(Bucket=STATES, Key="dlinfra/r2/terraform.tfstate.tflock"))
    # not the bucket's own state, not another bucket, not the bucket itself
    assert not allowed(lambda: s3.get_object(Bucket=RESULTS, Key="setup/terraform.tfstate"))
    assert not allowed(lambda: s3.put_object(Bucket=RESULTS, Key="setup/terraform.tfstate", Body=b"{}"))
    assert not allowed(lambda: s3.get_object(Bucket=OTHER, Key="data/secret"))
    assert not allowed(lambda: s3.list_objects_v2(Bucket=OTHER))
    assert not allowed(lambda: s3.delete_bucket(Bucket=RESULTS))
    assert not allowed(lambda: s3.list_buckets())


def test_the_controller_may_build_and_stop_run_stacks_but_not_make_users_or_keys(
    controller: dict[str, Any],
) -> None:
    ec2, iam = controller["ec2"], controller["iam"]
    tags = [{"ResourceType": "vpc", "Tags": [{"Key": "dlinfra:run-id", "Value": "r2"}]}]
    assert allowed(lambda: ec2.describe_instances())
    assert allowed(lambda: ec2.create_vpc(CidrBlock="10.42.0.0/16", TagSpecifications=tags))
    assert allowed(lambda: ec2.stop_instances(InstanceIds=[controller["instance"]]))  # idle: itself
    # no actions outside the run stacks' own
    assert not allowed(lambda: ec2.create_key_pair(KeyName="k"))
    assert not allowed(lambda: ec2.create_image(InstanceId=controller["instance"], Name="copy-of-it"))
    assert not allowed(lambda: iam.create_user(UserName="someone"))
    assert not allowed(lambda: iam.create_access_key(UserName="someone"))
    assert not allowed(
        lambda: iam.attach_role_policy(
            RoleName="dlinfra-controller", PolicyArn="arn:aws:iam::aws:policy/AdministratorAccess"
        )
    )
    assert not allowed(lambda: iam.list_roles())

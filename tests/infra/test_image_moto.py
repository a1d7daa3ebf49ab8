"""`bake` of a node AMI against a moto server: real terraform on infra/image, real CreateImage.

moto never runs an instance's user data, so a thread stands in for the builder: it reads the
builder's user data back from moto, checks it is cloud-config that fetches this wheel and runs this
recipe, and writes the completion marker the real builder would upload.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra import __version__
from dlinfra.errors import DlinfraError
from dlinfra.images import ImageRecord, Recipe
from dlinfra.runs.wheel import node_wheel
from dlinfra.spec.model import Spec
from dlinfra.targets.aws.builder import LOCK
from dlinfra.targets.aws.images import bake, find_baked
from support import assert_valid_cloud_config, fixed_locks

pytestmark = [pytest.mark.terraform, pytest.mark.slow, pytest.mark.full]  # image bakes

BUCKET = f"dlinfra-results-image-{os.getpid()}"
STORE_PREFIX = "runs"
DIGEST_TAG = "dlinfra:image-digest"
TENSORFLOW = "tensorflow-cpu 2.21.0"
LOCKS = fixed_locks()  # what the recipe installs is not under test here: where it comes from is


@pytest.fixture(scope="module")
def aws_env(moto_server, tf_cli_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """bake runs in this process: its terraform and boto3 see the emulator's fake credentials, an
    offline provider and a private DLINFRA_HOME, for this module only."""
    home = tmp_path_factory.mktemp("image-home")
    with pytest.MonkeyPatch.context() as mp:
        for name in [
            n for n in os.environ if n.startswith(("AWS_", "TF_VAR_", "TF_CLI_ARGS", "TF_DATA_DIR"))
        ]:
            mp.delenv(name)
        for name, value in {
            **moto_server.credentials,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            "TF_CLI_CONFIG_FILE": str(tf_cli_config),
            "CHECKPOINT_DISABLE": "1",
            "DLINFRA_HOME": str(home),
        }.items():
            mp.setenv(name, value)
        moto_server.client("s3").create_bucket(Bucket=BUCKET)
        yield home


@pytest.fixture(scope="module")
def spec(moto_server, aws_env: Path) -> Spec:
    images = moto_server.client("ec2").describe_images(Owners=["amazon"])["Images"]
    ubuntu = [i["ImageId"] for i in images if "ubuntu" in i.get("Name", "").lower()]
    return Spec.model_validate(
        {
            "target": "aws",
            "storage": {"url": f"s3://{BUCKET}/{STORE_PREFIX}"},
            "aws": {"region": moto_server.region, "endpoint_url": moto_server.endpoint_url, "ami": ubuntu[0]},
        }
    )


@pytest.fixture(scope="module")
def wheel() -> Path:
    built = node_wheel()
    assert built is not None, "the tests run from a checkout"
    return built


def _instances(ec2: Any, digest: str) -> list[dict[str, Any]]:
    reservations = ec2.describe_instances(Filters=[{"Name": f"tag:{DIGEST_TAG}", "Values": [digest]}])
    return [i for r in reservations["Reservations"] for i in r["Instances"]]


@dataclass
class StandIn:
    """What the stand-in saw and what went wrong in its thread (asserts there do not fail a test)."""

    builder: str | None = None
    problems: list[BaseException] = field(default_factory=list)


def _builder_standing_in_for_ec2(
    moto_server, recipe: Recipe, tmp: Path, seen: StandIn, stop: threading.Event
):
    ec2, s3 = moto_server.client("ec2"), moto_server.client("s3")
    prefix = f"{STORE_PREFIX}/images/{recipe.digest}"
    try:
        while not stop.is_set():
            running = [
                i for i in _instances(ec2, recipe.digest) if i["State"]["Name"] in ("pending", "running")
            ]
            if running:
                break
            time.sleep(0.5)
        else:
            return
        seen.builder = running[0]["InstanceId"]
        attribute = ec2.describe_instance_attribute(InstanceId=seen.builder, Attribute="userData")
        user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()

        assert user_data.startswith("#cloud-config\n")
        assert_valid_cloud_config(user_data, tmp / "builder-user-data.yaml")

        doc = yaml.safe_load(user_data)
        wheel_path, lock_path = f"/opt/dlinfra-wheel/{recipe.wheel.name}", f"/opt/dlinfra-wheel/{LOCK}"
        rendered = recipe.render(wheel_path, lock_path, "", "aws")
        scripts = [f["path"] for f in doc["write_files"] if f["content"] == rendered]
        assert len(scripts) == 1, (
            "the recipe, rendered for this wheel, lock and the aws builder, is written once"
        )
        commands = [c if isinstance(c, str) else " ".join(c) for c in doc["runcmd"]]
        fetch = commands.index(f"aws s3 cp s3://{BUCKET}/{prefix}/{recipe.wheel.name} /opt/dlinfra-wheel/")
        fetch_lock = commands.index(f"aws s3 cp s3://{BUCKET}/{prefix}/{LOCK} {lock_path}")
        report = next(
            i
            for i, c in enumerate(commands)
            if c.startswith(f"sh {scripts[0]} && aws s3 cp /etc/dlinfra/image.json")
        )
        assert max(fetch, fetch_lock) < report
        assert f"s3://{BUCKET}/{prefix}/image.json" in commands[report]
        assert moto_server.credentials["AWS_SECRET_ACCESS_KEY"] not in user_data

        uploaded = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{recipe.wheel.name}")["Body"].read()
        assert uploaded == recipe.wheel.read_bytes(), "the builder fetches this very wheel"
        lock = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{LOCK}")["Body"].read()
        assert lock == recipe.lock.text.encode(), "and this very lock"

        # What the recipe's last step writes to /etc/dlinfra/image.json, uploaded as the marker.
        record = recipe.record("aws").model_copy(update={"tensorflow": TENSORFLOW})
        marker = json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True)
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/image.json", Body=marker.encode())
    except BaseException as exc:
        seen.problems.append(exc)


@dataclass
class Baked:
    ami: str
    recipe: Recipe
    builder: str
    records: list[ImageRecord]
    lines: list[str]
    seconds: float


@pytest.fixture(scope="module")
def baked(spec: Spec, wheel: Path, moto_server, tmp_path_factory: pytest.TempPathFactory) -> Baked:
    recipe = Recipe("cpu", wheel, LOCKS["cpu"])
    seen, stop = StandIn(), threading.Event()
    stand_in = threading.Thread(
        target=_builder_standing_in_for_ec2,
        args=(moto_server, recipe, tmp_path_factory.mktemp("stand-in"), seen, stop),
        daemon=True,
    )
    stand_in.start()
    records: list[ImageRecord] = []
    lines: list[str] = []
    start = time.monotonic()
    try:
        ami = bake(spec, recipe, lines.append, builder_done=records.append, timeout=180)
    finally:
        stop.set()
        stand_in.join(timeout=30)
        for problem in seen.problems:
            raise problem
    seconds = time.monotonic() - start
    print(f"\n[timing] bake against moto: {seconds:.1f}s")
    assert seen.builder is not None
    return Baked(ami, recipe, seen.builder, records, lines, seconds)


def test_bake_registers_an_ami_tagged_with_what_it_holds(baked: Baked, moto_server):
    image = moto_server.client("ec2").describe_images(ImageIds=[baked.ami])["Images"][0]
    tags = {t["Key"]: t["Value"] for t in image["Tags"]}
    recipe = baked.recipe
    assert tags[DIGEST_TAG] == recipe.digest
    assert tags["dlinfra:version"] == __version__
    assert tags["dlinfra:flavor"] == "cpu"
    assert tags["dlinfra:wheel-sha256"] == recipe.wheel_sha256
    assert tags["dlinfra:lock-sha256"] == recipe.lock.sha256, "aws.egress auto compares it with a run's lock"
    assert image["Name"] == f"dlinfra-{__version__}-cpu-{recipe.digest[:12]}"
    assert image["State"] == "available"
    assert image["SourceInstanceId"] == baked.builder, "the AMI is taken from the builder that ran the recipe"


def test_builder_done_gets_the_record_the_builder_reported(baked: Baked):
    assert [(r.recipe_digest, r.wheel_sha256, r.builder, r.tensorflow) for r in baked.records] == [
        (baked.recipe.digest, baked.recipe.wheel_sha256, "aws", TENSORFLOW)
    ]


def test_only_the_ami_outlives_the_bake(baked: Baked, moto_server, aws_env: Path):
    ec2, iam = moto_server.client("ec2"), moto_server.client("iam")
    digest = baked.recipe.digest
    assert {i["InstanceId"]: i["State"]["Name"] for i in _instances(ec2, digest)} == {
        baked.builder: "terminated"
    }
    tagged = [{"Name": f"tag:{DIGEST_TAG}", "Values": [digest]}]
    assert ec2.describe_vpcs(Filters=tagged)["Vpcs"] == []
    assert ec2.describe_subnets(Filters=tagged)["Subnets"] == []
    assert ec2.describe_security_groups(Filters=tagged)["SecurityGroups"] == []
    assert ec2.describe_internet_gateways(Filters=tagged)["InternetGateways"] == []
    name = f"dlinfra-image-{digest[:16]}-builder"
    assert name not in {r["RoleName"] for r in iam.list_roles()["Roles"]}
    assert name not in {p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"]}
    state = json.loads((aws_env / "images" / "aws" / digest[:16] / "image" / "terraform.tfstate").read_text())
    assert state["resources"] == [], "the AMI left the state before the destroy; nothing else remains"
    assert [i["ImageId"] for i in ec2.describe_images(Owners=["self"], Filters=tagged)["Images"]] == [
        baked.ami
    ]


def test_find_baked_returns_the_newest_ami_of_a_version_and_flavor(baked: Baked, moto_server):
    ec2 = moto_server.client("ec2")
    assert find_baked(ec2, __version__, "cpu") == {
        "id": baked.ami,
        "digest": baked.recipe.digest,
        "wheel_sha256": baked.recipe.wheel_sha256,
        "lock_sha256": baked.recipe.lock.sha256,
        "name": f"dlinfra-{__version__}-cpu-{baked.recipe.digest[:12]}",
    }
    assert find_baked(ec2, "0.0.0-never", "cpu") is None


def test_a_second_bake_returns_the_same_ami_without_a_builder(baked: Baked, spec: Spec, moto_server):
    ec2 = moto_server.client("ec2")
    before = {i["InstanceId"] for i in _instances(ec2, baked.recipe.digest)}
    lines: list[str] = []
    start = time.monotonic()
    assert bake(spec, Recipe("cpu", baked.recipe.wheel, LOCKS["cpu"]), lines.append, timeout=1) == baked.ami
    print(f"\n[timing] second bake (already baked): {time.monotonic() - start:.1f}s")
    assert {i["InstanceId"] for i in _instances(ec2, baked.recipe.digest)} == before
    assert any("already baked" in line for line in lines), lines


def test_a_builder_that_never_finishes_times_out_and_is_destroyed(
    spec: Spec, wheel: Path, moto_server, aws_env: Path
):
    """No stand-in: the marker never comes. (gpu: another digest than the baked cpu image.)"""
    recipe = Recipe("gpu", wheel, LOCKS["gpu"])
    ec2 = moto_server.client("ec2")
    start = time.monotonic()
    with pytest.raises(DlinfraError) as failure:
        bake(spec, recipe, lambda line: None, timeout=3)
    print(f"\n[timing] bake that times out: {time.monotonic() - start:.1f}s")
    builders = _instances(ec2, recipe.digest)
    assert len(builders) == 1 and builders[0]["State"]["Name"] == "terminated"
    message = str(failure.value)
    assert "did not finish the image recipe in 3s" in message
    assert f"aws ec2 get-console-output --instance-id {builders[0]['InstanceId']}" in message
    work = aws_env / "images" / "aws" / recipe.digest[:16]
    assert (work / "builder-console.log").is_file() and str(work / "builder-console.log") in message
    assert json.loads((work / "image" / "terraform.tfstate").read_text())["resources"] == []
    tagged = [{"Name": f"tag:{DIGEST_TAG}", "Values": [recipe.digest]}]
    assert ec2.describe_images(Owners=["self"], Filters=tagged)["Images"] == []
    assert ec2.describe_vpcs(Filters=tagged)["Vpcs"] == []


def test_builder_user_data_trusts_a_private_index_and_its_ca(wheel: Path, tmp_path: Path):
    """The recipe's pip reaches the spec's mirror through the system bundle holding its CA."""
    from dlinfra.targets.aws.builder import builder_user_data

    ca = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
    mirrored = Spec.model_validate(
        {
            "target": "aws",
            "storage": {"url": f"s3://{BUCKET}/{STORE_PREFIX}"},
            "aws": {"pip_index_url": "https://pypi.corp.example/simple", "pip_extra_ca": ca},
        }
    )
    recipe = Recipe("gpu", wheel, LOCKS["gpu"])
    user_data = builder_user_data(mirrored, recipe, timeout=3600)
    assert_valid_cloud_config(user_data, tmp_path / "user-data.yaml")
    doc = yaml.safe_load(user_data)
    options = "--index-url https://pypi.corp.example/simple --cert /etc/ssl/certs/ca-certificates.crt"
    expected = recipe.render(f"/opt/dlinfra-wheel/{wheel.name}", f"/opt/dlinfra-wheel/{LOCK}", options, "aws")
    assert [f["content"] for f in doc["write_files"] if f["content"] == expected]
    assert ca in [f["content"] for f in doc["write_files"]]
    commands = [c if isinstance(c, str) else " ".join(c) for c in doc["runcmd"]]
    assert commands[0] == "shutdown -h +75", "a builder whose CLI died powers itself off"
    assert commands.index("update-ca-certificates") < next(
        i for i, c in enumerate(commands) if c.startswith("sh ")
    )


def test_the_next_plan_boots_every_role_from_the_baked_ami(baked: Baked, spec: Spec, aws_env: Path) -> None:
    """`dlinfra plan` after the bake: aws.image auto picks the AMI for this dlinfra and flavor (CPU
    here: no role trains on GPUs), says so, pins it, and puts it in the stack's inputs."""
    from support import run_cli

    args = ["plan", "--set", "target=aws", "--workers", "1", "--endpoint-url", str(spec.aws.endpoint_url)]
    sets = [f"storage.url={spec.storage.url}", f"aws.ami={spec.aws.ami}", "cluster.workers.gpus=0"]
    result = run_cli(*args, *[a for s in sets for a in ("--set", s)], env=dict(os.environ), cwd=aws_env)
    assert result.returncode == 0, result.stdout + result.stderr
    for role in ("chief", "ps", "worker"):
        assert f"{role}: {baked.ami} (baked, dlinfra {__version__}, recipe {baked.recipe.digest[:12]})" in (
            result.stdout
        )
    run_dir = sorted((aws_env / "runs").iterdir())[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert {role: pin["id"] for role, pin in manifest["images"].items()} == dict.fromkeys(
        ("chief", "ps", "worker"), baked.ami
    )
    inputs = json.loads((run_dir / "tfvars.json").read_text())
    assert {role: group["ami_id"] for role, group in inputs["roles"].items()} == manifest_ids(manifest)
    # the AMI holds the suite's fixed lock, not the one this plan resolved: nodes install the
    # difference at boot, so aws.egress auto keeps the NAT gateway
    why = "aws.egress auto → nat: the baked image of chief, ps, worker holds another lock than this run's"
    assert why in result.stderr and inputs["network"]["egress"] == "nat"


def test_egress_auto_plans_no_nat_gateway_when_the_baked_amis_hold_the_runs_lock(
    baked: Baked, spec: Spec, moto_server, aws_env: Path
) -> None:
    """The AMI the plan above picked, registered again with the lock that plan resolved (a stand-in
    for a bake of this run's environment, in a region of its own: no other plan here sees it)."""
    from support import run_cli

    earlier = json.loads((sorted((aws_env / "runs").iterdir())[-1] / "manifest.json").read_text())
    region = "eu-north-1"
    ec2 = moto_server.client("ec2", region)
    instance = ec2.run_instances(ImageId=spec.aws.ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ami = ec2.create_image(InstanceId=instance, Name="dlinfra-egress-stand-in")["ImageId"]
    tags = {
        "dlinfra:version": __version__,
        "dlinfra:flavor": "cpu",
        DIGEST_TAG: baked.recipe.digest,
        "dlinfra:lock-sha256": earlier["environment"]["cpu"]["sha256"],
    }
    ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    bucket = f"{BUCKET}-{region}"
    moto_server.client("s3", region).create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region}
    )
    args = ["plan", "--set", "target=aws", "--workers", "1", "--endpoint-url", str(spec.aws.endpoint_url)]
    sets = [f"storage.url=s3://{bucket}/runs", f"aws.ami={spec.aws.ami}", "cluster.workers.gpus=0"]
    sets.append(f"aws.region={region}")
    result = run_cli(*args, *[a for s in sets for a in ("--set", s)], env=dict(os.environ), cwd=aws_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "aws.egress auto → none: every node boots a baked image holding this run's lock" in result.stderr
    run_dir = sorted((aws_env / "runs").iterdir())[-1]
    assert json.loads((run_dir / "tfvars.json").read_text())["network"]["egress"] == "none"
    planned = (run_dir / "plan.md").read_text()
    assert "aws_nat_gateway" not in planned and "NAT gateway" not in planned.split("If the run ends")[0]
    assert "what stays up (the VPC, its subnets and security group) costs nothing" in planned


def manifest_ids(manifest: dict[str, Any]) -> dict[str, str]:
    return {role: pin["id"] for role, pin in manifest["images"].items()}

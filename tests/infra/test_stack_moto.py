"""Real `terraform apply`/`destroy` of bucket/ and stack/ against a moto server, checked with boto3.

moto 5.2 gaps handled here (see the stack README): no CreatePlacementGroup (the test runs with
placement_group = false; the mocked `terraform test` covers placement groups).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.terraform, pytest.mark.slow]

RUN_ID = f"itest-{secrets.token_hex(3)}"
BUCKET = f"dlinfra-results-{RUN_ID}"
PREFIX = f"runs/{RUN_ID}"
SUBNET_CIDR = "10.42.1.0/24"
SENTINEL_KEY = f"{PREFIX}/results/metrics.json"

# node -> (role, private IP): 1 chief + 3 workers + 1 ps, addresses from cidrhost(subnet, n).
NODES = {
    "chief-0": ("chief", "10.42.1.10"),
    "worker-0": ("worker", "10.42.1.20"),
    "worker-1": ("worker", "10.42.1.21"),
    "worker-2": ("worker", "10.42.1.22"),
    "ps-0": ("ps", "10.42.1.30"),
}


def cloud_config(node: str) -> str:
    """User data shaped like the renderer's: node.json written, agent started. Non-ASCII on purpose."""
    role, ip = NODES[node]
    index = int(node.rsplit("-", 1)[1])
    cluster = {r: [f"{a}:2222" for n, (rr, a) in NODES.items() if rr == r] for r in ("chief", "worker", "ps")}
    node_json = json.dumps(
        {
            "run_id": RUN_ID,
            "role": role,
            "index": index,
            "cluster": cluster,
            "store": f"s3://{BUCKET}/{PREFIX}",
            "training": {"model": "digits-mlp", "epochs": 3, "note": "café, ünïcode survives"},
        },
        indent=2,
    )
    indented = "\n".join("      " + line for line in node_json.splitlines())
    return (
        "#cloud-config\n"
        f"# dlinfra node {node} of run {RUN_ID} ({ip})\n"
        "package_update: true\n"
        "packages:\n"
        "  - python3-pip\n"
        "write_files:\n"
        "  - path: /etc/dlinfra/node.json\n"
        "    owner: root:root\n"
        "    permissions: '0600'\n"
        "    content: |\n"
        f"{indented}\n"
        "runcmd:\n"
        "  - [python3, -m, pip, install, --quiet, 'dlinfra[train,aws]']\n"
        "  - [dlinfra, node, run, /etc/dlinfra/node.json]\n"
    )


@dataclass
class Deployment:
    tf: Any
    tfvars: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)
    destroyed: bool = False


def _seconds(start: float) -> str:
    return f"{time.monotonic() - start:.1f}s"


@pytest.fixture(scope="module")
def infra(tmp_path_factory: pytest.TempPathFactory, make_infra_copy) -> Path:
    return make_infra_copy(tmp_path_factory.mktemp("moto") / "infra")


@pytest.fixture(scope="module")
def results_bucket(infra: Path, moto_server, tf_cli_config: Path) -> str:
    """The long-lived bucket, created through bucket/ exactly as `dlinfra setup` would."""
    tf = moto_server.terraform(infra / "bucket", tf_cli_config)
    tf.init()
    (infra / "bucket" / "setup.tfvars.json").write_text(
        json.dumps({"region": moto_server.region, "endpoint_url": moto_server.endpoint_url, "bucket": BUCKET})
    )
    start = time.monotonic()
    tf.apply("-var-file=setup.tfvars.json")
    print(f"\n[timing] bucket/ apply against moto: {_seconds(start)}")
    assert tf.output()["bucket"] == BUCKET
    # A result that must outlive the run's stack.
    moto_server.client("s3").put_object(Bucket=BUCKET, Key=SENTINEL_KEY, Body=b'{"accuracy": 0.97}')
    return BUCKET


@pytest.fixture(scope="module")
def ami_id(moto_server) -> str:
    images = moto_server.client("ec2").describe_images(Owners=["amazon"])["Images"]
    ubuntu = [
        i for i in images if i.get("Architecture") == "x86_64" and "ubuntu" in i.get("Name", "").lower()
    ]
    return (ubuntu or images)[0]["ImageId"]


@pytest.fixture(scope="module")
def deployment(infra: Path, moto_server, tf_cli_config: Path, results_bucket: str, ami_id: str):
    tfvars = {
        "run_id": RUN_ID,
        "region": moto_server.region,
        "endpoint_url": moto_server.endpoint_url,
        "ami_id": ami_id,
        "network": {"subnet_cidr": SUBNET_CIDR, "egress": "nat"},
        "bucket": results_bucket,
        "prefix": PREFIX,
        "roles": {
            "chief": {"instance_type": "m5.xlarge", "spot": False, "root_volume_gb": 100},
            "worker": {"instance_type": "g4dn.xlarge", "spot": True, "root_volume_gb": 120},
            "ps": {"instance_type": "m5.xlarge", "spot": False, "root_volume_gb": 100},
        },
        "ssm_access": True,
        "tags": {"team": "ml-infra"},
    }
    for role in tfvars["roles"].values():
        role["placement_group"] = False  # moto 5.2 has no CreatePlacementGroup
        role["nodes"] = {}
    for node, (role, ip) in NODES.items():
        tfvars["roles"][role]["nodes"][node] = {"private_ip": ip, "user_data": cloud_config(node)}
    (infra / "stack" / "run.tfvars.json").write_text(json.dumps(tfvars, ensure_ascii=False), encoding="utf-8")

    tf = moto_server.terraform(infra / "stack", tf_cli_config)
    tf.init()
    start = time.monotonic()
    tf.apply("-var-file=run.tfvars.json")
    print(f"\n[timing] stack/ apply against moto (5 nodes): {_seconds(start)}")
    dep = Deployment(tf=tf, tfvars=tfvars, outputs=tf.output())
    yield dep
    if not dep.destroyed:
        tf.destroy("-var-file=run.tfvars.json")


@pytest.fixture(scope="module")
def instances(deployment: Deployment, moto_server) -> dict[str, dict[str, Any]]:
    """Run's instances (not terminated) keyed by their Name-derived node name."""
    ec2 = moto_server.client("ec2")
    found = {}
    for reservation in ec2.describe_instances(Filters=[{"Name": "tag:dlinfra:run-id", "Values": [RUN_ID]}])[
        "Reservations"
    ]:
        for instance in reservation["Instances"]:
            if instance["State"]["Name"] == "terminated":
                continue
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            found[tags["Name"].removeprefix(f"dlinfra-{RUN_ID}-")] = {**instance, "TagMap": tags}
    return found


def test_every_node_runs_at_its_planned_private_ip(instances, deployment: Deployment):
    assert {n: (i["State"]["Name"], i["PrivateIpAddress"]) for n, i in instances.items()} == {
        n: ("running", ip) for n, (_, ip) in NODES.items()
    }
    outputs = deployment.outputs["instances"]
    assert {n: (o["role"], o["private_ip"]) for n, o in outputs.items()} == NODES
    assert {n: o["id"] for n, o in outputs.items()} == {n: i["InstanceId"] for n, i in instances.items()}
    subnet = deployment.outputs["subnet_id"]
    assert {i["SubnetId"] for i in instances.values()} == {subnet}


def test_nodes_carry_run_role_index_and_default_tags(instances):
    for node, instance in instances.items():
        role, _ = NODES[node]
        tags = instance["TagMap"]
        assert tags["dlinfra:run-id"] == RUN_ID
        assert tags["dlinfra:role"] == role
        assert tags["dlinfra:index"] == node.rsplit("-", 1)[1]
        assert tags["team"] == "ml-infra"


def test_each_node_receives_its_user_data_byte_for_byte(instances, moto_server):
    ec2 = moto_server.client("ec2")
    for node, instance in instances.items():
        attribute = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        received = base64.b64decode(attribute["UserData"]["Value"])
        assert received == cloud_config(node).encode("utf-8"), node


def test_nodes_require_imdsv2_boot_encrypted_gp3_and_terminate_on_shutdown(instances, moto_server):
    ec2 = moto_server.client("ec2")
    for node, instance in instances.items():
        assert instance["MetadataOptions"]["HttpTokens"] == "required", node
        assert instance["MetadataOptions"]["HttpPutResponseHopLimit"] == 1, node
        volume_id = instance["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
        volume = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
        assert (volume["Encrypted"], volume["VolumeType"]) == (True, "gp3"), node
        assert volume["Size"] == (120 if node.startswith("worker") else 100), node
        behaviour = ec2.describe_instance_attribute(
            InstanceId=instance["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )["InstanceInitiatedShutdownBehavior"]["Value"]
        assert behaviour == "terminate", node
        assert instance["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/dlinfra-{RUN_ID}-node"), node


def test_only_workers_are_spot(instances):
    assert {n: i.get("InstanceLifecycle") == "spot" for n, i in instances.items()} == {
        n: n.startswith("worker") for n in NODES
    }


def test_security_group_admits_only_tf_grpc_from_itself(deployment: Deployment, instances, moto_server):
    group_id = deployment.outputs["security_group_id"]
    group = moto_server.client("ec2").describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    ingress = group["IpPermissions"]
    assert [(p["IpProtocol"], p["FromPort"], p["ToPort"]) for p in ingress] == [("tcp", 2222, 2223)]
    rule = ingress[0]
    assert [pair["GroupId"] for pair in rule["UserIdGroupPairs"]] == [group_id]
    assert rule.get("IpRanges", []) == [] and rule.get("Ipv6Ranges", []) == []
    assert not any(p.get("FromPort", 0) <= 22 <= p.get("ToPort", -1) for p in ingress), "SSH must stay closed"
    # The primary network interface holds the groups (moto leaves the instance-level list empty
    # when the provider launches through a NetworkInterfaces spec).
    primary = [
        next(n for n in i["NetworkInterfaces"] if n["Attachment"]["DeviceIndex"] == 0)
        for i in instances.values()
    ]
    assert {tuple(g["GroupId"] for g in eni["Groups"]) for eni in primary} == {(group_id,)}


def test_node_role_reaches_only_the_run_prefix(deployment: Deployment, moto_server):
    iam = moto_server.client("iam")
    role = f"dlinfra-{RUN_ID}-node"
    names = iam.list_role_policies(RoleName=role)["PolicyNames"]
    assert sorted(names) == ["run-prefix", "session-manager"]  # the tfvars ask for ssm_access

    def statements(policy: str) -> list[dict]:
        document = iam.get_role_policy(RoleName=role, PolicyName=policy)["PolicyDocument"]
        return (json.loads(document) if isinstance(document, str) else document)["Statement"]

    run_prefix = statements("run-prefix")
    allowed = [s for s in run_prefix if s["Effect"] == "Allow" and s["Resource"] != f"arn:aws:s3:::{BUCKET}"]
    listing = [s for s in run_prefix if s["Resource"] == f"arn:aws:s3:::{BUCKET}"]
    [denied] = [s for s in run_prefix if s["Effect"] == "Deny"]
    assert [s["Resource"] for s in allowed] == [f"arn:aws:s3:::{BUCKET}/{PREFIX}/*"]
    assert "s3:DeleteObject" not in json.dumps(run_prefix)
    assert sorted(denied["Resource"]) == [
        f"arn:aws:s3:::{BUCKET}/{PREFIX}/{pinned}" for pinned in ("code/*", "manifest.json", "terraform/*")
    ]
    assert [s["Action"] for s in listing] == ["s3:ListBucket"]
    assert listing[0]["Condition"] == {"StringLike": {"s3:prefix": [f"{PREFIX}/*"]}}
    session = statements("session-manager")
    actions = sorted(
        a for s in session for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    )
    assert actions == sorted(
        ["ssm:UpdateInstanceInformation"]
        + [f"ssmmessages:{verb}{kind}Channel" for verb in ("Create", "Open") for kind in ("Control", "Data")]
    )
    assert "*" not in json.dumps([s["Action"] for s in run_prefix + session])
    assert iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"] == []
    assert deployment.outputs["instance_profile"] == role


def test_the_s3_endpoint_lets_through_the_results_bucket_alone(deployment: Deployment, moto_server):
    ec2 = moto_server.client("ec2")
    vpc = deployment.outputs["vpc_id"]
    [endpoint] = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["VpcEndpoints"]
    policy = json.loads(endpoint["PolicyDocument"])
    assert [r for s in policy["Statement"] for r in s["Resource"]] == [
        f"arn:aws:s3:::{BUCKET}",
        f"arn:aws:s3:::{BUCKET}/*",
    ]


def test_outputs_carry_no_user_data_and_no_credentials(deployment: Deployment):
    raw = deployment.tf.run("output", "-json", "-no-color").stdout
    assert "cloud-config" not in raw and "node.json" not in raw and "user_data" not in raw
    assert "testing" not in raw  # the fake credential value
    assert set(deployment.outputs) == {
        "instances",
        "vpc_id",
        "subnet_id",
        "security_group_id",
        "bucket",
        "prefix",
        "instance_profile",
        "ami_id",
    }
    assert (deployment.outputs["bucket"], deployment.outputs["prefix"]) == (BUCKET, PREFIX)


def test_destroy_removes_the_run_and_keeps_the_bucket(deployment: Deployment, instances, moto_server):
    """Last on purpose: every other test reads the applied stack."""
    vpc_id = deployment.outputs["vpc_id"]
    group_id = deployment.outputs["security_group_id"]
    instance_ids = [i["InstanceId"] for i in instances.values()]

    start = time.monotonic()
    deployment.tf.destroy("-var-file=run.tfvars.json")
    deployment.destroyed = True
    print(f"\n[timing] stack/ destroy against moto: {_seconds(start)}")

    ec2 = moto_server.client("ec2")
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in ec2.describe_instances(InstanceIds=instance_ids)["Reservations"]
        for i in r["Instances"]
    }
    assert set(states.values()) == {"terminated"}, states
    assert vpc_id not in {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]}
    assert group_id not in {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}
    iam = moto_server.client("iam")
    assert not [r for r in iam.list_roles()["Roles"] if RUN_ID in r["RoleName"]]
    assert not [
        p for p in iam.list_instance_profiles()["InstanceProfiles"] if RUN_ID in p["InstanceProfileName"]
    ]

    s3 = moto_server.client("s3")
    s3.head_bucket(Bucket=BUCKET)
    assert s3.get_object(Bucket=BUCKET, Key=SENTINEL_KEY)["Body"].read() == b'{"accuracy": 0.97}'

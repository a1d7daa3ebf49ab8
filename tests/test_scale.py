"""Any cluster size the subnet holds: user-data that stays the same size as the cluster grows, the
node's own expansion of the address rule, EC2's 16 KB limit checked before anything exists, and
network ranges and dataset paths that are settled when the spec is read."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from pathlib import Path

import pytest

from dlinfra.contract import tf_config
from dlinfra.deploy import preview
from dlinfra.errors import SpecError
from dlinfra.prepare import NodeInstall, prepare
from dlinfra.render import node_config_from_user_data
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.targets import target_for
from dlinfra.targets.aws import tfvars
from support import Cli, fixed_locks, prepare_aws_review

EC2_USER_DATA_LIMIT = 16384


def _aws(*sets: str, workers: int = 3):
    return load_spec(None, Overrides(target="aws", workers=workers, sets=list(sets)))


def _expected_cluster(subnet: str, workers: int, ps: int = 1, port: int = 2222) -> dict[str, list[str]]:
    """The address rule written out the long way: chief .10, ps .16 on, workers .128 on."""
    base = ipaddress.IPv4Network(subnet).network_address
    return {
        "chief": [f"{base + 10}:{port}"],
        "worker": [f"{base + 128 + i}:{port}" for i in range(workers)],
        "ps": [f"{base + 16 + i}:{port}" for i in range(ps)],
    }


def test_user_data_of_1000_workers_stays_the_size_of_3_and_expands_to_the_whole_cluster() -> None:
    target = target_for("aws")
    _, small = preview(_aws(), target)
    configs, big = preview(_aws("aws.subnet_cidr=10.42.16.0/20", workers=1000), target)
    assert len(big) == 1002
    sizes = {name: len(text.encode()) for name, text in big.items()}
    assert max(sizes.values()) <= EC2_USER_DATA_LIMIT
    # the same size as a 3-worker cluster's, but for the digits of the node's index and the subnet
    assert max(sizes.values()) - max(len(t.encode()) for t in small.values()) < 64
    expected = _expected_cluster("10.42.16.0/20", 1000)
    for name in ("chief-0", "ps-0", "worker-0", "worker-999"):
        node = node_config_from_user_data(big[name])  # what cloud-init writes, read as the node reads it
        role, index = name.rsplit("-", 1)
        assert tf_config(node.peers, node.role, node.index) == {
            "cluster": expected,
            "task": {"type": role, "index": int(index)},
        }
        assert node.address == expected[role][int(index)] and node.num_workers == 1000
    assert configs["worker-999"].peers == expected


def test_a_cluster_the_subnet_cannot_hold_exits_2_naming_the_size_that_fits(cli: Cli) -> None:
    result = cli("render", "--target", "aws", "--workers", "4000", "--set", "aws.subnet_cidr=10.42.16.0/20")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "aws.subnet_cidr: 10.42.16.0/20 has room for 3967 worker nodes" in result.stderr
    assert "use a /19 or larger aws.subnet_cidr (a /19 holds 8063 workers)" in result.stderr
    fits = cli("validate", "--target", "aws", "--workers", "4000", "--set", "aws.subnet_cidr=10.42.0.0/19",
               "--set", "aws.public_subnet_cidr=10.42.32.0/24")  # fmt: skip
    assert fits.returncode == 0, fits.stderr
    assert "worker 4000" in fits.stdout


def _pem(lines: int) -> str:
    body = "\n".join("A" * 64 for _ in range(lines))
    return f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n"


def test_user_data_over_ec2s_limit_is_refused_at_validate_naming_the_field(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "big-ca.yaml"
    spec.write_text(json.dumps({"target": "aws", "aws": {"pip_extra_ca": _pem(300)}}))
    result = cli("validate", str(spec))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "aws.pip_extra_ca: the user-data of node" in result.stderr
    assert "at most 16,384 (EC2's user-data limit)" in result.stderr
    assert "Fix: give only the CA certificate the mirror needs" in result.stderr
    assert cli("validate", "--target", "local", str(spec)).returncode == 0, "local nodes have no such limit"


def test_an_oversized_user_data_leaves_no_run_behind(home: Path) -> None:
    spec = _aws(f"aws.pip_extra_ca={json.dumps(_pem(300))}")
    with pytest.raises(SpecError, match=r"aws\.pip_extra_ca"):
        prepare_aws_review(spec, user_data_limit=target_for("aws").user_data_limit)
    assert not list((home / "runs").iterdir())


@pytest.mark.parametrize(
    ("sets", "public"),
    [
        ((), "10.42.0.0/24"),
        (("aws.vpc_cidr=172.20.0.0/16", "aws.subnet_cidr=172.20.1.0/24"), "172.20.0.0/24"),
        (("aws.subnet_cidr=10.42.0.0/24",), "10.42.1.0/24"),
        (("aws.subnet_cidr=10.42.0.0/17",), "10.42.128.0/24"),
        (("aws.vpc_cidr=10.9.0.0/24", "aws.subnet_cidr=10.9.0.0/25"), "10.9.0.128/25"),
        (("aws.public_subnet_cidr=10.42.200.0/28",), "10.42.200.0/28"),
    ],
)
def test_the_nat_subnet_is_derived_inside_the_vpc_and_clear_of_the_cluster_subnet(sets, public) -> None:
    network = _aws(*sets).aws.network()
    assert network["public_subnet_cidr"] == public
    vpc, subnet = (ipaddress.IPv4Network(network[k]) for k in ("vpc_cidr", "subnet_cidr"))
    assert ipaddress.IPv4Network(public).subnet_of(vpc) and not ipaddress.IPv4Network(public).overlaps(subnet)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("aws.vpc_cidr=172.20.0.0/16",), "aws.subnet_cidr 10.42.1.0/24 is not inside aws.vpc_cidr"),
        (("aws.subnet_cidr=10.42.0.0/16",), "leaves no room in aws.vpc_cidr 10.42.0.0/16 for the NAT"),
        (("aws.public_subnet_cidr=10.42.1.128/25",), "overlaps aws.subnet_cidr (10.42.1.0/24). Fix: set it"),
        (("aws.public_subnet_cidr=10.43.0.0/24",), "is not inside aws.vpc_cidr (10.42.0.0/16)"),
        (("aws.vpc_cidr=10.0.0.0/8", "aws.subnet_cidr=10.0.1.0/24"), "must be /16 to /28"),
        (("aws.subnet_cidr=10.42.1.0/29",), "must be /16 to /28"),
    ],
)
def test_network_ranges_terraform_would_refuse_exit_2_at_validate(cli: Cli, sets, message) -> None:
    result = cli("validate", "--target", "aws", *(a for s in sets for a in ("--set", s)))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr and "Fix:" in result.stderr


def test_a_vpc_of_its_own_needs_no_nat_room_without_nat() -> None:
    spec = _aws("aws.subnet_cidr=10.42.0.0/16", "aws.egress=public_ip")
    assert spec.aws.network()["public_subnet_cidr"] is None


def test_the_stack_gets_the_derived_nat_subnet(home: Path) -> None:
    spec = _aws(
        "aws.vpc_cidr=172.20.0.0/16", "aws.subnet_cidr=172.20.0.0/24", "storage.url=s3://results-b/runs"
    )
    prepared = prepare_aws_review(spec)
    network = tfvars.stack_tfvars(prepared)["network"]
    assert network == {
        "vpc_cidr": "172.20.0.0/16",
        "subnet_cidr": "172.20.0.0/24",
        "public_subnet_cidr": "172.20.1.0/24",
        "egress": "nat",
    }
    assert prepared.configs["chief-0"].address == "172.20.0.10:2222"


def test_a_relative_dataset_is_pinned_from_the_spec_directory_not_the_working_directory(
    cli: Cli, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same relative path names different files from the spec's directory and from the working
    directory: the run pins, and its nodes read, the one beside the spec."""
    spec_dir, elsewhere = tmp_path / "experiment", tmp_path / "elsewhere"
    for directory, content in ((spec_dir, b"beside the spec"), (elsewhere, b"in the working dir")):
        (directory / "data").mkdir(parents=True)
        (directory / "data" / "train.bin").write_bytes(content)
    spec = spec_dir / "exp.yaml"
    dataset = {"format": "cifar10", "uri": "file://data/train.bin"}
    spec.write_text(json.dumps({"name": "rel", "training": {"dataset": dataset}}))
    result = cli("render", str(spec), "--out", str(tmp_path / "out"), cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    node = json.loads((tmp_path / "out" / "worker-0.json").read_text())
    assert node["training"]["dataset"]["uri"] == f"file://{spec_dir / 'data' / 'train.bin'}"

    loaded = load_spec(spec, Overrides())
    monkeypatch.chdir(elsewhere)
    prepared = prepare(
        loaded, target_for("local").addresses(loaded), NodeInstall(), spec, locks=fixed_locks(), typed=False
    )
    pin = prepared.run.manifest().dataset
    assert pin["uri"] == f"file://{spec_dir / 'data' / 'train.bin'}"
    assert pin["sha256"] == hashlib.sha256(b"beside the spec").hexdigest() and pin["pinned"]
    assert prepared.configs["worker-0"].training.dataset.uri == pin["uri"]
    assert "file://" + str(spec_dir / "data" / "train.bin") in prepared.run.spec().to_yaml()


def test_a_relative_dataset_missing_beside_the_spec_exits_2_and_creates_no_run(
    cli: Cli, tmp_path: Path, home: Path
) -> None:
    spec = tmp_path / "exp.yaml"
    spec.write_text(json.dumps({"training": {"dataset": {"format": "cifar10", "uri": "file://nope.tgz"}}}))
    result = cli("deploy", str(spec), "--workers", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "training.dataset.uri: file://nope.tgz is relative to the experiment file's" in result.stderr
    assert f"{tmp_path / 'nope.tgz'} is not a file" in result.stderr
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())

"""The instance catalog and what a spec's nodes train on: GPUs per type, per-node TensorFlow builds,
each node's slice of its machine's GPUs, and the plan's hardware and prices."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from dlinfra.node.devices import cuda_visible_devices
from dlinfra.spec.catalog import catalog
from dlinfra.spec.hardware import cluster_hardware, host_gpu_problems, machine_gpus, problems, warnings
from dlinfra.spec.model import Spec
from dlinfra.targets.aws.review import hourly_cost, summarize
from support import FAKE_CREDS, Cli, assert_valid_cloud_config, node_configs

FAMILIES = ("t3", "m5", "m6i", "m7i", "c5", "c6i", "c7i", "r5", "r6i", "g4dn", "g5", "g6", "p3", "p4d", "p5")


def _aws(**fields: object) -> Spec:
    return Spec.model_validate({"target": "aws", **fields})


# ---------------------------------------------------------------- the catalog


def test_catalog_covers_the_families_people_train_on_with_dated_sourced_prices() -> None:
    table = catalog()
    assert re.fullmatch(r"20\d\d-\d\d", table.prices_as_of)
    assert table.price_source.startswith("AWS EC2 On-Demand pricing") and "https://" in table.price_source
    assert {k.family for k in table.types} >= set(FAMILIES)
    for kind in table.types:
        assert kind.vcpus > 0 and kind.memory_gib > 0, kind
        assert 0 < kind.network_baseline_gbps <= kind.network_gbps, kind
        assert kind.usd_per_hour.get("us-east-1", 0) > 0, f"{kind.name} has no us-east-1 price"
        assert set(kind.usd_per_hour) <= set(table.regions)
        if kind.gpus:
            assert kind.gpu_model and kind.gpu_memory_gib, kind
        else:
            assert kind.gpu_model is None and kind.gpu_memory_gib is None, kind
    assert set(table.nat_gateway_usd_per_hour) == set(table.regions)


def test_catalog_knows_the_gpus_of_the_common_training_types() -> None:
    expected = {
        "g4dn.xlarge": (1, "T4"),
        "g4dn.12xlarge": (4, "T4"),
        "g5.48xlarge": (8, "A10G"),
        "g6.xlarge": (1, "L4"),
        "p3.16xlarge": (8, "V100"),
        "p4d.24xlarge": (8, "A100"),
        "p5.48xlarge": (8, "H100"),
        "m5.xlarge": (0, None),
    }
    for name, (gpus, model) in expected.items():
        kind = catalog().get(name)
        assert kind is not None, name
        assert kind.gpus == gpus and (model is None or model in (kind.gpu_model or "")), kind


def test_instances_command_lists_the_catalog(cli: Cli) -> None:
    full = json.loads(cli("instances", "--json").stdout)
    assert [t["type"] for t in full["types"]] == [k.type for k in catalog().types]
    assert full["prices_as_of"] == catalog().prices_as_of
    gpu = json.loads(cli("instances", "--gpu", "--json").stdout)
    assert gpu["types"] and all(t["gpus"] > 0 for t in gpu["types"])
    assert len(gpu["types"]) == sum(1 for k in catalog().types if k.gpus)
    text = cli("instances", "--gpu").stdout
    assert "g4dn.xlarge" in text and "m5.xlarge" not in text and "0.5260" in text
    bad = cli("instances", "--region", "eu-north-9")
    assert bad.returncode == 2 and "--region" in bad.stderr and "Traceback" not in bad.stderr


def test_prices_come_from_the_catalog_per_region() -> None:
    west = hourly_cost(_aws(aws={"region": "us-west-2"}))
    assert west.total == pytest.approx(0.192 + 2 * 0.526 + 0.192 + 0.045)
    elsewhere = hourly_cost(_aws(aws={"region": "eu-west-1"}))
    assert elsewhere.total is None, "a region the catalog does not price is never guessed"
    assert "g4dn.xlarge in eu-west-1" in elsewhere.unpriced


# ---------------------------------------------------------------- GPUs per role


def test_auto_means_the_types_gpus_on_aws_and_none_locally() -> None:
    assert cluster_hardware(_aws(), typed=True)["worker"].gpus == 1
    assert cluster_hardware(Spec(), typed=False)["worker"].gpus == 0
    big = _aws(strategy="multi_worker_mirrored", cluster={"workers": {"instance_type": "g5.12xlarge"}})
    assert cluster_hardware(big, typed=True)["worker"].gpus == 4
    roles = cluster_hardware(_aws(), typed=True)
    assert roles["chief"].gpus == roles["ps"].gpus == 0, "only workers train"


def test_a_multi_gpu_mirrored_spec_is_valid_and_a_ps_one_is_refused() -> None:
    mirrored = _aws(strategy="multi_worker_mirrored", cluster={"workers": {"instance_type": "p3.8xlarge"}})
    assert problems(mirrored, typed=True) == []
    ps = _aws(cluster={"workers": {"instance_type": "p3.8xlarge"}})
    [problem] = problems(ps, typed=True)
    assert problem.loc == ("cluster", "workers", "gpus") and "multi_worker_mirrored" in problem.fix


def test_warnings_name_paid_idle_gpus_and_unknown_types() -> None:
    idle = warnings(_aws(cluster={"workers": {"gpus": 0}, "chief": {"instance_type": "g5.xlarge"}}), True)
    assert any("cluster.chief.instance_type: g5.xlarge" in w for w in idle)
    assert any("cluster.workers.gpus: 0 of g4dn.xlarge's 1 GPUs" in w for w in idle)
    unknown = warnings(_aws(cluster={"ps": {"instance_type": "x9.huge"}}), True)
    assert any("x9.huge is not in dlinfra's instance catalog" in w for w in unknown)
    assert warnings(Spec(), typed=False) == [], "local runs ignore instance types"


def test_validate_prints_each_roles_hardware_and_warnings(cli: Cli) -> None:
    result = cli("validate", "--target", "aws", "--set", "cluster.workers.gpus=0")
    assert result.returncode == 0, result.stderr
    assert "worker    2 x g4dn.xlarge: 4 vCPU, 1 x NVIDIA T4 16 GiB; trains on CPU" in result.stdout
    assert "warning: cluster.workers.gpus: 0 of g4dn.xlarge's 1 GPUs are used" in result.stderr


def test_nodes_sharing_a_machine_take_consecutive_gpus_and_cpu_nodes_see_none() -> None:
    local = Spec.model_validate(
        {"cluster": {"workers": {"count": 3, "gpus": 2, "instance_type": "g5.12xlarge"}}}
    )
    configs = node_configs(local, "r", "file:///tmp/s/r")
    assert [(configs[f"worker-{i}"].gpus, configs[f"worker-{i}"].gpu_offset) for i in range(3)] == [
        (2, 0),
        (2, 2),
        (2, 4),
    ]
    assert configs["chief-0"].gpus == configs["ps-0"].gpus == 0
    assert configs["worker-0"].instance_type is None, "a local node runs on this machine, not a type"
    cloud = node_configs(_aws(cluster={"workers": {"count": 3}}), "r", "s3://b/r")
    assert {(c.gpus, c.gpu_offset, c.instance_type) for n, c in cloud.items() if n.startswith("worker")} == {
        (1, 0, "g4dn.xlarge")
    }


@pytest.mark.parametrize(
    ("gpus", "offset", "inherited", "expected"),
    [
        (0, 0, None, ""),  # a CPU node must not take GPU memory from the trainers
        (0, 0, "0,1", ""),
        (1, 0, None, "0"),
        (2, 2, None, "2,3"),
        (1, 1, "4,6", "6"),  # slots index what the user left visible
        (2, 1, "4,6", "6"),  # fewer than asked: the node's device check then fails, naming it
        (1, 0, "", ""),  # the user hid every GPU: it stays hidden
    ],
)
def test_cuda_visible_devices(gpus: int, offset: int, inherited: str | None, expected: str) -> None:
    assert cuda_visible_devices(gpus, offset, inherited) == expected


# ---------------------------------------------------------------- rendered installs and the plan


def test_default_aws_render_installs_the_gpu_build_on_workers_only(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers (g4dn) install the run's gpu lock, the chief and the ps (m5) its cpu lock: each node
    fetches its flavor's lock, checks that lock's sha256 (the one its node.json names) and installs
    nothing else but the run's wheel, without dependencies."""
    result = cli("render", "--target", "aws", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    files = sorted((tmp_path / "out").glob("*.user-data.yaml"))
    assert [f.name.split(".")[0] for f in files] == ["chief-0", "ps-0", "worker-0", "worker-1"]
    shas: dict[str, set[str]] = {"cpu": set(), "gpu": set()}
    for path in files:
        text = path.read_text()
        files_written = {f["path"]: f["content"] for f in yaml.safe_load(text)["write_files"]}
        config = json.loads(files_written["/etc/dlinfra/node.json"])
        lines = [line.strip() for line in files_written["/usr/local/lib/dlinfra/install.sh"].splitlines()]
        flavor = "gpu" if path.name.startswith("worker") else "cpu"
        if flavor == "gpu":
            assert "TensorFlow build of this node: GPU (tensorflow[and-cuda]) for 1 GPU" in text
        else:
            assert "TensorFlow build of this node: CPU (tensorflow-cpu)" in text
        sha = config["lock_sha256"]
        [fetch] = [line for line in lines if line.endswith(" /etc/dlinfra/env.lock") and "s3 cp" in line]
        assert fetch.endswith(f"/code/env-{flavor}.lock /etc/dlinfra/env.lock"), fetch
        check = f"if ! echo '{sha}  /etc/dlinfra/env.lock' | sha256sum -c --quiet -; then"
        image = re.compile(rf".*python3 - sha256:[0-9a-f]{{64}} {flavor} {sha} <<'PY'")
        [decide] = [line for line in lines if image.fullmatch(line)]
        assert lines.index(fetch) < lines.index(check) < lines.index(decide), "checked before all else"
        for line in lines:  # the lock with its hashes required, else only the run's wheel, --no-deps
            if re.match(r"/opt/dlinfra/bin/(pip|uv) ", line):
                wheel = shlex.split(line)[-1].startswith("/opt/dlinfra-wheel/dlinfra-0.1.0-")
                assert "--require-hashes" in line or (wheel and "--no-deps" in line), line
        shas[flavor].add(sha)
        assert_valid_cloud_config(path.read_text(), path)
    assert len(shas["cpu"]) == len(shas["gpu"]) == 1 and shas["cpu"] != shas["gpu"], shas
    # what the two locks hold, from the render's own resolution (deploy.preview), seen in-process
    from dlinfra.deploy import preview
    from dlinfra.prepare import Environment
    from dlinfra.targets import target_for

    made: list[Environment] = []
    of = Environment.of
    monkeypatch.setattr(
        Environment, "of", lambda *args, **kwargs: made.append(of(*args, **kwargs)) or made[-1]
    )
    configs, _ = preview(_aws(), target_for("aws"))
    [env] = made
    assert {configs[n].lock_sha256 for n in ("worker-0", "worker-1")} == {env.locks["gpu"].sha256}
    assert {configs[n].lock_sha256 for n in ("chief-0", "ps-0")} == {env.locks["cpu"].sha256}
    gpu, cpu = env.locks["gpu"].pins(), env.locks["cpu"].pins()
    assert gpu["tensorflow"].startswith("2.21.") and "tensorflow-cpu" not in gpu
    assert any(name.startswith("nvidia-") for name in gpu), "tensorflow[and-cuda]: CUDA's wheels"
    assert cpu["tensorflow-cpu"].startswith("2.21.") and "tensorflow" not in cpu
    assert not any(name.startswith("nvidia-") for name in cpu), "no CUDA on a CPU node"
    assert "uv" in gpu and "uv" in cpu, "install.sh takes uv off the lock"


def test_plan_summary_shows_vcpus_gpus_and_prices_per_role() -> None:
    summary = summarize({"resource_changes": []}, "r-1", _aws(cluster={"workers": {"count": 3}}))
    text = summary.text()
    assert "worker    3 x g4dn.xlarge: 4 vCPU, 1 x NVIDIA T4 16 GiB; trains on 1 GPU · $1.578/h" in text
    assert "chief     1 x m5.xlarge: 4 vCPU; CPU · $0.192/h" in text
    assert f"as of {catalog().prices_as_of}" in text
    assert "| worker | 3 | `g4dn.xlarge` | 4 | 1 x NVIDIA T4 16 GiB (1) | $1.578 |" in summary.markdown()
    # 3 x 0.526 + 2 x 0.192 + NAT 0.045 = 2.007 $/h, for the default max_runtime of one hour
    assert "At max_runtime (1 h): at most $2.01, priced as above" in text
    assert "the NAT gateway and its Elastic IP stay up at $0.050/h until `dlinfra watch r-1`" in text
    assert "stay up at $0.050/h" in summary.markdown()
    direct = summarize({"resource_changes": []}, "r-2", _aws(aws={"egress": "public_ip"}))
    assert "what stays up (the VPC, its subnets and security group) costs nothing" in direct.text()


# ---------------------------------------------------------------- nodes that run on this machine


@pytest.mark.parametrize(
    ("fields", "available", "refused"),
    [
        ({}, 0, True),  # g4dn.xlarge auto: 1 GPU each for 2 workers
        ({}, 1, True),
        ({}, 2, False),
        ({"cluster": {"workers": {"count": 3, "gpus": 0}}}, 0, False),
        ({"strategy": "multi_worker_mirrored", "cluster": {"workers": {"count": 2, "gpus": 1}}}, 2, False),
        (
            {"strategy": "multi_worker_mirrored", "cluster": {"workers": {"instance_type": "g5.12xlarge"}}},
            4,
            True,
        ),
    ],
)
def test_workers_on_this_machine_need_its_gpus(fields: dict, available: int, refused: bool) -> None:
    found = host_gpu_problems(_aws(**fields), True, available, "emulated instances (process)")
    assert bool(found) is refused, found
    if refused:
        assert found[0].loc == ("cluster", "workers", "gpus")
        assert f"which has {available} GPU" in found[0].message and "gpus=0" in found[0].fix


@pytest.mark.parametrize("emulation", ["process", "vm"])
def test_emulated_instances_refuse_gpus_this_machine_lacks_before_terraform(
    cli: Cli, home: Path, emulation: str
) -> None:
    """Stands in for a GPU-less laptop (this machine has no GPU): the refusal comes at preflight, before
    credentials, the endpoint (none listens on port 9) or terraform are touched."""
    assert machine_gpus() == 0, "this test needs a machine without GPUs"
    aws = ["--target", "aws", "--endpoint-url", "http://127.0.0.1:9", "--set", "aws.ami=ami-12345678"]
    store = ["--set", "storage.url=s3://results-bucket/runs"]
    result = cli("deploy", *aws, *store, f"--emulate-instances={emulation}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cluster.workers.gpus: 2 workers x 1 GPU (auto: all of g4dn.xlarge's) need 2" in result.stderr
    assert "Fix: train on CPU with --set cluster.workers.gpus=0" in result.stderr
    assert not home.exists() or not any(home.rglob("*.tf*")), "no stack was written"
    on_cpu = cli(
        "deploy",
        *aws,
        *store,
        f"--emulate-instances={emulation}",
        "--set",
        "cluster.workers.gpus=0",
        extra_env=FAKE_CREDS,
    )
    # past the check: the next preflight step finds nothing listening at the endpoint
    assert on_cpu.returncode == 2 and " need " not in on_cpu.stderr, on_cpu.stderr
    assert "cannot reach http://127.0.0.1:9" in on_cpu.stderr, on_cpu.stderr

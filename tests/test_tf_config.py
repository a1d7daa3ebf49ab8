"""TF_CONFIG and address plans: pure functions of plain data, table-driven."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from dlinfra.contract import tf_config
from dlinfra.errors import SpecError
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.model import Spec
from support import addresses, node_configs

PS_CLUSTER = {"chief": ["h:1"], "worker": ["h:2", "h:3", "h:4"], "ps": ["h:5", "h:6"]}
MWMS_CLUSTER = {"worker": ["h:1", "h:2"]}


@pytest.mark.parametrize(
    ("cluster", "role", "index"),
    [
        (PS_CLUSTER, "chief", 0),
        (PS_CLUSTER, "worker", 0),
        (PS_CLUSTER, "worker", 2),
        (PS_CLUSTER, "ps", 0),
        (PS_CLUSTER, "ps", 1),
        (MWMS_CLUSTER, "worker", 0),
        (MWMS_CLUSTER, "worker", 1),
    ],
)
def test_tf_config_names_the_task_and_carries_the_whole_cluster(cluster, role, index) -> None:
    config = tf_config(cluster, role, index)
    assert config == {"cluster": cluster, "task": {"type": role, "index": index}}
    assert config["cluster"] is not cluster  # a copy: callers cannot mutate the plan through it


@pytest.mark.parametrize(
    ("cluster", "role", "index", "message"),
    [
        (MWMS_CLUSTER, "chief", 0, "not in the cluster"),
        (MWMS_CLUSTER, "ps", 0, "not in the cluster"),
        (PS_CLUSTER, "worker", 3, "out of range"),
        (PS_CLUSTER, "ps", -1, "out of range"),
    ],
)
def test_tf_config_rejects_tasks_outside_the_cluster(cluster, role, index, message) -> None:
    with pytest.raises(ValueError, match=message):
        tf_config(cluster, role, index)


def test_tf_config_is_what_the_tf_resolver_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import tensorflow as tf

    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config(PS_CLUSTER, "worker", 2)))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert resolver.task_type == "worker" and resolver.task_id == 2
    assert resolver.cluster_spec().as_dict() == PS_CLUSTER


@pytest.mark.parametrize(
    ("strategy", "workers", "ps", "expected"),
    [
        ("parameter_server", 3, 1, {"chief": 1, "worker": 3, "ps": 1}),
        ("parameter_server", 1, 2, {"chief": 1, "worker": 1, "ps": 2}),
        ("multi_worker_mirrored", 2, 1, {"worker": 2}),
        ("multi_worker_mirrored", 1, 0, {"worker": 1}),
    ],
)
def test_local_plan_gives_each_role_distinct_loopback_ports(strategy, workers, ps, expected) -> None:
    spec = load_spec(None, Overrides(strategy=strategy, workers=workers, ps=ps))
    plan = addresses(spec)
    assert {role: len(addrs) for role, addrs in plan.cluster().items()} == expected
    listed = [n.address for n in plan]
    assert len(set(listed)) == len(listed)
    assert all(n.host == "127.0.0.1" for n in plan)


def test_free_ports_for_host_network_runs_lie_below_the_ephemeral_range_and_are_free() -> None:
    """A port chosen in the ephemeral range can go to any outgoing connection before a node binds it."""
    from dlinfra.render.addresses import LISTEN_PORTS, free_ports
    from dlinfra.targets.private_network import FIRST_PORT

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = list(free_ports(40))
    assert len(set(ports)) == 40 and all(p < low for p in ports)
    # private clusters' fixed ports (up to 3000 nodes) never meet a host-network run's
    assert LISTEN_PORTS[0] >= FIRST_PORT + 3000 and all(p >= LISTEN_PORTS[0] for p in ports)


def test_aws_plan_uses_fixed_private_ips_in_role_blocks() -> None:
    spec = load_spec(None, Overrides(target="aws", workers=3, ps=2))
    plan = addresses(spec)
    assert plan.cluster() == {
        "chief": ["10.42.1.10:2222"],
        "worker": ["10.42.1.128:2222", "10.42.1.129:2222", "10.42.1.130:2222"],
        "ps": ["10.42.1.16:2222", "10.42.1.17:2222"],
    }


def test_adding_a_worker_moves_no_other_node() -> None:
    small = addresses(load_spec(None, Overrides(target="aws", workers=3)))
    large = addresses(load_spec(None, Overrides(target="aws", workers=4)))
    for node in small:
        assert next(n for n in large if n.name == node.name).address == node.address


def test_aws_plan_fits_100_workers_in_the_subnet() -> None:
    spec = load_spec(None, Overrides(target="aws", workers=100, sets=["aws.subnet_cidr=10.42.0.0/23"]))
    subnet = ipaddress.IPv4Network("10.42.0.0/23")
    hosts = [ipaddress.IPv4Address(n.host) for n in addresses(spec)]
    assert len(set(hosts)) == 102
    assert all(h in subnet and h != subnet.broadcast_address for h in hosts)


def test_aws_plan_refuses_a_subnet_too_small() -> None:
    spec = load_spec(None, Overrides(target="aws", workers=200))  # a /24 has room for 127 workers
    with pytest.raises(SpecError, match=r"aws\.subnet_cidr"):
        addresses(spec)


def test_mirrored_worker_zero_is_the_chief() -> None:
    spec = Spec(strategy="multi_worker_mirrored")
    configs = node_configs(spec, "r", "file:///tmp/s/r")
    assert [name for name, c in configs.items() if c.is_chief] == ["worker-0"]
    spec = Spec()
    configs = node_configs(spec, "r", "file:///tmp/s/r")
    assert [name for name, c in configs.items() if c.is_chief] == ["chief-0"]

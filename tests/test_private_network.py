"""Which network a local run gets (cluster.local_network), and the namespace it runs in.

The exposure itself is proved on real runs in tests/e2e/test_local_network.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlinfra.errors import SpecError
from dlinfra.spec.model import Spec
from dlinfra.targets import private_network
from dlinfra.targets.base import TargetOptions
from dlinfra.targets.local import LocalTarget
from support import run_cli


def _spec(**cluster: object) -> Spec:
    return Spec.model_validate({"cluster": cluster})


S3_STORE = {"storage": {"url": "s3://results-bucket/runs"}}
REMOTE_DATA = {"training": {"dataset": {"format": "cifar10", "uri": "https://example.org/cifar.tgz"}}}


def test_the_embedded_default_runs_private_on_fixed_ports() -> None:
    target = LocalTarget(TargetOptions())
    plan = target.addresses(Spec())
    assert target.network is not None and target.network.private
    assert [n.port for n in plan] == list(range(private_network.FIRST_PORT, private_network.FIRST_PORT + 4))


@pytest.mark.parametrize("needs", [S3_STORE, REMOTE_DATA], ids=["s3-store", "https-dataset"])
def test_nodes_that_need_the_network_share_the_hosts_and_the_plan_says_why(needs: dict) -> None:
    choice = private_network.choose(Spec.model_validate(needs))
    assert not choice.private
    assert "network: host (" in choice.why and "listen on every interface" in choice.why
    assert ("storage.url" in choice.why) or ("training.dataset.uri" in choice.why)


@pytest.mark.parametrize("needs", [S3_STORE, REMOTE_DATA], ids=["s3-store", "https-dataset"])
def test_private_with_nodes_that_need_the_network_is_refused(needs: dict) -> None:
    spec = Spec.model_validate({**needs, "cluster": {"local_network": "private"}})
    with pytest.raises(SpecError, match=r"cluster.local_network: private, but .* Fix: "):
        private_network.choose(spec)


def test_host_is_taken_as_asked() -> None:
    choice = private_network.choose(_spec(local_network="host"))
    assert not choice.private and "cluster.local_network: host" in choice.why


def test_validate_refuses_private_with_an_s3_store_with_exit_2(tmp_path: Path) -> None:
    result = run_cli(
        "validate", "--set", "cluster.local_network=private", "--set", "storage.url=s3://results-bucket/r",
        env=dict(os.environ, DLINFRA_HOME=str(tmp_path)), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cluster.local_network: private" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (("storage.url=s3://results-bucket/r",), "storage.url s3://results-bucket/r is written by the nodes"),
        (("cluster.ps.instance_type=m5.mega",), "m5.mega not in the catalog"),
    ],
    ids=["s3-store", "unknown-type"],
)
def test_validate_refuses_a_shaped_network_it_cannot_make_with_exit_2(
    tmp_path: Path, sets: tuple[str, ...], said: str
) -> None:
    """Shaped links have no route out (like private), and each node's link is its type's bandwidth."""
    result = run_cli(
        "validate", "--set", "cluster.local_network=shaped", *(a for s in sets for a in ("--set", s)),
        env=dict(os.environ, DLINFRA_HOME=str(tmp_path)), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"cluster.local_network: shaped, but {said}" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def forbidding_unshare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands in for a kernel that forbids unprivileged user namespaces (Ubuntu 24.04's AppArmor
    default): an `unshare` that fails as util-linux's does there."""
    fake = tmp_path / "bin" / "unshare"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'unshare: write failed /proc/self/uid_map: Operation not permitted' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.usefixtures("forbidding_unshare")
def test_where_namespaces_are_forbidden_auto_falls_back_to_host_and_says_why() -> None:
    choice = private_network.choose(Spec())
    assert not choice.private
    assert "user namespaces are not available" in choice.why and "Operation not permitted" in choice.why


@pytest.mark.usefixtures("forbidding_unshare")
def test_where_namespaces_are_forbidden_private_is_refused_with_the_sysctl_fix() -> None:
    with pytest.raises(SpecError, match="apparmor_restrict_unprivileged_userns"):
        private_network.choose(_spec(local_network="private"))


def test_a_namespace_has_its_own_loopback_up_and_ends_with_its_holder() -> None:
    namespace = private_network.Namespace()
    try:
        probe = (
            "import socket; s = socket.create_server(('127.0.0.1', 0)); port = s.getsockname()[1]; "
            "socket.create_connection(('127.0.0.1', port), timeout=3).close(); print(port)"
        )
        inside = subprocess.run(
            namespace.command("chief-0", [sys.executable, "-c", probe]),
            capture_output=True,
            text=True,
            check=False,
        )
        assert inside.returncode == 0, inside.stderr
        assert os.readlink(f"/proc/{namespace.holder.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    finally:
        namespace.close()
    assert namespace.holder.poll() is not None

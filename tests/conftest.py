"""Shared fixtures: a private DLINFRA_HOME, the real CLI as a subprocess, a moto S3/EC2/IAM server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Fake credentials for the emulator; tests also check these values never land in any file.
FAKE_CREDS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKETESTING00001",
    "AWS_SECRET_ACCESS_KEY": "fakeSecretForTestsOnly/dlinfra0000000000000",
    "AWS_SESSION_TOKEN": "fakeSessionTokenForTestsOnly-dlinfra-123456789",
    "AWS_DEFAULT_REGION": "us-east-1",
}

# Where this machine keeps the AWS provider for offline `terraform init` (a test setting only).
PROVIDER_MIRROR = Path(os.environ.get("DLINFRA_TF_PROVIDER_MIRROR", "/opt/tf-plugins"))

Cli = Callable[..., subprocess.CompletedProcess[str]]


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 900,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "dlinfra", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"dlinfra {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "dlinfra-home"
    monkeypatch.setenv("DLINFRA_HOME", str(path))
    return path


@pytest.fixture
def cli(home: Path, tmp_path: Path) -> Cli:
    """The real `dlinfra` in a subprocess, with this test's DLINFRA_HOME."""

    def call(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, DLINFRA_HOME=str(home), **kwargs.pop("extra_env", {}))  # type: ignore[arg-type]
        return run_cli(*args, env=env, cwd=kwargs.pop("cwd", tmp_path), **kwargs)  # type: ignore[arg-type]

    return call


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real moto server (S3, EC2, IAM, STS, SSM over HTTP) on a loopback port."""
    # AWS-managed policies (AmazonSSMManagedInstanceCore) exist in moto only when loaded.
    os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def s3_client(endpoint: str):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=FAKE_CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDS["AWS_SECRET_ACCESS_KEY"],
    )


def alive_node_pids(marker: str) -> list[int]:
    """PIDs of running `dlinfra node run` processes whose command line mentions `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split()[2]
        except OSError:
            continue
        if "dlinfra node run" in cmd and marker in cmd and state != "Z":
            found.append(int(proc.name))
    return found


@pytest.fixture(scope="session")
def tf_cli_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CLI config: providers from the local mirror (when present) plus a shared plugin cache."""
    if shutil.which("terraform") is None:
        pytest.fail(
            "terraform is not on PATH: install terraform >= 1.7 (or deselect with -m 'not terraform')"
        )
    root = tmp_path_factory.mktemp("terraform-cli")
    cache = root / "plugin-cache"
    cache.mkdir()
    lines = [f'plugin_cache_dir = "{cache}"']
    if PROVIDER_MIRROR.is_dir():
        lines += [
            "provider_installation {",
            f'  filesystem_mirror {{ path = "{PROVIDER_MIRROR}" }}',
            "}",
        ]
    config = root / "terraform.tfrc"
    config.write_text("\n".join(lines) + "\n")
    return config

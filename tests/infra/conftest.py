"""Fixtures for the Terraform half of dlinfra: offline provider, moto server, throwaway infra copies.

Nothing here mutates ``os.environ``: every terraform subprocess gets an explicit environment
(CLI config, fake credentials) and every boto3 client explicit credentials, so the fake AWS
settings never leak into other test packages (which may test "no credentials" behaviour).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

INFRA = Path(__file__).resolve().parents[2] / "src" / "dlinfra" / "infra"
# Every Terraform configuration of the tree: root stacks and modules (each has a versions.tf).
CONFIG_DIRS = sorted(p.parent.relative_to(INFRA).as_posix() for p in INFRA.rglob("versions.tf"))
# Test setting only: an unpacked provider mirror for offline `terraform init`.
REGION = "us-east-1"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class TerraformError(AssertionError):
    """A terraform command failed; carries the command and terraform's own diagnostics."""

    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"terraform {' '.join(args)} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
        )
        self.result = result


@dataclass
class Terraform:
    """Runs terraform in one working directory with a fixed environment."""

    workdir: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        argv = list(args)
        result = subprocess.run(
            ["terraform", f"-chdir={self.workdir}", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise TerraformError(argv, result)
        return result

    def init(self, *, backend: bool = True) -> None:
        self.run("init", "-input=false", "-no-color", *([] if backend else ["-backend=false"]))

    def apply(self, *args: str) -> None:
        self.run("apply", "-auto-approve", "-input=false", "-no-color", "-parallelism=20", *args)

    def destroy(self, *args: str) -> None:
        self.run("destroy", "-auto-approve", "-input=false", "-no-color", "-parallelism=20", *args)

    def output(self) -> dict[str, Any]:
        raw = json.loads(self.run("output", "-json", "-no-color").stdout)
        return {name: entry["value"] for name, entry in raw.items()}


def _terraform_env(cli_config: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ minus anything that could point terraform or the provider elsewhere."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "TF_VAR_", "TF_CLI_ARGS", "TF_DATA_DIR", "TF_WORKSPACE", "TF_LOG"))
    }
    env.update(
        TF_CLI_CONFIG_FILE=str(cli_config),
        TF_IN_AUTOMATION="1",
        TF_INPUT="0",
        CHECKPOINT_DISABLE="1",
        GOGC=os.environ.get("GOGC", "400"),  # as dlinfra's own runs set it (dlinfra.terraform: why)
        # Never read the developer's real AWS config or credentials files.
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    env.update(extra or {})
    return env


@pytest.fixture(scope="session")
def tf_env(tf_cli_config: Path) -> dict[str, str]:
    """Environment for offline terraform commands that need no AWS endpoint (fmt, validate, test)."""
    return _terraform_env(tf_cli_config)


def copy_infra(dst: Path) -> Path:
    """A private copy of the infra tree (modules keep their relative paths); no working files."""
    shutil.copytree(
        INFRA,
        dst,
        ignore=shutil.ignore_patterns(".terraform", "*.tfstate", "*.tfstate.*", ".terraform.lock.hcl"),
    )
    return dst


@pytest.fixture(scope="session")
def infra_dir() -> Path:
    """The product's Terraform tree, src/dlinfra/infra (read it; never run terraform in it)."""
    return INFRA


@pytest.fixture(scope="session")
def make_infra_copy():
    """Factory: copy the infra tree to a given path and return it."""
    return copy_infra


@pytest.fixture
def infra_copy(tmp_path: Path) -> Path:
    """A fresh copy of src/dlinfra/infra for one test."""
    return copy_infra(tmp_path / "infra")


@pytest.fixture(scope="session")
def terraform_in(tf_env: dict[str, str]):
    """Factory: an offline Terraform runner (no AWS endpoint) for a working directory."""

    def make(workdir: Path) -> Terraform:
        return Terraform(workdir, tf_env)

    return make


@dataclass
class MotoServer:
    """A moto server on 127.0.0.1 serving EC2/VPC, IAM, S3, STS and SSM on one endpoint."""

    endpoint_url: str
    region: str = REGION
    credentials: dict[str, str] = field(default_factory=lambda: dict(FAKE_CREDENTIALS))

    def client(self, service: str, region: str | None = None) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint_url,
            region_name=region or self.region,
            aws_access_key_id=self.credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.credentials["AWS_SECRET_ACCESS_KEY"],
        )

    def terraform(self, workdir: Path, cli_config: Path) -> Terraform:
        """A terraform runner whose AWS provider talks to this server with fake credentials."""
        return Terraform(workdir, _terraform_env(cli_config, {**self.credentials, "AWS_REGION": self.region}))


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server for the session, on a free port of 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield MotoServer(endpoint_url=f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def own_moto() -> Iterator[MotoServer]:
    """A moto server in a process of its own: switching its auth on touches no other test's server."""
    yield from _moto_process("")


# moto judges SSM calls against resource `*`; AWS judges them against the parameter's ARN. This
# makes moto judge them as AWS does (a stand-in's gap filled, nothing of dlinfra's faked).
SSM_AS_AWS = """
from moto.ssm.responses import SimpleSystemManagerResponse as R
def _resource(self):
    name = str(self._get_param("Name") or "").lstrip("/")
    return f"arn:aws:ssm:{self.region}:{self.current_account}:parameter/{name}" if name else "*"
R._determine_resource = _resource
"""


@pytest.fixture(scope="module")
def own_moto_judging_ssm() -> Iterator[MotoServer]:
    """own_moto, judging SSM calls by the parameter's ARN as AWS does."""
    yield from _moto_process(SSM_AS_AWS)


def _moto_process(setup: str) -> Iterator[MotoServer]:
    import sys

    code = setup + (
        "\nfrom moto.server import ThreadedMotoServer as S; "
        "s = S(ip_address='127.0.0.1', port=0, verbose=False); s.start(); "
        "print(s.get_host_and_port()[1], flush=True); import time; time.sleep(3600)"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert server.stdout is not None
        yield MotoServer(endpoint_url=f"http://127.0.0.1:{int(server.stdout.readline())}")
    finally:
        server.kill()
        server.wait()


def role_credentials(moto: MotoServer, role_arn: str, session: str) -> dict[str, str]:
    """Switch the server's auth on (moto's `reset-auth`: everything after is judged) and return the
    role's temporary credentials, as an instance profile gives them."""
    import urllib.request

    reset = urllib.request.Request(
        f"{moto.endpoint_url}/moto-api/reset-auth",
        data=b"1",
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    assert json.loads(urllib.request.urlopen(reset).read())["status"] == "ok"
    creds = moto.client("sts").assume_role(RoleArn=role_arn, RoleSessionName=session)["Credentials"]
    return {key: str(creds[key]) for key in ("AccessKeyId", "SecretAccessKey", "SessionToken")}


def as_role(moto: MotoServer, role_arn: str, session: str, services: tuple[str, ...]) -> dict[str, Any]:
    """A client per service holding the role's credentials, auth on (role_credentials)."""
    import boto3

    creds = role_credentials(moto, role_arn, session)
    return {
        service: boto3.client(
            service,
            endpoint_url=moto.endpoint_url,
            region_name=moto.region,
            aws_access_key_id=creds["AccessKeyId"],
            aws_secret_access_key=creds["SecretAccessKey"],
            aws_session_token=creds["SessionToken"],
        )
        for service in services
    }


def allowed(call: Any) -> bool:
    """True if the call went through, False if moto denied it (any other error fails the test)."""
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("AccessDenied", "AccessDeniedException"), exc.response
        return False
    return True

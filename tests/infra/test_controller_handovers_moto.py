"""Issue 55, class 3, with the controller role's IAM enforced: `dlinfra controller run` holding only
the role's credentials (modules/controller_iam applied by real Terraform to a moto server of its own,
which judges SSM by the parameter's ARN as AWS does) finds hand-overs planted in its bucket beside a
sealed one. It reads its bucket's hand-over key (and no other parameter), acts on the sealed record,
quarantines and logs each planted one once, contacts no endpoint a record names, and goes idle on
time. tests/test_controller_handovers.py covers more planted shapes with auth off."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from controller_runs import counting_endpoint, make_run
from infra.conftest import MotoServer, role_credentials
from infra.test_controller_role_moto import apply_controller_role

from dlinfra.contract import StoreConfig
from dlinfra.runs import handover
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.ownership import Lease, claim
from dlinfra.runs.sealing import key_parameter, read_key, seal
from support import run_cli

pytestmark = [pytest.mark.terraform, pytest.mark.slow]

RESULTS, OTHER, REGION = "dlinfra-sealed", "team-private", "us-east-1"


def test_the_controller_role_acts_on_sealed_handovers_only_quarantines_the_rest_once_and_goes_idle(
    own_moto_judging_ssm: MotoServer,
    infra_dir: Path,
    tf_cli_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    moto = own_moto_judging_ssm
    outputs = apply_controller_role(moto, infra_dir, tf_cli_config, tmp_path, RESULTS, RESULTS)
    s3 = moto.client("s3")
    for bucket in (RESULTS, OTHER):
        s3.create_bucket(Bucket=bucket)
    moto.client("ssm").put_parameter(Name="/team/db-password", Value="not-for-it", Type="SecureString")
    for name, value in moto.credentials.items():  # the deploying user's, while auth is off
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    key = read_key(RESULTS, REGION, moto.endpoint_url, create=True)  # as `setup --controller` makes it
    assert key is not None
    controller_store = ControllerStore.of_bucket(RESULTS, moto.endpoint_url, REGION)
    ended = make_run(tmp_path / "laptop", RESULTS, moto.endpoint_url, monkeypatch)
    lease = claim(ended.store(), "cli", "cli laptop")
    assert isinstance(lease, Lease)
    genuine = handover.hand_over(
        ended, ended.store(), controller_store, lease, keep=False, emulate_instances=None
    )
    ended.store().write_marker("DONE")
    ended.update_manifest(destroyed=True)
    ended.publish_manifest()

    with counting_endpoint() as (stray, contacted):
        elsewhere = StoreConfig(url=f"s3://{OTHER}/runs/{genuine.run_id}", endpoint_url=stray, region=REGION)
        mine_by_stray = StoreConfig(url=genuine.store.url, endpoint_url=stray, region=REGION)
        planted = {
            "garbage.json": b"{ not json",
            "elsewhere.json": genuine.model_copy(update={"store": elsewhere}).model_dump_json().encode(),
            "forged.json": seal(genuine.model_copy(update={"store": mine_by_stray}), b"guess")
            .model_dump_json()
            .encode(),
        }
        for name, data in planted.items():
            s3.put_object(Bucket=RESULTS, Key=f"controller/handovers/{name}", Body=data)

        creds = role_credentials(moto, outputs["role_arn"], "controller")  # auth on from here
        as_role = dict(
            AWS_ACCESS_KEY_ID=creds["AccessKeyId"],
            AWS_SECRET_ACCESS_KEY=creds["SecretAccessKey"],
            AWS_SESSION_TOKEN=creds["SessionToken"],
        )
        ssm, s3_role = (_client(moto, service, creds) for service in ("ssm", "s3"))
        found = ssm.get_parameter(Name=key_parameter(RESULTS), WithDecryption=True)["Parameter"]["Value"]
        assert found.encode() == key  # its own bucket's key, and no other parameter
        for other in ("/team/db-password", key_parameter(OTHER)):
            assert _denied(lambda other=other: ssm.get_parameter(Name=other, WithDecryption=True))

        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | as_role
        env |= {"AWS_DEFAULT_REGION": REGION, "DLINFRA_HOME": str(tmp_path / "controller")}
        env |= {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
        args = ["--bucket", RESULTS, "--endpoint-url", moto.endpoint_url, "--idle-minutes", "0.3"]
        ran = run_cli("controller", "run", *args, env=env, timeout=180)

    said = ran.stdout + ran.stderr
    assert ran.returncode == 0 and "nothing to own for 0.3 min: stopping" in ran.stdout, said
    assert contacted == []
    for name in planted:
        assert said.count(f"controller/handovers/{name}: not acted on") == 1, (name, said)
        assert f"controller/quarantine/{name}" in said
    assert "cannot verify" not in said and "AccessDenied" not in said, said
    left = s3_role.list_objects_v2(Bucket=RESULTS, Prefix="controller/handovers/")
    assert "Contents" not in left  # the sealed one acted on (its run ended: dropped), the rest moved
    moved = s3_role.list_objects_v2(Bucket=RESULTS, Prefix="controller/quarantine/")["Contents"]
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in moved) == sorted(planted)
    assert key.decode() not in said


def _client(moto: MotoServer, service: str, creds: dict[str, str]) -> Any:
    import boto3

    return boto3.client(
        service,
        endpoint_url=moto.endpoint_url,
        region_name=REGION,
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )


def _denied(call: Any) -> bool:
    """moto's SSM answers a denial as XML its JSON clients read as code 403: the message tells."""
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError as exc:
        return "AccessDenied" in str(exc) or exc.response["Error"]["Code"] == "AccessDeniedException"
    return False

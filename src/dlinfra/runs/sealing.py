"""Sealed hand-overs: the controller acts only on records this account's dlinfra wrote.

Anyone who can write the bucket's `controller/` prefix can plant a hand-over; only the deploying
user and the controller's role can read the key (an SSM SecureString parameter the role may read and
nothing else may, by its policy). A hand-over carries an HMAC of its canonical JSON under that key,
and the digest of the run dir it travels with, so neither the record nor the run dir can be swapped.
The key never leaves SSM and memory: no file, tfvars, Terraform state, log or store object holds it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

from dlinfra.errors import StoreError
from dlinfra.runs.records import Handover


def key_parameter(bucket: str) -> str:
    """The SSM parameter of `bucket`'s hand-over key (the controller role's policy names it)."""
    return f"/dlinfra/controller/{bucket}/handover-key"


def read_key(bucket: str, region: str | None, endpoint_url: str | None, *, create: bool) -> bytes | None:
    """The hand-over key of `bucket`; made first when `create` (the deploying user's side) and none
    is there yet. None: there is none and this side may not make one."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    ssm = boto3.client("ssm", region_name=region or "us-east-1", endpoint_url=endpoint_url)
    name = key_parameter(bucket)
    try:
        return _get(ssm, name)
    except ClientError as exc:
        if _code(exc) != "ParameterNotFound":
            raise _unreadable(name, exc) from None
    except BotoCoreError as exc:
        raise _unreadable(name, exc) from None
    if not create:
        return None
    try:
        ssm.put_parameter(
            Name=name,
            Value=secrets.token_hex(32),
            Type="SecureString",
            Overwrite=False,  # two deploys at once: the first key made is the key
            Description="dlinfra: seals the hand-overs of this bucket's controller",
        )
    except ClientError as exc:
        if _code(exc) != "ParameterAlreadyExists":
            raise _unreadable(name, exc) from None
    except BotoCoreError as exc:
        raise _unreadable(name, exc) from None
    try:
        return _get(ssm, name)
    except (BotoCoreError, ClientError) as exc:
        raise _unreadable(name, exc) from None


def _get(ssm: Any, name: str) -> bytes:
    value = ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
    return str(value).encode()


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _unreadable(name: str, exc: Exception) -> StoreError:
    # the error's class only: a service message may quote the request
    why = _code(exc) if hasattr(exc, "response") else type(exc).__name__
    return StoreError(
        f"the hand-over key (SSM parameter {name}) cannot be read or made: {why}. Fix: check the AWS "
        "credentials (ssm:GetParameter, and ssm:PutParameter the first time) and the region"
    )


def _canonical(handover: Handover) -> bytes:
    fields = handover.model_dump(mode="json", exclude={"signature"})
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def seal(handover: Handover, key: bytes) -> Handover:
    signature = hmac.new(key, _canonical(handover), hashlib.sha256).hexdigest()
    return handover.model_copy(update={"signature": signature})


def verified(handover: Handover, key: bytes) -> bool:
    """Whether `key` sealed exactly this record."""
    if not handover.signature or not handover.run_dir_sha256:
        return False
    expected = hmac.new(key, _canonical(handover), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, handover.signature)

"""Credentials pasted into an experiment are refused and never echoed: one masking function at the input
boundary (errors.mask), a check of every value before validation, and the CLI's error sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlinfra.errors import mask
from support import Cli

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example: 40 characters
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQD6" + "x7Kq3Zp9Lm2Wv8Rt5Yb1Nc4" * 6
# the part of each that must never be printed (a key id's first four letters may be, as AWS does)
NEVER_SHOWN = (KEY_ID[4:], SECRET_KEY[:12], SECRET_KEY[-12:], "hunter2hunter2", SESSION_TOKEN[20:60])


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        (f"s3://bucket/{KEY_ID}:{SECRET_KEY}", (KEY_ID[4:], SECRET_KEY)),  # the re-check's case
        (f"s3://bucket/{KEY_ID}/{SECRET_KEY}/runs", (KEY_ID[4:], SECRET_KEY[:12])),
        (f"https://{KEY_ID}:{SECRET_KEY}@host/x", (SECRET_KEY,)),
        (f"prefix:{SECRET_KEY}", (SECRET_KEY,)),
        (f"aws_session_token {SESSION_TOKEN}", (SESSION_TOKEN[20:60],)),
        ("https://mirror.example/simple?user=me&password=hunter2hunter2", ("hunter2hunter2",)),
        ("https://data.example/c.tgz?token=hunter2hunter2#frag", ("hunter2hunter2",)),
        (
            "https://b.s3.amazonaws.com/c.tgz?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
            f"{KEY_ID}%2F20261125%2Fus-east-1%2Fs3&X-Amz-Security-Token=abcDEF123xyz&X-Amz-Signature=9f8e7d",
            (KEY_ID[4:], "abcDEF123xyz", "9f8e7d"),
        ),
        ("API_KEY=hunter2hunter2", ("hunter2hunter2",)),
    ],
)
def test_credential_shapes_are_masked(text: str, hidden: tuple[str, ...]) -> None:
    masked = mask(text)
    assert masked != text
    for part in hidden:
        assert part not in masked, masked


@pytest.mark.parametrize(
    "text",
    [
        "s3://my-bucket/teams/vision/runs",
        "file:///home/someone/projects/my-experiments/data/train/images/shard-00001-of-00128",
        "/data/imagenet/train/n01440764/n01440764_10026.JPEG",
        "https://mirror.example/simple",
        "0123456789abcdef0123456789abcdef01234567",  # a git commit: 40 hex digits, no capitals
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",  # a sha256
        "MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJRTESMBAGA1UEChMJQmFs",  # PEM line
        "s3://b/" + "/".join(["Segment2026"] * 20),  # a deep prefix: a slash every few characters
        "max_tokens=512 learning_rate=0.003",
        "digits-cnn-20261122-074449-713b",
    ],
)
def test_ordinary_values_are_left_alone(text: str) -> None:
    assert mask(text) == text


# (field set with --set, value): every field that takes a URL, a path or free text, each credential shape
FIELDS = [
    ("storage.url", f"s3://bucket/{KEY_ID}:{SECRET_KEY}"),
    ("storage.url", f"s3://bucket/runs?aws_secret_access_key={SECRET_KEY}"),
    ("storage.endpoint_url", "http://127.0.0.1:5000/?token=hunter2hunter2"),
    ("aws.endpoint_url", f"http://127.0.0.1:5000/?X-Amz-Security-Token={SESSION_TOKEN}"),
    ("aws.pip_index_url", "https://mirror.example/simple?password=hunter2hunter2"),
    ("training.dataset.uri", "https://data.example/c.tgz?X-Amz-Signature=hunter2hunter2"),
    ("training.dataset.uri", f"s3://data/{KEY_ID}/{SECRET_KEY}/c.tgz"),
    ("training.entrypoint", f"{SECRET_KEY}.py:build"),
    ("aws.tags", f"{{owner: {SESSION_TOKEN}}}"),
    ("aws.tags", f"{{'{SECRET_KEY}': x}}"),
]


@pytest.mark.parametrize(("field", "value"), FIELDS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(FIELDS)])
def test_a_credential_in_any_field_is_refused_naming_it_without_echoing_it(
    cli: Cli, home: Path, tmp_path: Path, field: str, value: str
) -> None:
    for command in ("validate", "render", "deploy"):
        args = ["--out", str(tmp_path / "out")] if command == "render" else []
        result = cli(command, "--target", "aws", "--set", f"{field}={value}", *args)
        printed = result.stdout + result.stderr
        assert result.returncode == 2, printed
        assert f"{field}" in result.stderr and "looks like a credential" in result.stderr, printed
        assert "Fix: remove it" in result.stderr and "Traceback" not in printed
        for part in NEVER_SHOWN:
            assert part not in printed, (part, printed)
    assert not (tmp_path / "out").exists(), "nothing rendered"
    assert not home.exists() or not any(home.rglob("*.yaml")), "no run made"


def test_a_credential_in_the_file_names_its_line(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "experiment.yaml"
    spec.write_text(f"name: x\nstorage:\n  url: s3://bucket/{KEY_ID}:{SECRET_KEY}\n")
    result = cli("validate", str(spec))
    assert result.returncode == 2
    assert f"{spec}:3: storage.url: looks like a credential ('s3://bucket/AKIA…')" in result.stderr
    assert SECRET_KEY not in result.stderr


def test_a_run_reference_that_is_a_credential_is_not_echoed(cli: Cli) -> None:
    result = cli("show", f"{KEY_ID}:{SECRET_KEY}")
    assert result.returncode == 2
    assert "not found" in result.stderr and KEY_ID not in result.stderr and SECRET_KEY not in result.stderr

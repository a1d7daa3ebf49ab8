"""Rendered user-data: valid for the real cloud-init, round-trips to the NodeConfig, holds no secret."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dlinfra import __version__
from dlinfra.prepare import node_install
from dlinfra.render import node_config_from_user_data, render_cluster
from dlinfra.runs.records import WheelPin
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.targets.aws import install_requirement
from support import FAKE_CREDS, Cli, node_configs

CLOUD_INIT = shutil.which("cloud-init")


def _render(target: str, strategy: str, workers: int) -> dict[str, tuple[str, object]]:
    sets = ["aws.subnet_cidr=10.42.0.0/23"] if workers > 100 else []
    spec = load_spec(None, Overrides(target=target, strategy=strategy, workers=workers, sets=sets))
    configs = node_configs(spec, "digits-cnn-20261122-000000-abcd", "s3://bucket/runs/x")
    install = node_install(spec, install_requirement(), None) if target == "aws" else None
    rendered = render_cluster(configs, install)
    return {name: (rendered[name], configs[name]) for name in configs}


MATRIX = [
    (target, strategy, workers)
    for target in ("local", "aws")
    for strategy in ("parameter_server", "multi_worker_mirrored")
    for workers in (1, 3, 100)
]


@pytest.mark.parametrize(("target", "strategy", "workers"), MATRIX)
def test_every_user_data_passes_cloud_init_schema_and_round_trips(
    tmp_path: Path, target: str, strategy: str, workers: int
) -> None:
    assert CLOUD_INIT, "cloud-init must be installed (the README's test command installs it)"
    nodes = _render(target, strategy, workers)
    expected = workers + (2 if strategy == "parameter_server" else 0)
    assert len(nodes) == expected
    files = []
    for name, (text, config) in nodes.items():
        assert text.startswith("#cloud-config\n")
        assert node_config_from_user_data(text) == config
        assert len(text.encode()) < 16384, "EC2 caps user_data at 16 KB"
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        files.append(path)
    # validate a sample spanning every role (all nodes of a role share one template path)
    sample = [f for f in files if f.stem in ("chief-0", "ps-0", "worker-0", f"worker-{workers - 1}")]
    for path in sample:
        result = subprocess.run(
            [CLOUD_INIT, "schema", "--config-file", str(path)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Valid" in result.stdout


def test_aws_user_data_installs_the_runs_wheel_from_the_store(tmp_path: Path) -> None:
    """Unless the image bakes exactly this wheel, the install script fetches it from the store and
    pip-installs it with the node's TensorFlow build, from the private index and trusting its CA."""
    ca = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(
        yaml.safe_dump({"aws": {"pip_index_url": "https://pypi.internal.example/simple", "pip_extra_ca": ca}})
    )
    spec = load_spec(experiment, Overrides(target="aws", workers=2))
    configs = node_configs(spec, "r-1", "s3://bucket/runs/r-1")
    wheel = "s3://bucket/runs/r-1/code/dlinfra-0.1.0-py3-none-any.whl"
    rendered = render_cluster(
        configs, node_install(spec, wheel, WheelPin(name="w", sha256="ab" * 32, uri=wheel))
    )
    for node, extras in (("worker-0", "train-gpu,aws"), ("chief-0", "train,aws")):  # g4dn / m5 nodes
        doc = yaml.safe_load(rendered[node])
        commands = [" ".join(map(str, c)) for c in doc["runcmd"]]
        assert commands[-1] == (
            "sh -c sh /usr/local/lib/dlinfra/install.sh && systemctl daemon-reload && "
            "systemctl start --no-block dlinfra-node.service || "
            '{ echo "dlinfra: the install failed: powering off"; systemctl poweroff; }'
        ), "the agent starts only after a good install"
        files = {f["path"]: f["content"] for f in doc["write_files"]}
        script = files["/usr/local/lib/dlinfra/install.sh"]
        assert f"sha256:{'ab' * 32} {'gpu' if extras.startswith('train-gpu') else 'cpu'} <<" in script
        lines = script.splitlines()
        fetch = lines.index(f"aws s3 cp {wheel} /opt/dlinfra-wheel/")
        pip = lines.index(
            "/opt/dlinfra/bin/pip install --quiet --no-compile --no-cache-dir --disable-pip-version-check "
            "--index-url https://pypi.internal.example/simple --cert /etc/ssl/certs/ca-certificates.crt "
            f"'/opt/dlinfra-wheel/dlinfra-0.1.0-py3-none-any.whl[{extras}]'"
        )
        venv = lines.index("[ -x /opt/dlinfra/bin/python ] || python3 -m venv /opt/dlinfra")
        assert venv < fetch < lines.index("update-ca-certificates") < pip
        assert files["/usr/local/share/ca-certificates/dlinfra-extra-ca.crt"] == ca
    text = rendered["worker-0"]
    path = tmp_path / "worker-0.yaml"
    path.write_text(text)
    result = subprocess.run(
        [CLOUD_INIT, "schema", "--config-file", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cloud_init_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validator used above can fail: a bad key in write_files is caught."""
    assert CLOUD_INIT, "cloud-init must be installed (the README's test command installs it)"
    text, _ = _render("aws", "parameter_server", 1)["chief-0"]
    doc = yaml.safe_load(text)
    doc["write_files"][0]["permissions"] = 644  # must be a string
    bad = tmp_path / "bad.yaml"
    bad.write_text("#cloud-config\n" + yaml.safe_dump(doc))
    result = subprocess.run([CLOUD_INIT, "schema", "--config-file", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0


def test_aws_user_data_installs_this_exact_version_and_starts_the_agent() -> None:
    text, _ = _render("aws", "parameter_server", 1)["worker-0"]
    doc = yaml.safe_load(text)
    commands = [" ".join(map(str, c)) for c in doc["runcmd"]]
    script = next(f for f in doc["write_files"] if f["path"].endswith("install.sh"))["content"]
    assert f"'dlinfra[train-gpu,aws]=={__version__}'" in script, "g4dn: the GPU build"
    unit = next(f for f in doc["write_files"] if f["path"].endswith("dlinfra-node.service"))["content"]
    assert "dlinfra node run /etc/dlinfra/node.json" in unit
    assert "Restart=on-failure" in unit
    assert any(c.startswith("shutdown -h +") for c in commands), "OS-level watchdog"


def test_local_user_data_carries_only_the_node_config() -> None:
    text, _ = _render("local", "parameter_server", 1)["chief-0"]
    doc = yaml.safe_load(text)
    assert [f["path"] for f in doc["write_files"]] == ["/etc/dlinfra/node.json"]
    assert "runcmd" not in doc


def test_render_command_writes_user_data_and_node_json(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = cli("render", "--out", str(out), "--workers", "3", "--target", "aws", check=True)
    assert "rendered 5 nodes" in result.stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"{n}.{ext}"
        for n in ("chief-0", "ps-0", "worker-0", "worker-1", "worker-2")
        for ext in ("user-data.yaml", "json")
    )
    ud = (out / "worker-2.user-data.yaml").read_text()
    assert node_config_from_user_data(ud).model_dump() == json.loads((out / "worker-2.json").read_text())


def test_no_credential_lands_in_rendered_or_recorded_files(cli: Cli, tmp_path: Path, home: Path) -> None:
    """Fake AWS credentials in the environment never reach user-data, node.json or the run record."""
    out = tmp_path / "rendered"
    cli("render", "--out", str(out), "--target", "aws", extra_env=FAKE_CREDS, check=True)
    cli("render", "--out", str(out / "local"), extra_env=FAKE_CREDS, check=True)
    # a real (short) local run records spec.lock, manifest, user-data, node.json, logs and the store
    result = cli(
        "deploy", "--workers", "1", "--steps", "20", "--set", "training.log_every=10", extra_env=FAKE_CREDS
    )
    assert result.returncode == 0, result.stdout + result.stderr
    files = [p for root in (out, home) for p in root.rglob("*") if p.is_file()]
    assert len(files) > 20
    secrets = [FAKE_CREDS[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret[:8]}… found in {path}"
    assert secrets[0] not in result.stdout + result.stderr


def test_a_wheel_off_its_pin_is_never_installed(tmp_path: Path) -> None:
    """The install script itself, run on this machine with its paths moved under tmp: a wheel whose
    bytes differ from the run's pin stops the script before pip; the pinned bytes go on to pip.
    `aws` is a stand-in for the S3 download (a copy of a local file), named as such below."""
    wheel_name = "dlinfra-0.1.0-py3-none-any.whl"
    good = b"the run's wheel\n"
    spec = load_spec(None, Overrides(target="aws", workers=1))
    uri = f"s3://bucket/runs/r-1/code/{wheel_name}"
    pin = WheelPin(name=wheel_name, sha256=hashlib.sha256(good).hexdigest(), uri=uri)
    doc = yaml.safe_load(
        render_cluster(node_configs(spec, "r-1", "s3://bucket/runs/r-1"), node_install(spec, uri, pin))[
            "chief-0"
        ]
    )
    script = next(f for f in doc["write_files"] if f["path"].endswith("install.sh"))["content"]
    # one pass: a moved path is never moved again
    script = re.sub(r"/opt/dlinfra-wheel|/opt/dlinfra|/etc/dlinfra", lambda m: f"{tmp_path}{m[0]}", script)
    (tmp_path / "install.sh").write_text(script)
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "aws").write_text(
        f'#!/bin/sh\n# stand-in for `aws s3 cp URI DIR/`\ncp "{tmp_path}/served.whl" "$4{wheel_name}"\n'
    )
    (stand_in / "aws").chmod(0o755)
    (tmp_path / "opt" / "dlinfra-wheel").mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{stand_in}:{os.environ['PATH']}",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    for served, refused in ((good + b"tampered", True), (good, False)):
        (tmp_path / "served.whl").write_bytes(served)
        result = subprocess.run(
            ["sh", str(tmp_path / "install.sh")], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode != 0  # refused, or pip finds no index here: neither installs anything
        assert ("does not match the sha256 the run pinned" in result.stderr) is refused, result.stderr
        assert "pip" in result.stderr.lower() or "dlinfra" in result.stderr, result.stderr


def test_every_value_a_shell_reads_is_quoted_not_pasted() -> None:
    """Validation keeps such values out upstream; the template's quoting is the second wall."""
    from dlinfra.render.cloud_init import Install, render_user_data

    hostile = 's3://results-bucket/code/dlinfra-0.1.0-py3-none-any.whl"; touch pwned; echo "'
    config = node_configs(load_spec(None, Overrides()), "run-1", "s3://results-bucket/r")["chief-0"]
    text = render_user_data(config, Install(source=hostile, wheel_sha256="ab" * 32))
    script = next(f for f in yaml.safe_load(text)["write_files"] if f["path"].endswith("install.sh"))[
        "content"
    ]
    [fetch] = [line for line in script.splitlines() if line.startswith("aws s3 cp ")]
    assert shlex.split(fetch) == ["aws", "s3", "cp", hostile, "/opt/dlinfra-wheel/"]
    [pip] = [line for line in script.splitlines() if "/bin/pip install" in line]
    assert shlex.split(pip)[-1].startswith("/opt/dlinfra-wheel/dlinfra-0.1.0-py3-none-any.whl")
    assert "touch pwned" in shlex.split(pip)[-1], "the hostile tail stays inside one argument"

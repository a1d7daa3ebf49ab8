"""The controller image's terraform and providers, as an AMI builder fetches them (images.terraform_tools
.fetch_script), run here for real with two stand-ins for the internet this machine lacks: HashiCorp's
releases site (a loopback server with a zip of this machine's terraform) and the registry (the
provider mirror, through the CLI config)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dlinfra.images import Recipe, terraform_tools
from dlinfra.runs.wheel import node_wheel
from dlinfra.spec.model import Spec
from dlinfra.targets.aws.builder import TOOLS_DIR, TOOLS_SCRIPT, builder_user_data
from dlinfra.terraform import find_terraform
from support import assert_valid_cloud_config, fixed_locks

pytestmark = [pytest.mark.terraform, pytest.mark.slow]


def _releases(root: Path, binary: Path) -> None:
    version = terraform_tools.terraform_version()
    folder = root / "terraform" / version
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / f"terraform_{version}_linux_amd64.zip", "w") as archive:
        archive.write(binary, "terraform")


@pytest.fixture
def releases(tmp_path: Path) -> Iterator[Path]:
    """A stand-in for releases.hashicorp.com on a loopback port: (its root, its URL)."""
    root = tmp_path / "releases"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        root.joinpath("url").write_text(f"http://127.0.0.1:{server.server_address[1]}")
        yield root
    finally:
        server.shutdown()


def _fetch(releases: Path, dest: Path, tf_cli_config: Path) -> subprocess.CompletedProcess[str]:
    script = dest.parent / "terraform-tools.sh"
    script.write_text(terraform_tools.fetch_script(str(dest), releases.joinpath("url").read_text()))
    env = dict(os.environ, TF_CLI_CONFIG_FILE=str(tf_cli_config))
    return subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env, timeout=600)


def test_the_builder_gets_this_machines_terraform_and_provider_builds(
    releases: Path, tmp_path: Path, tf_cli_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(tf_cli_config))  # the script's lock is made here
    binary = Path(find_terraform()[0])
    _releases(releases, binary)
    dest = tmp_path / "tools"
    fetched = _fetch(releases, dest, tf_cli_config)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert (
        hashlib.sha256((dest / "terraform").read_bytes()).digest()
        == hashlib.sha256(binary.read_bytes()).digest()
    )
    providers = list((dest / "plugins" / "registry.terraform.io" / "hashicorp" / "aws").glob("*/linux_amd64"))
    assert len(providers) == 1 and any(
        p.name.startswith("terraform-provider-aws") for p in providers[0].iterdir()
    )
    # what stage() gives the local image: the same layout, so one recipe installs either
    staged = tmp_path / "staged"
    terraform_tools.stage(staged)
    assert sorted(p.relative_to(staged / "plugins") for p in (staged / "plugins").rglob("*")) == sorted(
        p.relative_to(dest / "plugins") for p in (dest / "plugins").rglob("*")
    )


def test_another_terraform_build_fails_the_builder_by_name(
    releases: Path, tmp_path: Path, tf_cli_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(tf_cli_config))
    other = tmp_path / "terraform"
    other.write_text("#!/bin/sh\necho tampered\n")
    _releases(releases, other)
    dest = tmp_path / "tools"
    fetched = _fetch(releases, dest, tf_cli_config)
    assert fetched.returncode != 0
    assert "is not the terraform" in fetched.stderr and "build the image was made with" in fetched.stderr
    assert not (dest / "plugins").exists(), "nothing past the check ran"


def test_a_controller_builder_fetches_the_tools_before_its_recipe(
    tmp_path: Path, tf_cli_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(tf_cli_config))
    wheel = node_wheel()
    assert wheel is not None
    recipe = Recipe("controller", wheel, fixed_locks()["cpu"], terraform_tools.digest())
    spec = Spec.model_validate({"target": "aws", "storage": {"url": "s3://dlinfra-tools/runs"}})
    user_data = builder_user_data(spec, recipe, timeout=3600)
    assert_valid_cloud_config(user_data, tmp_path / "user-data.yaml")
    doc = yaml.safe_load(user_data)
    files = {f["path"]: f["content"] for f in doc["write_files"]}
    assert files[TOOLS_SCRIPT].startswith("#!/bin/sh") and f"dest={TOOLS_DIR}" in files[TOOLS_SCRIPT]
    recipe_text = next(text for text in files.values() if "dlinfra node image recipe" in text)
    assert f'install -m 0755 "{TOOLS_DIR}/terraform"' in recipe_text
    last = doc["runcmd"][-1]
    assert last.startswith(f"sh {TOOLS_SCRIPT} && sh ") and "|| aws s3 cp" in last, last

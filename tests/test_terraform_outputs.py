"""An apply's outputs come from its own event stream: no second provider start for `terraform output`
(a heal waits on it). Real terraform, with terraform_data (built in: no provider)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlinfra.terraform import Terraform

pytestmark = pytest.mark.terraform

CONFIG = """
variable "shown" { default = "plain" }
resource "terraform_data" "node" { input = var.shown }
output "nodes" {
  value = { "worker-0" = { id = terraform_data.node.id, input = terraform_data.node.output } }
}
"""


def _commands(workdir: Path) -> list[str]:
    log = (workdir / "terraform.log").read_text()
    return [line.split()[2] for line in log.splitlines() if line.startswith("$ terraform ")]


def _terraform(workdir: Path, cli_config: Path) -> Terraform:
    return Terraform(workdir, env={**os.environ, "TF_CLI_CONFIG_FILE": str(cli_config)})


def _applied(workdir: Path, cli_config: Path, extra: str = "") -> dict:
    (workdir / "main.tf").write_text(CONFIG + extra)
    tf = _terraform(workdir, cli_config)
    tf.init()
    tf.run(["plan", "-input=false", "-json", f"-out={workdir / 'run.tfplan'}"])
    return tf.apply(workdir / "run.tfplan")


def test_apply_returns_its_outputs_without_running_terraform_output(
    tmp_path: Path, tf_cli_config: Path
) -> None:
    outputs = _applied(tmp_path, tf_cli_config)
    assert outputs["nodes"]["worker-0"]["input"] == "plain" and outputs["nodes"]["worker-0"]["id"]
    assert _commands(tmp_path) == ["init", "plan", "apply"]
    # the same values `terraform output` reads from the state
    assert _terraform(tmp_path, tf_cli_config).output() == outputs


def test_a_sensitive_output_withheld_from_the_stream_is_read_with_terraform_output(
    tmp_path: Path, tf_cli_config: Path
) -> None:
    outputs = _applied(
        tmp_path, tf_cli_config, 'output "token" {\n  value     = "s3cret"\n  sensitive = true\n}\n'
    )
    assert outputs["token"] == "s3cret" and outputs["nodes"]["worker-0"]["input"] == "plain"
    assert _commands(tmp_path) == ["init", "plan", "apply", "output"]

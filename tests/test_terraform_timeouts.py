"""No terraform command hangs a deploy: every one has a timeout, after which terraform is
interrupted (SIGINT, so it saves its state) and the error names the fix. Real terraform, with a
configuration whose apply sleeps (terraform_data and local-exec are built in: no provider)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlinfra import terraform
from dlinfra.errors import TerraformError
from dlinfra.terraform import Terraform

pytestmark = pytest.mark.terraform

SLOW_APPLY = """
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "sleep 600"
  }
}
"""


def test_an_apply_past_its_default_timeout_is_interrupted_and_the_error_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "main.tf").write_text(SLOW_APPLY)
    tf = Terraform(tmp_path)
    tf.init()
    tf.run(["plan", "-input=false", "-json", f"-out={tmp_path / 'slow.tfplan'}"])
    # long enough that even a loaded machine is inside the provisioner's sleep when it fires
    monkeypatch.setitem(terraform.TIMEOUTS, "apply", 20.0)
    with pytest.raises(TerraformError) as raised:
        tf.apply(tmp_path / "slow.tfplan")
    message = str(raised.value)
    assert "terraform apply did not finish in 20s (interrupted)" in message
    assert "Fix: " in message and "dlinfra destroy" in message
    # interrupted, not killed: terraform wrote its state on the way out
    assert (tmp_path / "terraform.tfstate").exists()


def test_every_command_dlinfra_runs_has_a_timeout() -> None:
    used = {"init", "plan", "show", "output", "apply", "destroy"}
    assert used <= set(terraform.TIMEOUTS)
    assert all(0 < seconds <= 3600 for seconds in terraform.TIMEOUTS.values())

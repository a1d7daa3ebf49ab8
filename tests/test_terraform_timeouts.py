"""No terraform command hangs a deploy: every one has a timeout, after which terraform is
interrupted (SIGINT, so it saves its state) and the error names the fix. Real terraform, with a
configuration whose apply sleeps (terraform_data and local-exec are built in: no provider)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
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


# The provisioner says where it sleeps, so the test knows when the apply is under way and can end
# the sleep terraform leaves behind (local-exec kills its shell, not the shell's child).
SLEEPING_APPLY = """
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "echo $$ > sleeping.pid; exec sleep 600"
  }
}
"""

# What `dlinfra deploy` does with a Ctrl-C during provisioning: the apply stops, then the teardown.
INTERRUPTED_CLI = """
import signal, sys
from pathlib import Path
from dlinfra.terraform import Terraform

signal.signal(signal.SIGINT, signal.default_int_handler)
work = Path(sys.argv[1])
tf = Terraform(work, log=lambda line: print(line, flush=True))
try:
    tf.apply(work / "slow.tfplan")
except KeyboardInterrupt:
    print("interrupted", flush=True)
    tf.destroy(work / "empty.tfvars")
    print("destroyed", flush=True)
"""


@pytest.mark.parametrize("ctrl_c", ["terminal", "kill-int"])
def test_a_cli_interrupted_mid_apply_stops_terraform_cleanly_and_the_teardown_after_it_succeeds(
    tmp_path: Path, ctrl_c: str
) -> None:
    """terminal: the whole foreground group gets SIGINT (terraform used to get it too, then the
    CLI's destroy raced the apply for the state); kill-int: only the CLI does (`kill -INT`, CI's
    timeout), and terraform used to be left running alone with nobody reading its output."""
    (tmp_path / "main.tf").write_text(SLEEPING_APPLY)
    (tmp_path / "empty.tfvars").write_text("")
    tf = Terraform(tmp_path)
    tf.init()
    tf.run(["plan", "-input=false", "-json", f"-out={tmp_path / 'slow.tfplan'}"])
    cli = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_CLI, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a shell's foreground job
    )
    sleeping = tmp_path / "sleeping.pid"
    try:
        deadline = time.monotonic() + 300
        while not sleeping.exists() or not sleeping.read_text().strip():
            assert cli.poll() is None and time.monotonic() < deadline, "the apply never reached its sleep"
            time.sleep(0.2)
        if ctrl_c == "terminal":
            os.killpg(cli.pid, signal.SIGINT)
        else:
            cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
        if sleeping.exists() and sleeping.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(sleeping.read_text()), signal.SIGKILL)
    assert cli.returncode == 0, out
    assert "stopping terraform apply (it saves its state); Ctrl-C again to kill it now" in out
    assert out.index("interrupted") < out.index("destroyed"), out
    left = [p for p in Path("/proc").glob("[0-9]*/cwd") if _points_to(p, tmp_path)]
    assert not left, f"a process still works in the run's terraform directory: {left}"
    state = json.loads((tmp_path / "terraform.tfstate").read_text())
    assert state["resources"] == [], "the teardown after the interrupt left the resource in the state"


def _points_to(link: Path, directory: Path) -> bool:
    try:
        return link.resolve() == directory.resolve()
    except OSError:  # a process that ended meanwhile, or one not ours to look at
        return False

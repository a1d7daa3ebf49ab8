"""The deploying shell's secrets stay in it (issue 55, class 2), and TensorFlow's scratch files go
with the run (class 10): one real local run of a script that prints its whole environment and lets
autograph convert a function, deployed from a shell holding fake AWS keys and a GitHub token."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from support import FAKE_CREDS

from .conftest import Deployed, deploy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Keys this run does not need (its store is a local directory): none may reach a node.
SHELL_SECRETS = {
    **FAKE_CREDS,
    "GITHUB_TOKEN": "ghp_fakeTokenForTestsOnly0000000000000000",
    "TF_VAR_db_password": "fakeTerraformVariableSecret42",
}
PROBE = """\
import os, sys, tempfile
import tensorflow as tf

@tf.function
def secrets_probe_step(x):
    if x > 0:  # control flow on a tensor: autograph converts the function, into a file of its own
        return x * 2
    return x

secrets_probe_step(tf.constant(1))
print("TEMPDIR", tempfile.gettempdir())
print(dict(os.environ))  # what a user's script does to see what it got
with open(os.path.join(os.environ["DLINFRA_MODEL_DIR"], "model.txt"), "w") as out:
    out.write("probed")
sys.stdout.flush()
os._exit(0)  # as a node stopped at the run's end does: autograph's clean-up at exit never runs
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Deployed, float]:
    tmp = tmp_path_factory.mktemp("secrets")
    (tmp / "env_probe.py").write_text(PROBE)
    (tmp / "experiment.yaml").write_text(
        "name: env-probe\nstrategy: multi_worker_mirrored\ncluster: {workers: {count: 1}}\n"
        "training: {command: [python, env_probe.py]}\n"
    )
    started = time.time()
    return deploy(tmp, str(tmp / "experiment.yaml"), env=SHELL_SECRETS), started


def test_no_shell_secret_reaches_a_node_its_log_the_run_dir_the_store_or_the_output(
    probed: tuple[Deployed, float],
) -> None:
    run, _ = probed
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    log = (run.run_dir / "logs" / "worker-0.log").read_text()
    assert "'DLINFRA_NODE': 'worker-0'" in log, "the script printed its environment"
    files = [p for p in run.home.rglob("*") if p.is_file()]  # run dir, its store, everything dlinfra keeps
    assert any(p.parts[-3:] == ("store", "logs", "worker-0.log") for p in files)
    secrets = [v for k, v in SHELL_SECRETS.items() if k != "AWS_DEFAULT_REGION"]
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret[:8]}… found in {path}"
    output = run.result.stdout + run.result.stderr
    assert not [s for s in secrets if s in output]
    leaked = [k for k in SHELL_SECRETS if f"'{k}'" in log and k != "AWS_DEFAULT_REGION"]
    assert leaked == [], "a script's environment holds no credential of the shell's"


def test_autograph_files_go_with_the_run_not_into_tmp(probed: tuple[Deployed, float]) -> None:
    run, started = probed
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    scratch = run.run_dir / "work" / "worker-0" / "tmp"
    assert f"TEMPDIR {scratch}" in (run.run_dir / "logs" / "worker-0.log").read_text()
    generated = list(scratch.glob("__autograph_generated_file*.py"))
    assert any("secrets_probe_step" in p.read_text() for p in generated), generated
    # other runs on this machine may write theirs to /tmp meanwhile: only this script's are looked for
    ours = [
        p
        for p in Path("/tmp").glob("__autograph_generated_file*.py")
        if p.stat().st_mtime >= started and "secrets_probe_step" in p.read_text(errors="replace")
    ]
    assert ours == []

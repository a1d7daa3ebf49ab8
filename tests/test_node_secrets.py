"""What a local node gets of the deploying shell, and what of a node's log others read (issue 55,
class 2): in-process, on real files and a real file store. The real run is tests/e2e/test_secrets.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlinfra.contract import StoreConfig
from dlinfra.node.beacon import Beacon
from dlinfra.node.environ import node_environ, without_aws
from dlinfra.node.status import NodeStatus, give_up
from dlinfra.runs.layout import RunStore
from dlinfra.runs.run import Run
from dlinfra.spec.model import Spec
from dlinfra.spec.training import TrainingSpec
from support import FAKE_CREDS, Cli, staging_node

SHAPELESS = "gh-not-shaped-like-any-key-4711"  # only its variable's name says it is a secret
SHELL = {
    **FAKE_CREDS,
    "GITHUB_TOKEN": SHAPELESS,
    "TF_VAR_db_password": "fakeTerraformVariableSecret42",
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LC_ALL": "C.UTF-8",
    "HTTPS_PROXY": "http://proxy.example:3128",
    "DLINFRA_HOME": "/home/u/.dlinfra",
    "WANDB_MODE": "offline",
}


def _node(tmp: Path, pass_env: list[str] | None = None, store: str | None = None):
    cfg = staging_node("chief", 0, TrainingSpec(pass_env=pass_env or []), tmp / "results", "file:///data")
    return cfg.model_copy(update={"store": StoreConfig(url=store)}) if store else cfg


def test_a_local_node_starts_from_an_allow_list_not_the_shell(tmp_path: Path) -> None:
    env = node_environ(SHELL, _node(tmp_path), tmp_path / "work")
    assert set(env) == {
        "PATH",
        "HOME",
        "LC_ALL",
        "HTTPS_PROXY",
        "DLINFRA_HOME",
        "TMPDIR",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    }
    # nor through HOME: the SDKs would find the user's ~/.aws
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == env["AWS_CONFIG_FILE"] == os.devnull
    assert env["TMPDIR"] == str(tmp_path / "work" / "tmp") and Path(env["TMPDIR"]).is_dir()
    named = node_environ(SHELL, _node(tmp_path, ["WANDB_MODE", "GITHUB_TOKEN"]), tmp_path / "work")
    assert named["WANDB_MODE"] == "offline" and named["GITHUB_TOKEN"] == SHAPELESS
    assert "AWS_ACCESS_KEY_ID" not in named


def test_the_store_credentials_reach_the_agent_not_the_script_unless_named(tmp_path: Path) -> None:
    """A node whose store is in S3 needs the shell's credentials, as an instance needs its role; the
    user's script gets them only by training.pass_env."""
    env = node_environ(SHELL, _node(tmp_path, store="s3://bucket/runs"), tmp_path / "work")
    assert {k: env[k] for k in FAKE_CREDS} == FAKE_CREDS
    assert "AWS_CONFIG_FILE" not in env  # a profile named in the shell needs its files
    script = without_aws(env, [])
    assert not [k for k in script if k in FAKE_CREDS] and script["AWS_CONFIG_FILE"] == os.devnull
    named = without_aws(env, ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
    assert named["AWS_SECRET_ACCESS_KEY"] == FAKE_CREDS["AWS_SECRET_ACCESS_KEY"]
    assert "AWS_SESSION_TOKEN" not in named and "AWS_CONFIG_FILE" not in named


@pytest.fixture
def node_with_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A node whose environment holds a shapeless token and AWS keys, and its real file store."""
    for name, value in (("GITHUB_TOKEN", SHAPELESS), *FAKE_CREDS.items()):
        monkeypatch.setenv(name, value)
    cfg = _node(tmp_path)
    store = RunStore.open(cfg.store)
    (tmp_path / "work").mkdir()
    return cfg, store, NodeStatus(store, cfg.name, cfg.role, cfg.index, tmp_path / "work")


def test_the_store_gets_a_nodes_log_masked_a_whole_line_at_a_time(tmp_path: Path, node_with_secrets) -> None:
    cfg, store, status = node_with_secrets
    log = tmp_path / "node.log"
    log.write_text(
        f"step 1\n{{'GITHUB_TOKEN': '{SHAPELESS}', 'AWS_SESSION_TOKEN': "
        f"'{FAKE_CREDS['AWS_SESSION_TOKEN']}'}}\nkey {FAKE_CREDS['AWS_ACCESS_KEY_ID']}\n"
        f"half a line: {SHAPELESS[:9]}"
    )
    beacon = Beacon(cfg, store, tmp_path / "work", log)
    beacon.publish(os.getpid(), dict(status.fields), gone=False)
    stored = "\n".join(store.log_lines(cfg.name))
    assert "step 1" in stored and "'GITHUB_TOKEN': '***'" in stored
    for secret in (SHAPELESS, FAKE_CREDS["AWS_SESSION_TOKEN"], FAKE_CREDS["AWS_ACCESS_KEY_ID"]):
        assert secret not in stored
    assert "half a line" not in stored, "a line still being written may hold half a secret"
    with open(log, "a") as out:
        out.write(f"{SHAPELESS[9:]} and on\n")
    beacon.publish(os.getpid(), dict(status.fields), gone=True)
    stored = store.log_lines(cfg.name)
    assert stored[-1] == "half a line: *** and on" and len(stored) == 4
    assert SHAPELESS in log.read_text(), "the node's own log file is the node's: only the store's is masked"


def test_a_failure_others_read_is_masked(node_with_secrets) -> None:
    cfg, store, status = node_with_secrets
    secret = FAKE_CREDS["AWS_SECRET_ACCESS_KEY"]
    give_up(cfg, store, status, f"the script printed {secret}", f"Traceback\n  token {SHAPELESS}\n", "script")
    marker = store.marker()
    assert marker is not None and marker.error == "the script printed ***"
    assert marker.traceback is not None and SHAPELESS not in marker.traceback
    assert secret not in (store.status(cfg.name).error or "")  # type: ignore[union-attr]


def test_dlinfra_logs_prints_a_local_nodes_log_masked_with_this_shells_secrets(cli: Cli, home: Path) -> None:
    """A local node's own log in the run dir is unmasked (the store's copy is not): what `logs` (and a
    failure's tail) print of it is masked with the secrets of the shell that asks."""
    run = Run.create(Spec())
    run.update_manifest(nodes=["worker-0"])
    (run.dir / "logs").mkdir()
    (run.dir / "logs" / "worker-0.log").write_text(f"step 1\nenv GITHUB_TOKEN is {SHAPELESS}\n")
    result = cli("logs", run.id, "--node", "worker-0", extra_env={"GITHUB_TOKEN": SHAPELESS}, check=True)
    assert result.stdout.splitlines() == ["step 1", "env GITHUB_TOKEN is ***"]

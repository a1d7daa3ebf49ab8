"""How one node of the local target starts: a process group of its own, booted from its config in
the run dir, in its flavor's environment, with an environment of its own (node.environ), not the
deploying shell's."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dlinfra.contract import NodeConfig
from dlinfra.node.environ import node_environ
from dlinfra.node.niceness import START_NICENESS_ENV
from dlinfra.targets import private_network

# How much nicer a serving node of a parameter-server run loads its beacon (node.niceness): the chief's
# trainer was spawned 1.0 s after the command, last of the five, with them all loading at once.
START_NICENESS = 10


@dataclass(frozen=True)
class NodeEnv:
    python: Path  # of the run's environment for a flavor
    lock_file: Path  # the lock it was made from (the node checks itself against it)
    code: Path | None = None  # the run's dlinfra, unpacked (venvs.code): first on the PYTHONPATH


def launch(
    run_dir: Path, name: str, env: NodeEnv | None, namespace: private_network.NodeNetwork | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start one node from its config in the run dir (`nodes/<name>.json`), in a process group of
    its own (teardown reaches TF's children too), its output appended to `logs/<name>.log`."""
    log = run_dir / "logs" / f"{name}.log"
    work = run_dir / "work" / name
    config = run_dir / "nodes" / f"{name}.json"
    log.parent.mkdir(parents=True, exist_ok=True)
    environ = process_environ(NodeConfig.model_validate_json(config.read_text(encoding="utf-8")), work, env)
    argv = [
        str(env.python) if env else sys.executable,
        "-m",
        "dlinfra",
        "node",
        "run",
        str(config),
        "--log-file",
        str(log),
        "--work-dir",
        str(work),
    ]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            namespace.command(name, argv) if namespace else argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            # Its own process group: a terminal's Ctrl-C reaches the CLI alone (which stops the run),
            # and a signal for the node reaches all of it. Not its own session: Linux's autogroup
            # scheduler shares the CPU between sessions first, so a session per node gave the CLI and
            # every beacon and trainer an equal share whatever each needed (a parameter-server run
            # about 4 % slower, a three-worker MWMS run 8 %; BENCHMARKS.md, "Sessions").
            process_group=0,
        )
    return process, log


def process_environ(cfg: NodeConfig, work: Path, env: NodeEnv | None) -> dict[str, str]:
    """A local node's environment: not the deploying shell's but an allow-list (node.environ), as an
    instance's is its own, and what runs it from its flavor's environment."""
    environ = node_environ(os.environ, cfg, work)
    environ |= {"PYTHONUNBUFFERED": "1"} | ({"DLINFRA_LOCK_FILE": str(env.lock_file)} if env else {})
    if env and env.code:
        environ["PYTHONPATH"] = str(env.code)
    if cfg.strategy == "parameter_server" and cfg.role != "chief":  # it only serves: the chief starts first
        environ[START_NICENESS_ENV] = str(START_NICENESS)
    return environ

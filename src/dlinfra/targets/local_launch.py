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
from dlinfra.targets import private_network


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
    # not the deploying shell's environment: an allow-list (node.environ), as an instance's is its own
    cfg = NodeConfig.model_validate_json(config.read_text(encoding="utf-8"))
    environ = node_environ(os.environ, cfg, work)
    environ |= {"PYTHONUNBUFFERED": "1"} | ({"DLINFRA_LOCK_FILE": str(env.lock_file)} if env else {})
    if env and env.code:
        environ["PYTHONPATH"] = str(env.code)
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

"""The local target: every node is an OS process on this machine, booted from its own user-data."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlinfra.render import node_config_from_user_data
from dlinfra.render.addresses import free_ports
from dlinfra.render.node_config import NodeConfig


@dataclass
class NodeProcess:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalCluster:
    """Starts, watches and tears down one process group per node.

    `remap` rewrites cluster addresses (e.g. EC2 private IPs → loopback ports) so the same
    user-data that boots an instance can boot a local process (the aws target's emulation)."""

    run_dir: Path
    remap: bool = False
    nodes: dict[str, NodeProcess] = field(default_factory=dict)

    def start(self, user_data: dict[str, str]) -> None:
        configs = {name: node_config_from_user_data(text) for name, text in user_data.items()}
        if self.remap:
            configs = _to_loopback(configs)
        nodes_dir, logs_dir = self.run_dir / "nodes", self.run_dir / "logs"
        nodes_dir.mkdir(parents=True, exist_ok=True)
        logs_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # Servers first, so the chief's peer check passes as early as possible.
        for name in sorted(configs, key=lambda n: n.startswith("chief")):
            config_path = nodes_dir / f"{name}.json"
            config_path.write_text(configs[name].model_dump_json(indent=2), encoding="utf-8")
            log = logs_dir / f"{name}.log"
            with open(log, "ab") as out:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "dlinfra",
                        "node",
                        "run",
                        str(config_path),
                        "--log-file",
                        str(log),
                        "--work-dir",
                        str(self.run_dir / "work" / name),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # own process group: teardown reaches TF's children too
                )
            self.nodes[name] = NodeProcess(name, process, log)

    def exit_codes(self) -> dict[str, int | None]:
        return {name: node.process.poll() for name, node in self.nodes.items()}

    def pids(self) -> list[int]:
        return [node.process.pid for node in self.nodes.values()]

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after `grace` seconds."""
        for node in self.nodes.values():
            _signal_group(node.process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for node in self.nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(max(0.0, deadline - time.monotonic()))
            _signal_group(node.process, signal.SIGKILL)
            node.process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _to_loopback(configs: dict[str, NodeConfig]) -> dict[str, NodeConfig]:
    addresses = sorted({a for cfg in configs.values() for addrs in cfg.cluster.values() for a in addrs})
    ports = free_ports(len(addresses))
    mapping = {addr: f"127.0.0.1:{next(ports)}" for addr in addresses}
    return {
        name: cfg.model_copy(
            update={"cluster": {job: [mapping[a] for a in addrs] for job, addrs in cfg.cluster.items()}}
        )
        for name, cfg in configs.items()
    }

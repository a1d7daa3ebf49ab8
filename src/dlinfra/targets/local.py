"""The local target: every node is an OS process on this machine, booted from its own user-data."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from dlinfra.contract import NodeConfig
from dlinfra.environment import venvs
from dlinfra.environment.lock import Index, Lock, Platform
from dlinfra.errors import DlinfraError
from dlinfra.node.supervision import is_replaced, note_restart_cause, should_restart
from dlinfra.prepare import NodeInstall, release_requirement
from dlinfra.render import AddressPlan, loopback_plan, node_config_from_user_data
from dlinfra.render.addresses import free_ports
from dlinfra.spec.pricing import HourlyCost
from dlinfra.targets import local_capacity, private_network, shaped_network
from dlinfra.targets.base import Review, TargetOptions
from dlinfra.targets.local_launch import NodeEnv, launch
from dlinfra.targets.local_machine import read_machine

if TYPE_CHECKING:
    from dlinfra.prepare import Prepared
    from dlinfra.runs.layout.controller import ControllerStore
    from dlinfra.runs.run import Run
    from dlinfra.spec.model import Spec


class LocalTarget:
    """The embedded default: every node a process group on this machine, on loopback ports."""

    name: ClassVar[str] = "local"
    uses_instance_types: ClassVar[bool] = False
    user_data_limit: ClassVar[int | None] = None
    leaves_resources: ClassVar[bool] = False
    own_machines = False  # its nodes are processes sharing this machine

    def __init__(self, options: TargetOptions):
        self.options = options
        self.network: private_network.Choice | None = None

    def addresses(self, spec: Spec) -> AddressPlan:
        network = self._network(spec)
        if network.shaped:
            return shaped_network.address_plan(spec)
        return loopback_plan(spec, private_network.FIRST_PORT if network.private else None)

    def _network(self, spec: Spec) -> private_network.Choice:
        if self.network is None:
            shaped = spec.cluster.local_network == "shaped"
            self.network = (shaped_network if shaped else private_network).choose(spec)
        return self.network

    def node_install(self, spec: Spec, pinned_wheel: Path | None = None) -> NodeInstall:
        """The nodes run in a venv made here from the run's lock, for this machine's Python."""
        from dlinfra.runs.wheel import node_wheel_started

        wheel = pinned_wheel or node_wheel_started()
        return NodeInstall(release_requirement(), wheel, Platform.here(), boots=False)

    def capacity(self, spec: Spec) -> list[str]:
        """Every node is a process of this machine: it must hold them all (local_capacity)."""
        return local_capacity.check(spec, read_machine())

    def preflight(self, spec: Spec) -> None:
        self._network(spec)

    def plan(self, prepared: Prepared) -> Review:
        network = self._network(prepared.spec)
        prepared.run.update_manifest(network=network.name)
        text = (
            f"run {prepared.run.id}: {len(prepared.user_data)} local nodes, store {prepared.store.uri()}\n"
            f"{network.why}"
        )
        return Review(text=text, markdown=text + "\n", needs_approval=False)

    def provision(self, prepared: Prepared, review: Review) -> None:
        pass

    def start(self, prepared: Prepared) -> LocalCluster:
        mirrored = prepared.spec.strategy == "multi_worker_mirrored"
        network, namespace = self._network(prepared.spec), None
        try:
            if network.shaped:
                namespace = shaped_network.network_for(prepared.spec, self.addresses(prepared.spec))
            elif network.private:
                namespace = private_network.Namespace()
        except (private_network.Unavailable, shaped_network.Unavailable) as exc:
            raise DlinfraError(f"{exc}. Fix: {private_network.NAMESPACES_OFF_FIX}") from exc
        cluster = LocalCluster(
            prepared.run.dir,
            restart_together=mirrored,
            namespace=namespace,
            record=lambda pids: prepared.run.update_manifest(pids=pids),
            environments=node_environments(prepared, self.options.log),
        )
        try:
            cluster.start(prepared.user_data)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def attach(self, prepared: Prepared) -> AttachedNodes:
        return AttachedNodes(prepared.run.id, prepared.run.manifest().pids)

    def controller(self, spec: Spec) -> ControllerStore | None:
        return None  # nothing of a local run outlives this machine's processes

    def ready_for_controller(self, run: Run) -> None:
        pass

    def wake_controller(self, spec: Spec, store: ControllerStore) -> bool:
        return False

    def teardown(self, run: Run) -> str:
        """Stop node process groups a crashed or killed `dlinfra deploy` left behind."""
        killed = 0
        for pid in run.manifest().pids.values():
            if not _is_node_of(pid, run.id):
                continue  # exited long ago; the pid may belong to someone else now
            try:
                os.killpg(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        return f"run {run.id}: {killed} leftover node process groups stopped"

    def hourly_cost(self, spec: Spec) -> HourlyCost:
        return HourlyCost(per_role=dict.fromkeys(spec.roles(), 0.0))

    def settle(
        self, spec: Spec, configs: dict[str, NodeConfig], locks: Callable[[], dict[str, str]]
    ) -> tuple[Spec, str | None]:
        return spec, None


def _is_node_of(pid: int, run_id: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "node run" in cmdline and run_id in cmdline


@dataclass
class NodeProcess:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


def node_environments(prepared: Prepared, log: Callable[[str], None]) -> dict[str, NodeEnv]:
    """Each flavor's environment of a run whose nodes are processes here, made from its lock (and
    the run's wheel) or found in the cache: what an instance's install.sh does at boot."""
    run, spec = prepared.run, prepared.spec
    manifest = run.manifest()
    index = Index.of(spec.aws.pip_index_url, spec.aws.pip_extra_ca, os.environ)
    made: dict[str, tuple[Path, Path]] = {}  # flavor → (its environment, its lock file)
    wheel = manifest.wheel
    with ThreadPoolExecutor(1) as beside:  # the run's dlinfra unpacked while the environment is made
        own = beside.submit(venvs.code, run.dir / "code" / wheel.name, wheel.sha256) if wheel else None
        for flavor, pin in manifest.environment.items():
            lock_file = run.dir / "code" / pin.file
            lock = Lock(lock_file.read_text(encoding="utf-8"), flavor)  # type: ignore[arg-type]
            t0 = time.monotonic()
            env = venvs.ensure(lock, index)
            took = time.monotonic() - t0
            how = f"made in {took:.1f}s" if took > 0.5 else "cached"
            log(f"environment ({flavor}): lock {pin.sha256[:12]}, {len(pin.packages)} packages, {how}: {env}")
            made[flavor] = (env, lock_file)
        code = own.result() if own else None
    return {flavor: NodeEnv(venvs.python_of(env), lock, code) for flavor, (env, lock) in made.items()}


@dataclass
class LocalCluster:
    """Starts, supervises and tears down one process group per node.

    The launcher is the local stand-in for systemd on EC2: a node that died of a signal or exited
    asking for a retry is started again (see node.supervision; the agent backs off and gives up).
    `restart_together`: sync all-reduce cannot go on without any one member, so under
    multi_worker_mirrored every node restarts when one does (TF's documented recovery).
    `remap` rewrites cluster addresses (e.g. EC2 private IPs → loopback ports) so the same
    user-data that boots an instance can boot a local process (the aws target's emulation).
    `record` gets the node pids whenever they change (start, restart), so the manifest never names
    a process group that is gone while its replacement runs unknown to `dlinfra destroy`.
    `replace_interrupted`: a node that left for a spot notice is started again as its replacement
    would be; off where the processes stand in for instances, whose watcher replaces them."""

    run_dir: Path
    remap: bool = False
    restart_together: bool = False
    namespace: private_network.NodeNetwork | None = None
    record: Callable[[dict[str, int]], object] = lambda pids: None
    replace_interrupted: bool = True
    environments: dict[str, NodeEnv] = field(default_factory=dict)  # flavor → where its nodes run
    nodes: dict[str, NodeProcess] = field(default_factory=dict)
    _flavors: dict[str, str] = field(default_factory=dict)
    _loopback: dict[str, str] = field(default_factory=dict)

    def start(self, user_data: dict[str, str]) -> None:
        configs = {name: node_config_from_user_data(text) for name, text in user_data.items()}
        if self.remap:
            configs = self._to_loopback(configs)
        (self.run_dir / "nodes").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        # The chief first: it loads all of TensorFlow and Keras while the ps-strategy servers load
        # only their gRPC server (node.serving), so its load is the way to the first step.
        for name in sorted(configs, key=lambda n: not n.startswith("chief")):
            config_path = self.run_dir / "nodes" / f"{name}.json"
            config_path.write_text(configs[name].model_dump_json(indent=2), encoding="utf-8")
            self._flavors[name] = configs[name].flavor
            self._launch(name)
        self.record(self.pids())

    def replace(self, name: str, user_data: str) -> None:
        """Boot a node again from (new) user-data: what a replaced instance does."""
        self.kill(name)
        self.start({name: user_data})

    def kill(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is not None and node.process.poll() is None:
            _signal_group(node.process.pid, signal.SIGKILL)
            node.process.wait()

    def _launch(self, name: str) -> None:
        env = self.environments.get(self._flavors.get(name, "cpu"))
        process, log = launch(self.run_dir, name, env, self.namespace)
        self.nodes[name] = NodeProcess(name, process, log)

    def exit_codes(self) -> dict[str, int | None]:
        return {name: node.process.poll() for name, node in self.nodes.items()}

    def poll(self, skip: Collection[str] = ()) -> dict[str, int | None]:
        """Restart what should be restarted; report the exit codes of the rest (None: running).
        `skip`: nodes whose instance is being replaced (a heal): not restarted in place."""
        codes = self.exit_codes()
        broken = sorted(
            name
            for name, code in codes.items()
            if name not in skip and (should_restart(code) or (self.replace_interrupted and is_replaced(code)))
        )
        if not broken:
            return codes
        for name in broken:  # the supervisor's own account, beside the node's (a test reads it)
            with open(self.nodes[name].log, "a", encoding="utf-8") as log:
                then = "starting its replacement" if is_replaced(codes[name]) else "restarting it"
                log.write(f"launcher: {name} exited with code {codes[name]}: {then}\n")
        together = [n for n, c in codes.items() if (c is None or n in broken) and n not in skip]
        again = together if self.restart_together else broken
        for name in again:
            if name not in broken:  # healthy, ended so that its cluster restarts whole: its next life says so
                note_restart_cause(
                    self.run_dir / "work" / name, f"restarted with the cluster after {broken[0]}"
                )
            self.kill(name)
        for name in sorted(again, key=lambda n: n.startswith("chief")):
            self._launch(name)
        self.record(self.pids())
        # the codes this poll acted on, not a second read: a node that exits meanwhile (a chief
        # leaving with 75 as its ps was restarted) would be reported unrestarted, and judged crashed
        return {name: None if name in again else code for name, code in codes.items()}

    def pids(self) -> dict[str, int]:
        return {name: node.process.pid for name, node in self.nodes.items()}

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after `grace` seconds."""
        for node in self.nodes.values():
            _signal_group(node.process.pid, signal.SIGTERM)
            _signal_group(node.process.pid, signal.SIGCONT)  # a stopped process must see the TERM
        deadline = time.monotonic() + grace
        for node in self.nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(max(0.0, deadline - time.monotonic()))
            _signal_group(node.process.pid, signal.SIGKILL)
            node.process.wait()
        if self.namespace is not None:
            self.namespace.close()

    def _to_loopback(self, configs: dict[str, NodeConfig]) -> dict[str, NodeConfig]:
        """Same private IP, same loopback port: a replaced instance rejoins at its old address."""
        addresses = {a for cfg in configs.values() for addrs in cfg.peers.values() for a in addrs}
        addresses |= {cfg.dispatcher for cfg in configs.values() if cfg.dispatcher}
        new = [a for a in sorted(addresses) if a not in self._loopback]
        ports = free_ports(len(new))
        self._loopback.update({addr: f"127.0.0.1:{next(ports)}" for addr in new})
        return {
            name: cfg.model_copy(
                update={
                    "cluster": {job: [self._loopback[a] for a in addrs] for job, addrs in cfg.peers.items()},
                    "dispatcher": cfg.dispatcher and self._loopback[cfg.dispatcher],
                    # one host: each link sink takes a free port and says which in its record
                    "preflight": cfg.preflight and cfg.preflight.model_copy(update={"port": 0}),
                }
            )
            for name, cfg in configs.items()
        }


@dataclass
class AttachedNodes:
    """The node process groups of a detached run, found again by their pids. They are not this
    process's children: there are no exit codes to read (a node that is gone reads as 0, and the
    store says how it ended) and nothing to restart; a node that dies goes silent and is lost.
    With `run_dir` (emulated instances: whoever owns the run boots the instances it creates), a
    replaced instance's node is started again from its recorded config, at its old address."""

    run_id: str
    pids: dict[str, int]
    run_dir: Path | None = None
    environments: Callable[[], dict[str, NodeEnv]] = dict
    record: Callable[[dict[str, int]], object] = lambda pids: None
    _started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def exit_codes(self) -> dict[str, int | None]:
        return {
            name: self._started[name].poll()
            if name in self._started
            else (None if _is_node_of(pid, self.run_id) else 0)
            for name, pid in self.pids.items()
        }

    def poll(self) -> dict[str, int | None]:
        return self.exit_codes()

    def kill(self, name: str) -> None:
        if _is_node_of(self.pids[name], self.run_id):
            _signal_group(self.pids[name], signal.SIGKILL)

    def replace(self, name: str, user_data: str) -> None:
        """Boot a replaced instance's node again (the same user-data: a heal re-applies the run's)."""
        if self.run_dir is None:
            raise DlinfraError(f"{name}: an emulated instance of a detached run cannot be booted again here")
        self.kill(name)
        flavor = node_config_from_user_data(user_data).flavor
        process, _ = launch(self.run_dir, name, self.environments().get(flavor))
        self._started[name] = process
        self.pids[name] = process.pid
        self.record(dict(self.pids))

    def stop(self, grace: float = 10.0) -> None:
        alive = [pid for pid in self.pids.values() if _is_node_of(pid, self.run_id)]
        for pid in alive:
            _signal_group(pid, signal.SIGTERM)
            _signal_group(pid, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_is_node_of(pid, self.run_id) for pid in alive):
            time.sleep(0.2)
        for pid in alive:
            if _is_node_of(pid, self.run_id):
                _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


TARGET = LocalTarget

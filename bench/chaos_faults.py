"""How the chaos soak (bench_chaos.py) injects each fault of chaos_plan.KINDS into a live run: node
processes found through the run dir's state files (what every node's trainer writes, emulated
instances included), the S3 endpoint and EC2 API of the soak's own moto server, the loopback
metadata stand-in for spot notices."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from chaos_plan import Fault

from dlinfra.node.status import read_state, state_file

RESTORE_WAIT = 120.0  # for the new life of a killed node
SAVE_WAIT = 60.0  # for the next checkpoint of a node before it is killed anyway
LIVE_WAIT = 60.0  # for a node's current life to be up before a fault on it is given up


def state(run_dir: Path, node: str) -> dict[str, Any]:
    """The node's state file, as the node agent writes it (its own reader)."""
    return read_state(state_file(run_dir / "work" / node)) or {}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    """The trainer and what it started (its own process group), as the launcher's kill does."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    except PermissionError:
        os.kill(pid, sig)


class Injector:
    def __init__(self, run_dir: Path, moto: Any, imds: Any, endpoint: str) -> None:
        self.run_dir, self.moto, self.imds, self.endpoint = run_dir, moto, imds, endpoint
        self.threads: list[threading.Thread] = []
        self.ended = threading.Event()  # the deploy exited: a fault still waiting for its moment gives up

    def inject(self, fault: Fault) -> None:
        """On a thread of its own: a fault that waits for its moment (a save, a new life, a heal's
        replacement) holds up neither the run's watch nor a fault due at the same time. A fault on a
        node's life restamps `injected_at` as it lands: a new life may take seconds to be up (its
        beacon's start waits out a store outage), and the checks time what follows from the landing
        (seed 1113: a notice stamped 5 s before it reached a life that was killed 60 ms after)."""
        fault.injected_at = time.time()
        thread = threading.Thread(target=getattr(self, f"_{fault.kind}"), args=(fault,), daemon=True)
        thread.start()
        self.threads.append(thread)

    def settle(self) -> None:
        """Every timed fault over (thawed, the store back, the link up) before the run is judged."""
        self.ended.set()
        for thread in self.threads:
            thread.join()

    def _later(self, seconds: float, action: Any) -> None:
        def run() -> None:
            time.sleep(seconds)
            action()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _pid(self, node: str | None, wait: float = LIVE_WAIT) -> int | None:
        """The node's process of its current life, once alive: a node killed a moment ago is not
        killed twice (its state file names the dead one until its next life is up)."""
        deadline = time.monotonic() + wait
        while True:
            pid = state(self.run_dir, node or "").get("pid")
            if pid and _alive(int(pid)):
                return int(pid)
            if time.monotonic() > deadline or self.ended.is_set():
                return None
            time.sleep(0.05)

    def _kill9(self, fault: Fault) -> None:
        pid = self._pid(fault.node)
        if pid is None:
            fault.note += "not up within 60 s: nothing killed"
            fault.injected_at = None
            return
        fault.injected_at = time.time()
        _signal(pid, signal.SIGKILL)
        fault.note = f"pid {pid}"

    def _freeze(self, fault: Fault) -> None:
        pid = self._pid(fault.node)
        if pid is None:
            fault.injected_at, fault.note = None, "not up: nothing to freeze"
            return
        fault.injected_at = time.time()
        _signal(pid, signal.SIGSTOP)
        self._later(fault.seconds, lambda: _signal(pid, signal.SIGCONT))
        fault.note = f"pid {pid}"

    def _kill_in_save(self, fault: Fault) -> None:
        """Killed as the node's next checkpoint file appears in its work dir, or in the run's shared
        $DLINFRA_CHECKPOINT_DIR a script saves to (node.script_dirs: all 7 such kills of
        the soak's script runs saw no save before): its save under way, its upload not begun or not done."""
        places = [self.run_dir / "work" / (fault.node or ""), self.run_dir / "work" / "checkpoints"]

        def saves() -> set[Path]:
            return {p for place in places for p in place.rglob("*") if "ckpt" in p.name}

        seen = saves()
        deadline = time.monotonic() + SAVE_WAIT
        while time.monotonic() < deadline and not self.ended.is_set():
            new = sorted(saves() - seen)
            if new:
                fault.note = f"as {new[0].name} appeared; "
                break
            time.sleep(0.02)
        else:
            fault.note = "no save within 60 s: killed anyway; "
        self._kill9(fault)

    def _kill_in_restore(self, fault: Fault) -> None:
        """Killed, then its next life killed as soon as it is up (restoring its checkpoint): a new life
        is a new `started` in its state file (the pid there may be the agent's or its trainer's)."""
        life = state(self.run_dir, fault.node or "").get("started")
        self._kill9(fault)
        if fault.injected_at is None:
            return
        deadline = time.monotonic() + RESTORE_WAIT
        while time.monotonic() < deadline and not self.ended.is_set():
            now = state(self.run_dir, fault.node or "")
            if now.get("started") != life and now.get("pid") and _alive(int(now["pid"])):
                _signal(int(now["pid"]), signal.SIGKILL)
                fault.note += f", then its new life {now['pid']} ({now.get('state')})"
                return
            time.sleep(0.02)
        fault.note += ", no new life within 120 s"

    def _spot(self, fault: Fault) -> None:
        """To the node's current life: its beacon's session, once it asked for one."""
        if self._pid(fault.node) is None:
            fault.injected_at, fault.note = None, "not up: no instance to notify"
            return
        # the beacon asks for its token as it spawns the trainer, before the trainer's own start
        now = state(self.run_dir, fault.node or "")
        life = float((now.get("phases") or {}).get("spawned") or now.get("started") or 0.0)
        try:
            fault.injected_at = self.imds.interrupt(fault.node, since=life, timeout=LIVE_WAIT)
        except AssertionError:
            fault.injected_at, fault.note = None, "its life asked for no metadata token"

    def _store_outage(self, fault: Fault) -> None:
        self.moto.outage(fault.seconds)
        self.threads.append(self.moto.back)

    def _netcut(self, fault: Fault) -> None:
        pid = self._pid(fault.node)
        if pid is None:
            fault.injected_at, fault.note = None, "not up: no link to cut"
            return

        # The namespace, held open by this soak: the node's process may die while the link is down
        # (a kill, a restart with its cluster), and its next life lives on in the same namespace.
        # Entered by the dead pid, the link stayed down for good (seed 403: the cluster then waited
        # in its startup at every life, the verdict due only at stall_timeout).
        namespace = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)

        def link(updown: str) -> None:
            done = subprocess.run(
                ["nsenter", f"--net=/proc/self/fd/{namespace}", "ip", "link", "set", "eth0", updown],
                check=False, capture_output=True, text=True, pass_fds=(namespace,),
            )  # fmt: skip
            if done.returncode != 0:
                fault.note += f"; link {updown} failed: {done.stderr.strip()}"

        def up() -> None:
            link("up")
            os.close(namespace)

        fault.injected_at = time.time()
        link("down")
        self._later(fault.seconds, up)

    def _instance(self, node: str | None) -> str | None:
        manifest = json.loads((self.run_dir / "manifest.json").read_text())
        return (manifest.get("instances") or {}).get(node)

    def _terminate(self, fault: Fault) -> None:
        instance = self._instance(fault.node)
        if instance is None:
            fault.injected_at, fault.note = None, "no instance"
            return
        self.moto.ec2().terminate_instances(InstanceIds=[instance])
        fault.note = instance

    def _heal_cut(self, fault: Fault) -> None:
        """Terminated, then the replacement its heal launched terminated too, as soon as it is in."""
        self._terminate(fault)
        if fault.injected_at is None:
            return
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not self.ended.is_set():
            now = self._instance(fault.node)
            if now and now != fault.note:
                self.moto.ec2().terminate_instances(InstanceIds=[now])
                fault.note += f", then its replacement {now}"
                return
            time.sleep(0.2)
        waited = "before the run ended" if self.ended.is_set() else "within 600 s"
        fault.note += f", no replacement {waited}"

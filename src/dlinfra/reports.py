"""Read-only views of recorded runs (status, logs, list, details) and their teardown."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dlinfra.deploy import node_log, run_store
from dlinfra.node.status import run_marker
from dlinfra.run import Run, list_runs


def run_status(run_id: str | None) -> dict[str, Any]:
    run = Run.open(run_id)
    manifest = run.manifest()
    store = run_store(run)
    now = time.time()
    nodes = {}
    for name in manifest.get("nodes", []):
        st = store.get_json(f"status/{name}.json")
        if st is not None:
            st["heartbeat_age"] = round(now - st["heartbeat"], 1)
        nodes[name] = st
    marker = run_marker(store)
    return {"run_id": run.id, "status": marker[0] if marker else manifest.get("status"), "nodes": nodes}


def follow_logs(run_id: str, node: str | None, follow: bool) -> Iterator[str]:
    run = Run.open(run_id)
    store = run_store(run)
    names = [node] if node else run.manifest().get("nodes", [])
    seen = dict.fromkeys(names, 0)
    while True:
        for name in names:
            lines = node_log(run, store, name)
            for line in lines[seen[name] :]:
                yield line if node else f"{name} | {line}"
            seen[name] = len(lines)
        if not follow or run_marker(store) is not None:
            return
        time.sleep(1)


def _age(created: str | None) -> str:
    if not created:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(created)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def list_run_rows() -> list[dict[str, Any]]:
    rows = []
    for run in list_runs():
        m = run.manifest()
        rows.append(
            {
                "run_id": run.id,
                "status": m.get("status"),
                "age": _age(m.get("created")),
                "created": m.get("created"),
                "target": m.get("target"),
                "strategy": m.get("strategy"),
                "eval_accuracy": (m.get("metrics") or {}).get("eval_accuracy"),
            }
        )
    return rows


def run_details(run_id: str | None) -> dict[str, Any]:
    run = Run.open(run_id)
    manifest = run.manifest()
    store = run_store(run)
    metrics = store.get_json("metrics.json") or {}
    metrics.pop("examples_per_sec_series", None)  # long series: `compare --plot` draws them
    metrics.pop("loss_series", None)
    return {
        "run_id": run.id,
        "status": manifest.get("status"),
        "run_dir": str(run.dir),
        "store": store.uri(),
        "model": store.uri("model") if metrics else None,
        "tensorboard": store.uri("tensorboard"),
        "tensorboard_command": f"tensorboard --logdir {store.uri('tensorboard').removeprefix('file://')}"
        if store.uri().startswith("file://")
        else f"aws s3 sync {store.uri('tensorboard')} tb/ && tensorboard --logdir tb/",
        "metrics": metrics,
        "manifest": manifest,
    }


def destroy_run(run_id: str) -> str:
    run = Run.open(run_id)
    manifest = run.manifest()
    if manifest.get("target") == "aws":
        from dlinfra.targets.aws import destroy

        return destroy(run)
    killed = 0
    for pid in manifest.get("pids", []):
        if not _is_node_of(pid, run.id):
            continue  # exited long ago; the pid may belong to someone else now
        try:
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return f"run {run.id}: {killed} leftover node process groups stopped"


def _is_node_of(pid: int, run_id: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "node run" in cmdline and run_id in cmdline

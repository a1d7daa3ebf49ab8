"""Recorded runs made without training, for `dlinfra report`'s tests and bench/bench_report.py: every
record is written through the run's own layout (Run.create, RunStore.put_status, put_metrics,
put_checkpoint, put_preflight, write_marker), so the page reads them as it reads a real run's.
Call with $DLINFRA_HOME pointing at a scratch home."""

from __future__ import annotations

import time

from dlinfra.runs.manifest import EnvironmentPin
from dlinfra.runs.preflight import NodeFigures, Verdict
from dlinfra.runs.records import Incident, MeanSd, Metrics, NodeState, Restart
from dlinfra.runs.run import Run, utc_now
from dlinfra.spec.model import Spec

LOG_EVERY = 10


def recorded_run(
    *,
    workers: int = 6,
    steps: int = 1000,
    seconds: float = 300.0,
    ended: str = "DONE",
    restart: tuple[str, float] | None = ("worker-1", 0.4),
    error: str = "killed by signal 9",
    traceback: str | None = None,
    log_lines: list[str] | None = None,
    script: bool = False,
    paused: tuple[str, float, float] | None = ("worker-3", 0.6, 8.0),
) -> tuple[Run, Restart | None]:
    """A parameter-server run of a chief, `workers` workers and one ps over `seconds`, logging every
    LOG_EVERY steps; `restart`: (node, fraction of the run) killed and restarted there. The run ends
    `ended` (DONE, FAILED on the ps with `error`, or STOPPED); `paused`: (node, fraction, seconds) its
    trainer stopped and thawed there, a fault it lived through. Returns it and its restart record."""
    spec = Spec.model_validate({"cluster": {"workers": {"count": workers}}})
    run = Run.create(spec)
    now = time.time()
    t0 = now - seconds  # the command's start; the run ends about now (the checkpoint's pointer is now)
    nodes = ["chief-0", *(f"worker-{i}" for i in range(workers)), "ps-0"]
    store = run.store()
    first_step = t0 + 6.0
    restarted = None
    if restart:
        at = t0 + seconds * restart[1]
        restarted = Restart(
            node=restart[0], life=2, cause="killed by signal 9", failed_at=at, restarted_at=at + 1.5,
            checkpoint_step=int(steps * restart[1]) // 100 * 100, resumed_at=at + 6.0,
        )  # fmt: skip
    for i, name in enumerate(nodes):
        role, index = name.rsplit("-", 1)
        spawned = t0 + 0.5 + 0.1 * i
        history = [restarted] if restarted and restarted.node == name else []
        lived = []
        if paused and paused[0] == name:
            lived = [Incident(node=name, kind="paused", at=t0 + seconds * paused[1], seconds=paused[2])]
        store.put_status(
            NodeState(
                node=name, role=role, index=int(index), state="done" if ended == "DONE" else ended.lower(),
                step=steps, total_steps=steps, loss=0.05, examples_per_sec=500.0, input_wait=0.02 + 0.01 * i,
                restarts=len(history), restart_history=history, incidents=lived, started=spawned,
                first_started=spawned,
                heartbeat=now - 1.0, host="127.0.0.1", pid=1000 + i,
                phases={"spawned": spawned, "up": spawned + 0.5, "tensorflow": spawned + 3.5,
                        "peers": t0 + 4.6, "program": t0 + 4.8, "first step": first_step},
            )
        )  # fmt: skip
        store.put_preflight(
            1,
            NodeFigures(
                node=name, role=role, flavor="cpu", machine="boot-id", sink="127.0.0.1:1", measured=True,
                done=True, figures={"gemm_gflops": 40.0 - (15.0 if name == "worker-2" else 0.0) + i * 0.1},
            ),
        )  # fmt: skip
    store.put_preflight(1, Verdict(round=1, action="train", min_ratio=0.5, checks="gemm", seconds=2.0))
    count = steps // LOG_EVERY
    series = [
        (first_step + (now - first_step) * k / count, k * LOG_EVERY, 480.0 + k % 7)
        for k in range(1, count + 1)
    ]
    losses = [(k * LOG_EVERY, 2.3 / (1 + k / 10)) for k in range(1, count + 1)]
    if ended == "DONE":
        store.put_metrics(
            Metrics(
                mode="script" if script else "program", command=["python", "train.py"] if script else None,
                strategy="parameter_server", workers=workers, ps=1, steps=steps, total_steps=steps,
                train_seconds=now - first_step, first_step_at=first_step, finished_at=now - 0.5,
                global_steps_per_sec=MeanSd(mean=3.4, sd=0.2), examples_per_sec=MeanSd(mean=483.0, sd=2.0),
                input_wait=0.03, examples_per_sec_series=series, loss_series=losses, final_loss=losses[-1][1],
                model_uri=f"{store.uri()}/model", eval_accuracy=0.97,
                restarts=[restarted] if restarted else [],
            )
        )  # fmt: skip
    _checkpoint(run, steps)
    if log_lines is not None:
        (run.dir / "logs").mkdir(exist_ok=True)
        (run.dir / "logs" / "ps-0.log").write_text("\n".join(log_lines) + "\n")
    if ended == "FAILED":
        store.write_marker("FAILED", node="ps-0", verdict="crashed", error=error, traceback=traceback)
    else:
        store.write_marker(ended, step=steps, eval_accuracy=0.97 if ended == "DONE" else None)
    run.update_manifest(
        status=ended, nodes=nodes, command_started=t0, started=utc_now(t0 + 0.4), finished=utc_now(now),
        environment={"cpu": EnvironmentPin(
            file="env-cpu.lock", sha256="ab" * 32, uri="file:///lock", platform="Python 3.11 on linux/x86_64",
            index="https://pypi.org/simple", packages={"tensorflow-cpu": "2.21.0", "numpy": "2.1.3"},
        )},
    )  # fmt: skip
    return run, restarted


def _checkpoint(run: Run, step: int) -> None:
    scratch = run.dir / "ckpt-scratch"
    scratch.mkdir()
    (scratch / f"ckpt-{step}.index").write_bytes(b"index")
    run.store().put_checkpoint(step, scratch)

"""How a script-mode node's life ends: the owner's success (its model, metrics and DONE marker),
a crash its beacon restarts, or a failure with its verdict."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from dlinfra.contract import EXIT_DONE, EXIT_RETRY, NodeConfig
from dlinfra.node import model_check, spot
from dlinfra.node.directory_sync import DirectorySync
from dlinfra.node.membership import stay_until_the_run_ends
from dlinfra.node.script_dirs import MODEL_DIR, ScriptDirs
from dlinfra.node.script_log import TAIL_LINES, last_error, log_tail, tail_text
from dlinfra.node.script_progress import ScriptProgress
from dlinfra.node.status import NodeStatus, give_up, run_nodes
from dlinfra.node.supervision import TRANSIENT_TF_ERRORS
from dlinfra.runs import restarts
from dlinfra.runs.layout import SCRIPT_CHECKPOINTS, RunStore
from dlinfra.runs.local_files import OutputsTooBig, regular_files
from dlinfra.runs.records import NO_MODEL, NO_MODEL_SAVED, Metrics


def lost_a_peer(tail: list[str]) -> bool:
    """The script ended on TensorFlow's word that a peer went away: the exception its last traceback
    ends with, or its last lines (bench_chaos seed 401: a coordinator's UnavailableError after a ps was
    killed, then 159 lines of TensorFlow's exit log, was failed as the script's own error)."""
    said = [last_error(tail).split("\n", 1)[0], *tail[-TAIL_LINES:]]
    return any(name in line for line in said for name in TRANSIENT_TF_ERRORS)


def ended(
    cfg: NodeConfig,
    store: RunStore,
    status: NodeStatus,
    exit_code: int,
    progress: ScriptProgress,
    log_file: Path | None,
) -> int:
    """A script that ended other than as the owner's success: done, restarted or failed."""
    if exit_code < 0:  # killed (kill -9, the OOM killer): a crash its supervisor restarts
        print(f"the script was killed by signal {-exit_code}: exiting for a restart", flush=True)
        status.stop(state="script killed", error=f"killed by signal {-exit_code}")
        return EXIT_RETRY
    tail = log_tail(log_file)
    if exit_code != 0:
        if lost_a_peer(tail):
            print(
                "the script lost a peer (TensorFlow's UnavailableError and kin): exiting for a restart",
                flush=True,
            )
            status.stop(state="lost peer", error=last_error(tail))
            return EXIT_RETRY
        return give_up(
            cfg,
            store,
            status,
            f"the script exited with code {exit_code} on {cfg.name}: {last_error(tail)}",
            tail_text(tail),
            verdict="script",
        )
    # the script is gone: a stop request (teardown, a spot notice) ends the stay at once, as it ends a
    # Program-mode node (script.run held the signals for the script's sake)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    return stay_until_the_run_ends(cfg, store, status, step=progress.last_step or 0)


def alone(cfg: NodeConfig, store: RunStore, status: NodeStatus, dirs: ScriptDirs, ran: float | None) -> int:
    """The owner's script never served on its TF_CONFIG address: it trains alone, as every node does.
    `ran`: the seconds after which it was stopped for it (script.ALONE_AFTER), None if it exited 0.
    What it wrote into its model directory is kept, as the run's only output, named with the verdict."""
    kept = "it wrote no model"
    if regular_files(dirs.model, MODEL_DIR).files:
        try:
            uri = store.put_model(dirs.model, cfg.training.outputs_max_gb)
            kept = f"what it wrote into {MODEL_DIR} is kept at {uri}"
        except OutputsTooBig as exc:
            kept = f"what it wrote into {MODEL_DIR} was not kept: {exc}"
    did = "exited 0" if ran is None else f"ran {ran:.0f}s, training,"
    return give_up(
        cfg,
        store,
        status,
        f"the script on {cfg.name} {did} without ever serving on its TF_CONFIG address "
        f"{cfg.address}: it ignored TF_CONFIG and trained alone, as every node did ({kept}). Fix: build "
        "the strategy from TF_CONFIG, e.g. tf.distribute.MultiWorkerMirroredStrategy() or "
        "ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())",
        "",
        verdict="alone",
    )


def finish(
    cfg: NodeConfig,
    store: RunStore,
    status: NodeStatus,
    dirs: ScriptDirs,
    progress: ScriptProgress,
    syncs: tuple[DirectorySync, DirectorySync],
    took: float,
) -> int:
    """The owner's script exited 0: its model, metrics and the DONE marker, or why there are none."""
    checkpoints, tensorboard = syncs
    status.update(state="exporting")
    found = model_check.check(dirs.model)
    refused: list[str] = []
    try:  # a model or not, what the script left there is kept, as SageMaker and Vertex keep it
        model_uri = store.put_model(dirs.model, cfg.training.outputs_max_gb, refused)
    except OutputsTooBig as exc:
        return give_up(cfg, store, status, f"on {cfg.name}: {exc}", "", verdict="outputs")
    for line in refused:
        print(line, flush=True)
    scalars = {k: v for k, v in progress.scalars.items() if v is not None}
    metrics = Metrics(
        mode="script",
        command=cfg.training.command,
        progress=progress.source,
        eval_accuracy=scalars.get("eval_accuracy"),
        steps=progress.last_step,
        scalars=scalars,
        strategy=cfg.strategy,
        workers=cfg.num_workers,
        ps=len(cfg.peers.get("ps", [])),
        train_seconds=took,
        first_step_at=progress.first_step_at,
        finished_at=time.time(),
        examples_per_sec_series=progress.series,
        loss_series=progress.losses,
        final_loss=scalars.get("loss"),
        model_uri=model_uri,
        checkpoint=store.synced_uri(SCRIPT_CHECKPOINTS) if checkpoints.files else None,
        models=found.models,
        no_model=found.why_none,
        latest_checkpoint=model_check.latest_checkpoint(dirs.checkpoint) if checkpoints.files else None,
        outputs_refused=[*refused, *checkpoints.refused, *tensorboard.refused],
        **(spot.recorded(store) if cfg.spot_in_cluster else {}),  # a script's run meets notices too
        restarts=restarts.of_nodes(run_nodes(cfg, store, status).values()),
    )
    store.put_metrics(metrics)  # what it trained, whether or not the run is DONE
    if found.why_none is not None and cfg.training.require_model:
        return give_up(
            cfg,
            store,
            status,
            f"the script on {cfg.name} exited 0 but saved no model TensorFlow can load into {MODEL_DIR} "
            f"({found.why_none}), and training.require_model is true. Fix: save it there, e.g. "
            f"model.save(os.path.join(os.environ['{MODEL_DIR}'], 'model.keras')) or "
            f"tf.saved_model.save(model, os.environ['{MODEL_DIR}']); {metrics.left_instead()}",
            "",
            verdict=NO_MODEL,
        )
    store.write_marker(
        "DONE",
        node=cfg.name,
        step=progress.last_step,
        eval_accuracy=metrics.eval_accuracy,
        reason=None if found.why_none is None else NO_MODEL_SAVED,
        restarts=metrics.restarts,
    )
    status.stop(state="done", step=progress.last_step or 0)
    if found.why_none is None:
        print(f"done: the script exited 0, model ({', '.join(found.models)}) at {model_uri}", flush=True)
    else:
        print(
            f"done: the script exited 0, {NO_MODEL_SAVED} ({found.why_none}); {metrics.left_instead()}",
            flush=True,
        )
    return EXIT_DONE

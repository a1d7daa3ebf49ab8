"""The trainer of a node (a fork of its beacon: node.trainer_process): join the cluster, train or
serve, report, leave results, exit."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from dlinfra.contract import EXIT_DONE, EXIT_RETRY, WORKER_INDEX_FILE, NodeConfig, tf_config
from dlinfra.environment.installed import check, node_versions
from dlinfra.node import devices, preflight, serving, spot, watchdog
from dlinfra.node.checkpoints import CheckpointSync
from dlinfra.node.instance_store import OWN_MACHINE_ENV, stage_on_instance_store
from dlinfra.node.membership import stay_until_the_run_ends, until_the_run_ends
from dlinfra.node.peers import bounded, wait_for_peers
from dlinfra.node.reporting import Progress, mean_sd
from dlinfra.node.status import NodeStatus, give_up, run_nodes
from dlinfra.node.supervision import backoff_seconds, is_transient
from dlinfra.runs import bundle, restarts
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import Metrics
from dlinfra.training import node_data, staging
from dlinfra.training.objective import ProgramError, hint
from dlinfra.training.shards import ShardManifest
from dlinfra.training.staging import DataError
from dlinfra.training.streaming import Stream

_KEPT: list[Any] = []  # servers that live as long as this process


def run(config_path: Path, log_file: Path | None = None, work_dir: Path | None = None) -> int:
    """One life of a node; the exit code tells its supervisor what to do next (see supervision)."""
    if log_file is not None:
        _redirect_output(log_file)
    cfg = NodeConfig.model_validate_json(config_path.read_text(encoding="utf-8"))
    work = (work_dir or cfg.default_work_dir()).absolute()
    work.mkdir(parents=True, exist_ok=True)
    # Staged data is read by a path relative to here, the same string on every node (see staging).
    os.chdir(work)
    store = RunStore.open(cfg.store)
    status = NodeStatus(store, cfg.name, cfg.role, cfg.index, work)
    os.environ["TF_CONFIG"] = json.dumps(tf_config(cfg.peers, cfg.role, cfg.index))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    visible = devices.limit_visible_gpus(cfg)  # before TensorFlow loads
    life = f"life {status.restarts + 1}" if status.restarts else "first life"
    print(
        f"dlinfra node {cfg.name} of run {cfg.run_id}: {cfg.strategy}, pid {os.getpid()}, {life}", flush=True
    )
    if (marker := store.marker()) is not None:  # restarted after the run ended: nothing to rejoin
        status.stop(state=marker.marker.lower())
        return EXIT_DONE
    if status.restarts > cfg.max_restarts:
        return give_up(cfg, store, status, f"restarted {status.restarts} times (max_restarts)", "")
    watchdog.start(cfg, store, status, work)
    if delay := backoff_seconds(status.restarts):
        status.update(state=f"restarting in {delay:.0f}s")
        time.sleep(delay)
    stream: Stream | None = None
    try:
        if cfg.lock_sha256 and (problem := _off_lock(cfg, status)):
            return give_up(cfg, store, status, problem, "", verdict="environment")
        own_disk = os.environ.get(OWN_MACHINE_ENV) == "1" and staging.stages(cfg)
        if own_disk and (line := stage_on_instance_store(work / staging.SHARDS_DIR)):
            print(line, flush=True)
        # Before serving: a parameter-server worker's pipeline lists its files as soon as it is up.
        staged = node_data.stage_node(cfg, store, work, lambda: status.update(state="staging data"))
        packed = staged.manifest if staged else None
        stream = staged.stream if staged else None
        if cfg.training.command:  # the user's own program: no TensorFlow of ours in this process
            from dlinfra.node import script

            return script.run(cfg, store, status, work, log_file)
        serves = cfg.strategy == "parameter_server" and cfg.role != "chief"
        if serves and cfg.gpus == 0:  # nothing to check on a CPU node that only serves: see serving
            if (code := preflight.run(cfg, store, status)) is not None:
                return code
            return _serve(cfg, store, status, devices.inter_op_threads(), lean=True)
        found = devices.probe()
        status.mark("tensorflow")
        threads = devices.size_thread_pools()
        status.update(devices=found.names)
        pools = f", inter-op threads {threads}" if threads else ""
        print(f"devices: {', '.join(found.names)} (CUDA_VISIBLE_DEVICES={visible!r}{pools})", flush=True)
        if problem := devices.shortfall(cfg, found, visible):
            return give_up(cfg, store, status, problem, "", verdict="devices")
        if serves:
            if (code := preflight.run(cfg, store, status)) is not None:
                return code
            return _serve(cfg, store, status, threads, lean=False)
        return _train(cfg, store, status, work, packed)
    except ProgramError as exc:  # refused before it trained: the message names what to set
        return give_up(cfg, store, status, f"the program: {exc}", "", verdict="program")
    except DataError as exc:  # the packed data is not what the run pinned
        return give_up(cfg, store, status, str(exc), "", verdict="data")
    except Exception as exc:
        if stream is not None and stream.error:  # the reader failed because a file could not come
            return give_up(cfg, store, status, stream.error, "", verdict="data")
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        error = f"{type(exc).__name__}: {exc}{hint(str(exc))}"
        if is_transient(exc):
            print("a peer was lost: exiting for a restart from the latest checkpoint", flush=True)
            status.stop(state="lost peer", error=error[:500])
            return EXIT_RETRY
        return give_up(cfg, store, status, error, trace)
    finally:
        if stream is not None:  # no fetch ahead for a pass that will not come
            stream.stop()


def _off_lock(cfg: NodeConfig, status: NodeStatus) -> str | None:
    """Check this interpreter against the node's lock, and report what it runs."""
    assert cfg.lock_sha256 is not None
    packages, problem = check(cfg.name, cfg.lock_sha256)
    status.update(packages=packages, versions=node_versions(packages, cfg.lock_sha256))
    if problem is None:
        print(f"environment: the run's lock {cfg.lock_sha256[:12]}, {len(packages)} packages", flush=True)
    return problem


# ---------------------------------------------------------------- ps and workers of the ps strategy


def _serve(cfg: NodeConfig, store: RunStore, status: NodeStatus, threads: int, *, lean: bool) -> int:
    Path(WORKER_INDEX_FILE).write_text(str(cfg.index), encoding="utf-8")  # in its work dir, its cwd
    data_worker = serving.start_data_worker(cfg, lean=lean)
    server = serving.start_server(cfg.peers, cfg.role, cfg.index, threads, lean=lean)
    status.mark("tensorflow")
    if lean:
        status.update(devices=["CPU:0"])  # what TensorFlow names a machine without GPUs
    status.update(state="serving")
    status.training_again(time.time())  # a ps, or a ps strategy's worker, is back when it serves
    pools = f", inter-op threads {threads}" if threads else ""
    what = ", TensorFlow's server alone" if lean else ""
    print(f"serving {cfg.role} {cfg.index} at {cfg.address} ({server.target}{pools}{what})", flush=True)
    marker = until_the_run_ends(store)
    status.stop(state=marker.marker.lower())
    if data_worker is not None:
        data_worker.stop()
    return EXIT_DONE


# ---------------------------------------------------------------- trainers


def _train(
    cfg: NodeConfig, store: RunStore, status: NodeStatus, work: Path, packed: ShardManifest | None
) -> int:
    from dlinfra.training import dispatch, export, loop, parameter_servers
    from dlinfra.training.data import S3Access
    from dlinfra.training.packed import packed_program
    from dlinfra.training.program import builtin_program, load_entrypoint

    t = cfg.training
    status.update(state="waiting for peers", total_steps=t.steps)
    me = cfg.address
    peers = [addr for addrs in cfg.peers.values() for addr in addrs if addr != me]
    handout = None
    if cfg.strategy == "parameter_server":
        if cfg.dispatcher is not None and packed is not None:
            handout = dispatch.Dispatch.of(packed, cfg.dispatcher, t.seed)
            # Never stopped: the trainer leaves by os._exit. Its gRPC shutdown waits for every call in
            # flight; a chief that stopped it after its last step, under load, never went on (a CI run).
            _KEPT.append(dispatch.start_dispatcher(handout))  # the workers wait for it to serve
        if (code := preflight.run(cfg, store, status)) is not None:
            return code
        wait_for_peers(peers, cfg.startup_timeout)
        strategy = None
    else:
        # The mirrored constructor blocks until every worker answers; bound it ourselves.
        strategy = bounded(loop.make_mirrored_strategy, cfg.startup_timeout, peers)
    status.mark("peers")
    if cfg.entrypoint and cfg.bundle:
        program = load_entrypoint(bundle.materialize(store, cfg.bundle, cfg.entrypoint, work), t)
    elif packed is not None:
        program = packed_program(t, packed)
    else:
        program = builtin_program(t, work / "data", S3Access(cfg.store.endpoint_url, cfg.store.region))
    status.mark("program")
    # Under mirrored, after the strategy (TensorFlow configures its collectives before any op runs),
    # and after the program: the all-reduce is measured at its model's gradient size.
    if strategy is not None and (code := preflight.run(cfg, store, status, (strategy, program))) is not None:
        return code
    checkpoints = CheckpointSync(store, work)
    progress = Progress(cfg, store, status, work)
    restore_from = checkpoints.download_latest()
    status.update(resumed_from=checkpoints.restored_step)
    if restore_from is None:
        status.restored(from_scratch=restarts.PROGRAM_CHECKPOINTS_PLACE)
    else:
        status.restored(checkpoint_step=checkpoints.restored_step)
    asks_checkpoints = cfg.spot_in_cluster or cfg.budget is not None
    hooks = loop.Hooks(
        work_dir=work,
        on_progress=progress.report,
        on_figures=lambda **figures: status.update(**figures),
        on_checkpoint=checkpoints.upload if cfg.is_chief else (lambda step, d: None),
        restore_from=restore_from,
        # spot notices, relayed by the chief's beacon, and the budget's end (watchdog) ask for one
        checkpoint_now=(lambda: spot.checkpoint_requested(work)) if asks_checkpoints else None,
    )
    status.update(state="training")
    started = time.time()
    try:
        if strategy is None:
            outcome = parameter_servers.train_parameter_server(cfg, program, hooks, handout)
        else:
            outcome = loop.train_mirrored(cfg, program, hooks, strategy)
    finally:
        progress.close()  # every report published before anything this life says after training
    train_seconds = time.time() - started
    if not cfg.is_chief:
        return stay_until_the_run_ends(cfg, store, status, step=outcome.step)
    status.update(state="exporting", step=outcome.step)
    results, _ = export.export(outcome.model, program, outcome.objective, work / "model")
    accuracy = export.accuracy_of(results)
    progress.final(results, outcome.step)
    model_uri = store.put_model(work / "model")
    metrics = Metrics(
        eval_accuracy=accuracy,
        scalars={f"eval_{name}": value for name, value in results.items()},
        loss=outcome.objective.loss_name,
        optimizer=outcome.optimizer,
        steps=outcome.step,
        total_steps=t.steps,
        strategy=cfg.strategy,
        workers=cfg.num_workers,
        ps=len(cfg.peers.get("ps", [])),
        batch_size=t.batch_size,
        replicas=outcome.scale.replicas,
        global_batch=outcome.scale.global_batch,
        learning_rate=outcome.scale.learning_rate,
        lr_scaling=outcome.scale.lr_scaling,
        mixed_precision=t.mixed_precision,
        steps_per_call=outcome.steps_per_call,
        steps_scheduled=outcome.steps_scheduled,
        train_seconds=train_seconds,
        first_step_at=progress.first_step_at,
        finished_at=time.time(),
        global_steps_per_sec=mean_sd(outcome.meter.steps_per_sec, outcome.meter.seconds),
        examples_per_sec=mean_sd(outcome.meter.examples_per_sec, outcome.meter.seconds),
        input_wait=outcome.meter.input_wait,
        examples_per_sec_series=progress.series,
        loss_series=progress.losses,
        final_loss=progress.last_loss,
        model_uri=model_uri,
        checkpoint=checkpoints.latest_uri,
        **(spot.recorded(store) if cfg.spot_in_cluster else {}),
        restarts=restarts.of_nodes(run_nodes(cfg, store, status).values()),
    )
    store.put_metrics(metrics)
    store.write_marker(
        "DONE", node=cfg.name, step=outcome.step, eval_accuracy=accuracy, restarts=metrics.restarts
    )
    status.stop(state="done", step=outcome.step)
    measured = ", ".join(f"eval {name} {value:.4f}" for name, value in results.items())
    print(f"done: step {outcome.step}, {measured}, model at {model_uri}", flush=True)
    return EXIT_DONE


# ---------------------------------------------------------------- helpers


def _redirect_output(path: Path) -> None:
    """Send this process's stdout/stderr (TensorFlow's C++ logs included) to the node's log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

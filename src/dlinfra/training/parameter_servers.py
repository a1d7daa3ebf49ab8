"""The parameter-server loop (async): it runs on the chief; variables live on the ps tasks, steps
run on the workers through a ClusterCoordinator (see training.loop for why a loop of our own).

Progress is counted where the updates land: a counter on the ps that each remote call increments
once it has run all its steps. A lost worker's call is re-run elsewhere, so counting scheduled calls
would drift.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

from dlinfra.contract import WORKER_INDEX_FILE, NodeConfig
from dlinfra.training import sharding
from dlinfra.training.dispatch import Dispatch
from dlinfra.training.loop import (
    Hooks,
    Outcome,
    Scale,
    batched,
    checkpoint,
    choose_optimizer,
    configure_keras,
    input_shard,
    restore,
    set_up,
)
from dlinfra.training.meter import InputClock, Meter
from dlinfra.training.objective import Objective
from dlinfra.training.pacing import ChunkClock, WorkerSamples, queue_depth, steps_per_call
from dlinfra.training.program import Program
from dlinfra.training.tracing import plain

# The workers' iterators of the last run of the loop in this process, never deleted: deleting one is a
# remote op on every worker, and the chief's next op that must run at once (the evaluation's first
# batch) waited for them: 3.4-14.7 s after the last step in 4 of 6 runs of the README's command,
# against 0.8 s (BENCHMARKS.md, "AutoGraph"). The trainer ends by os._exit, and the workers with the run.
OUTLIVING: list[Any] = []


def async_scale(cfg: NodeConfig) -> Scale:
    """Async parameter servers: every update is one worker's batch, applied as it comes."""
    t = cfg.training
    return Scale(cfg.num_workers, t.batch_size, t.learning_rate, "none (async: one batch per update)")


def _chief_io() -> Any:
    """Under parameter servers, each ps would write (and read) its own variables' shard at the
    chief's path, on its own disk: right only when every task shares one filesystem (local
    processes), wrong on machines. All checkpoint I/O goes through the chief's CPU instead."""
    import tensorflow as tf

    return tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")


def counted_steps(
    strategy: Any, model: Any, optimizer: Any, goal: Objective, applied: Any, tally: Any, clock: InputClock
) -> Any:
    """A worker's remote call: `n` steps from iterator `it`, then `applied` counts them and `tally`
    adds them and their seconds to the worker's row; returns [last loss, count after this call,
    seconds waiting on input, seconds in the call]."""
    import tensorflow as tf

    variables = sharding.trained(model.trainable_variables)
    start, next_batch, since = plain(clock.start), plain(clock.next), plain(clock.since)

    @tf.function(autograph=goal.user_code)  # the loop is a while_loop of its own (training.tracing)
    def train_steps(it: Any, n: Any) -> Any:
        def replica_fn(x: Any, y: Any, *weights: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = goal.mean_loss(model, y, model(x, training=True), *weights)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss

        def step(i: Any, loss: Any, waited: Any) -> Any:
            batch, waited = next_batch(it, waited, loss)  # (x, y) or (x, y, sample_weight)
            return i + 1, strategy.run(replica_fn, args=batch), waited

        began, waited = start()
        start_vars = (tf.zeros_like(n), tf.constant(0.0), waited)
        _, loss, waited = tf.while_loop(lambda i, *_: i < n, step, start_vars)
        # A call counts once it has run all its steps (a call lost mid-way is re-run elsewhere), so
        # after the loop: tf.function orders stateful ops only per variable, and ran the count first.
        # It comes back with the loss in one tensor: every fetch is a remote op from the chief.
        with tf.control_dependencies([loss]):
            count = applied.assign_add(tf.cast(n, tf.int64))
        busy = since(began, (loss, waited))  # the steps' time (the count is one remote op more)
        # Which worker ran the call: its index, read where it runs (a worker's cwd is its work dir)
        me = tf.strings.to_number(tf.io.read_file(WORKER_INDEX_FILE), tf.int32)
        done = tally.scatter_nd_add([[me, 0], [me, 1]], tf.stack([tf.cast(n, tf.float64), busy]))
        with tf.control_dependencies([done]):
            return tf.stack([tf.cast(loss, tf.float64), tf.cast(count, tf.float64), waited, busy])

    return train_steps


def train_parameter_server(
    cfg: NodeConfig, program: Program, hooks: Hooks, dispatch: Dispatch | None = None
) -> Outcome:
    """Runs on the chief: variables live on the ps tasks, steps run on the workers. `dispatch`: the
    workers take train files from the chief's tf.data dispatcher (dispatch.start_dispatcher)."""
    import tensorflow as tf

    configure_keras(cfg)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=program.variable_partitioner
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    t = cfg.training
    goal = set_up(program, strategy, cfg, hooks)
    with strategy.scope():
        model = program.build_model()
        optimizer, scale, described = choose_optimizer(cfg, program, model, async_scale(cfg))
        # Keras counts optimizer.iterations with a read, then an assign: workers racing on the ps lost
        # a fifth of the increments (two digits workers). An assign_add is one op under the lock.
        applied = tf.Variable(0, dtype=tf.int64, trainable=False, name="applied_steps")
        # per worker: [steps, seconds in its calls], this life's (stragglers: runs.stragglers)
        tally = tf.Variable(tf.zeros([cfg.num_workers, 2], tf.float64), trainable=False, name="worker_tally")
    if split := sharding.describe(model):
        print(f"split over the ps: {split}", flush=True)
    ckpt, manager = checkpoint(
        hooks.work_dir / "checkpoints",
        weights=sharding.saved(model),
        optimizer=optimizer,
        applied_steps=applied,
    )
    io = _chief_io()
    restore(ckpt, hooks, io)

    # ClusterCoordinator traces one dataset function for every worker, so no static shard index
    # reaches a worker: each worker instead streams its own random permutation of the data (of a
    # packed set: of the files it staged, read by a path that names each worker's own), or takes
    # files from the dispatcher as it is free.
    def dataset_fn() -> Any:
        return batched(program.train_data(input_shard(cfg, 0, 1, dispatch)), t.batch_size, shuffle_seed=None)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    inputs = InputClock(on=not t.deterministic)
    train_steps = counted_steps(strategy, model, optimizer, goal, applied, tally, inputs)

    def global_step() -> int:
        return int(applied.numpy())

    step = last_ckpt = scheduled = global_step()
    meter = Meter(step, t.batch_size)
    in_flight: collections.deque[tuple[int, list[Any]]] = collections.deque()  # (steps, calls) per chunk
    loss: float | None = None  # the last fetched loss
    urgent = False  # a spot notice: schedule nothing more, save what is done, before the node leaves
    spe = steps_per_call(t.steps_per_execution, None, t.log_every)
    by_size: collections.Counter[int] = collections.Counter()
    depth = queue_depth(math.inf, cfg.num_workers, math.ceil(t.log_every / spe))
    clock = ChunkClock(cfg.num_workers, time.monotonic())
    # Read beside the loop: the loop waits on the oldest chunk, which a straggler may hold.
    tallies = threading.Thread(target=_report_tally, args=(tally, hooks), daemon=True)
    tallies.start()
    while True:
        urgent = urgent or (hooks.checkpoint_now is not None and hooks.checkpoint_now())
        # Keep chunks queued behind the one we wait on, so workers never idle on our polling, but
        # never schedule past the next checkpoint: a fault then loses at most checkpoint_every
        # steps, and a notice's checkpoint waits for at most that much queued work.
        limit = scheduled if urgent else min(t.steps, last_ckpt + t.checkpoint_every)
        while scheduled < limit and len(in_flight) < depth:
            chunk = min(t.log_every, limit - scheduled)
            sizes = [min(spe, chunk - start) for start in range(0, chunk, spe)]
            calls = [coordinator.schedule(train_steps, args=(iterator, tf.constant(n))) for n in sizes]
            scheduled += chunk
            by_size[spe] += chunk
            in_flight.append((chunk, calls))
        if in_flight:
            # A Python wait on a result, not join(), keeps the GIL free: heartbeats go on while a frozen
            # worker holds a step, and the watcher blames that worker. The chunk's last call stands for
            # the chunk: queued last, it usually ends last (its count is a lower bound when it does not).
            chunk, calls = in_flight.popleft()
            try:
                fetched, count, waited, busy = calls[-1].fetch()
            except tf.errors.OpError:
                # Our fetch can copy a call's result off its worker before the coordinator does: a worker
                # lost then fails it, and the call is re-run. The next schedule or join raises real errors.
                continue
            chunk_seconds, step_seconds = clock.fetched(time.monotonic(), chunk)
            spe = steps_per_call(t.steps_per_execution, step_seconds, t.log_every)
            depth = queue_depth(chunk_seconds, cfg.num_workers, math.ceil(t.log_every / spe))
            meter.input(waited, busy)  # a sample: the chunk's last call stands for its chunk
            loss = float(fetched)
            if int(count) > step:  # counted when that call ended: one that ended earlier says nothing new
                step = int(count)
                hooks.on_progress(step, loss, meter.tick(step), meter.interval_wait())
            continue
        coordinator.join()
        exact = global_step()
        if exact > step and loss is not None:
            # Calls end out of order across workers: the chunk's last call may have ended before the
            # others, so the count it brought lags. The segment's end reports the exact count (the last
            # progress report of a run is its final step, in the log and in TensorBoard).
            hooks.on_progress(exact, loss, meter.tick(exact), meter.interval_wait())
        step = exact
        if step > last_ckpt:
            manager.save(checkpoint_number=step, options=io)
            hooks.on_checkpoint(step, hooks.work_dir / "checkpoints")
            last_ckpt = step
        urgent = False
        if step >= t.steps:
            break
        # What the count, not what was scheduled, still lacks: a fault can abort or repeat calls.
        scheduled = step
        clock.restart(time.monotonic())
    OUTLIVING[:] = [iterator]
    return Outcome(model, global_step(), scale, goal, described, meter, dict(by_size), by_size.total())


TALLY_SECONDS = 2.0


def _report_tally(tally: Any, hooks: Hooks) -> None:
    """Each worker's seconds per step into the chief's status, every few seconds, for the life of
    the process (it ends with the trainer)."""
    workers, failing = WorkerSamples(), False
    while True:
        time.sleep(TALLY_SECONDS)
        try:
            hooks.on_figures(workers=workers.read(tally.numpy()))
            failing = False
        except Exception as exc:  # a lost ps: the loop sees it too, and deals with it
            if not failing:
                print(f"worker tally not read: {type(exc).__name__}: {exc}", flush=True)
            failing = True

"""Custom training loops for both strategies, on Keras 3 layers and optimizers.

Why custom loops and not `model.fit`: Keras 3's `fit` fails under ParameterServerStrategy
(keras#18624) and under MultiWorkerMirroredStrategy (keras#20585). tf-keras `fit` works but is
slower here and its wheel drags the full GPU `tensorflow` package over `tensorflow-cpu`. A loop
over `ClusterCoordinator.schedule` / `strategy.run` works with Keras 3 and gives us exact control
of step counting, checkpoints and progress (see README, "Why custom loops").

Progress is always counted where the updates land, never from what was scheduled (mirrored: the
optimizer's step variable; parameter servers: a counter on the ps that each remote call increments
once it has run all its steps): a lost worker's call is re-run elsewhere, so counting scheduled
calls would drift.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlinfra.contract import NodeConfig
from dlinfra.training.pacing import ChunkClock, queue_depth, steps_per_call
from dlinfra.training.program import Program, Shard

SHUFFLE_BUFFER = 4096


@dataclass
class Hooks:
    """How a loop talks to the node agent (status, store) without knowing about either."""

    work_dir: Path
    on_progress: Callable[[int, float, float], None] = lambda step, loss, eps: None
    on_checkpoint: Callable[[int, Path], None] = lambda step, directory: None
    restore_from: Path | None = None  # a local checkpoint prefix (…/ckpt-N) to resume from
    # Asked at each progress report when some node is spot: True once a notice wants a checkpoint now.
    checkpoint_now: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Scale:
    """How a run's batch and learning rate relate to its replicas (stated in the metrics)."""

    replicas: int  # model copies computing gradients: one per GPU of every worker, or per CPU worker
    global_batch: int  # examples behind one optimizer update
    learning_rate: float  # as used, after lr_scaling
    lr_scaling: str  # the rule, in words


@dataclass
class Outcome:
    model: Any
    step: int
    scale: Scale
    examples_per_sec: list[float] = field(default_factory=list)
    steps_per_sec: list[float] = field(default_factory=list)
    interval_seconds: list[float] = field(default_factory=list)  # the length of each rate's interval
    steps_per_call: dict[int, int] = field(default_factory=dict)  # parameter servers: steps at each size
    steps_scheduled: int | None = None  # parameter servers: steps handed to workers in this life


def mirrored_scale(cfg: NodeConfig, replicas: int) -> Scale:
    """Sync all-reduce: one update averages every replica's batch, so the global batch grows with
    the replicas; `linear` grows the learning rate with it (Goyal et al., 2017)."""
    t = cfg.training
    if t.lr_scaling == "linear":
        return Scale(replicas, t.batch_size * replicas, t.learning_rate * replicas, f"linear (x{replicas})")
    return Scale(replicas, t.batch_size * replicas, t.learning_rate, "none (learning_rate as given)")


def async_scale(cfg: NodeConfig) -> Scale:
    """Async parameter servers: every update is one worker's batch, applied as it comes."""
    t = cfg.training
    return Scale(cfg.num_workers, t.batch_size, t.learning_rate, "none (async: one batch per update)")


def make_optimizer(cfg: NodeConfig, learning_rate: float) -> Any:
    """The spec's optimizer. Mixed precision runs without loss scaling: Keras 3's LossScaleOptimizer
    fails inside tf.distribute replica contexts ("No gradients provided", measured with 3.15), so
    variables stay float32 and gradients flow through float16 activations unscaled."""
    import keras

    return {
        "adam": lambda: keras.optimizers.Adam(learning_rate),
        "sgd": lambda: keras.optimizers.SGD(learning_rate, momentum=0.9),
        "rmsprop": lambda: keras.optimizers.RMSprop(learning_rate),
        "adagrad": lambda: keras.optimizers.Adagrad(learning_rate),
    }[cfg.training.optimizer]()


def configure_keras(cfg: NodeConfig) -> None:
    """Seeds, determinism and the precision policy: before any layer exists."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(cfg.training.seed)
    if cfg.training.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy("mixed_float16" if cfg.training.mixed_precision else "float32")


def _batched(ds: Any, batch: int, shuffle_seed: int | None, skip_batches: int = 0) -> Any:
    """Seeded input streams are a pure function of the seed, so skipping the batches already trained
    on restores the data position after a restart (cheap for these pipelines, no iterator state)."""
    import tensorflow as tf

    return (
        ds.shuffle(SHUFFLE_BUFFER, seed=shuffle_seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch, drop_remainder=True)
        .skip(skip_batches)
        .prefetch(tf.data.AUTOTUNE)
    )


class _Meter:
    """Throughput between progress reports, with each interval's length: under parameter servers
    chunks can arrive in bunches, and a plain mean of the rates would count a 10 ms interval as much
    as a 500 ms one."""

    def __init__(self, step: int, batch: int):
        self.step, self.batch, self.t = step, batch, time.perf_counter()
        self.examples_per_sec: list[float] = []
        self.steps_per_sec: list[float] = []
        self.seconds: list[float] = []

    def tick(self, step: int) -> float:
        now = time.perf_counter()
        dt = max(now - self.t, 1e-9)
        sps = (step - self.step) / dt
        eps = sps * self.batch
        if step > self.step:
            self.steps_per_sec.append(sps)
            self.examples_per_sec.append(eps)
            self.seconds.append(dt)
        self.step, self.t = step, now
        return eps


def _checkpoint(directory: Path, **objects: Any) -> Any:
    import tensorflow as tf

    ckpt = tf.train.Checkpoint(**objects)
    return ckpt, tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=2)


def _chief_io() -> Any:
    """Under parameter servers, each ps would write (and read) its own variables' shard at the
    chief's path, on its own disk: right only when every task shares one filesystem (local
    processes), wrong on machines. All checkpoint I/O goes through the chief's CPU instead."""
    import tensorflow as tf

    return tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")


def _restore(ckpt: Any, hooks: Hooks, options: Any = None) -> None:
    if hooks.restore_from is not None:
        ckpt.restore(str(hooks.restore_from), options=options).assert_existing_objects_matched()


def _loss_fn() -> Any:
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


# ---------------------------------------------------------------- parameter server (async)


def counted_steps(strategy: Any, model: Any, optimizer: Any, loss_fn: Any, applied: Any) -> Any:
    """A worker's remote call: `n` steps from iterator `it`, then `applied` counts them; returns
    [last loss, count after this call]."""
    import tensorflow as tf

    @tf.function
    def train_steps(it: Any, n: Any) -> Any:
        def replica_fn(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        loss = tf.constant(0.0)
        for _ in tf.range(n):
            x, y = next(it)
            loss = strategy.run(replica_fn, args=(x, y))
        # A call counts once it has run all its steps (a call lost mid-way is re-run elsewhere), so
        # after the loop: tf.function orders stateful ops only per variable, and ran the count first.
        # It comes back with the loss in one tensor: every fetch is a remote op from the chief.
        with tf.control_dependencies([loss]):
            count = applied.assign_add(tf.cast(n, tf.int64))
        return tf.stack([tf.cast(loss, tf.float64), tf.cast(count, tf.float64)])

    return train_steps


def train_parameter_server(cfg: NodeConfig, program: Program, hooks: Hooks) -> Outcome:
    """Runs on the chief: variables live on the ps tasks, steps run on the workers."""
    import tensorflow as tf

    configure_keras(cfg)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    t = cfg.training
    scale = async_scale(cfg)
    with strategy.scope():
        model = program.build_model()
        optimizer = make_optimizer(cfg, scale.learning_rate)
        optimizer.build(model.trainable_variables)  # slot variables must exist before remote steps
        # Keras counts optimizer.iterations with a read, then an assign: workers racing on the ps lost
        # a fifth of the increments (two digits workers). An assign_add is one op under the lock.
        applied = tf.Variable(0, dtype=tf.int64, trainable=False, name="applied_steps")
    ckpt, manager = _checkpoint(
        hooks.work_dir / "checkpoints", model=model, optimizer=optimizer, applied_steps=applied
    )
    io = _chief_io()
    _restore(ckpt, hooks, io)
    loss_fn = _loss_fn()

    # ClusterCoordinator traces one dataset function for every worker, so no static shard index
    # reaches a worker: each worker instead streams its own random permutation of the data.
    def dataset_fn() -> Any:
        return _batched(program.train_data(Shard(0, 1)), t.batch_size, shuffle_seed=None)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    train_steps = counted_steps(strategy, model, optimizer, loss_fn, applied)

    def global_step() -> int:
        return int(applied.numpy())

    step = last_ckpt = scheduled = global_step()
    meter = _Meter(step, t.batch_size)
    in_flight: collections.deque[tuple[int, list[Any]]] = collections.deque()  # (steps, calls) per chunk
    loss: float | None = None  # the last fetched loss
    urgent = False  # a spot notice: schedule nothing more, save what is done, before the node leaves
    spe = steps_per_call(t.steps_per_execution, None, t.log_every)
    by_size: collections.Counter[int] = collections.Counter()
    depth = queue_depth(math.inf, cfg.num_workers, math.ceil(t.log_every / spe))
    clock = ChunkClock(cfg.num_workers, time.monotonic())
    while True:
        urgent = urgent or (hooks.checkpoint_now is not None and hooks.checkpoint_now())
        # Keep chunks queued behind the one we wait on, so workers never idle on our polling, but
        # never schedule past the next checkpoint: a fault then loses at most checkpoint_every
        # steps, and a notice's checkpoint waits for at most that much queued work.
        limit = scheduled if urgent else min(t.steps, last_ckpt + t.checkpoint_every)
        while scheduled < limit and len(in_flight) < depth:
            chunk = min(t.log_every, limit - scheduled)
            calls = [
                coordinator.schedule(train_steps, args=(iterator, tf.constant(min(spe, chunk - start))))
                for start in range(0, chunk, spe)
            ]
            scheduled += chunk
            by_size[spe] += chunk
            in_flight.append((chunk, calls))
        if in_flight:
            # A Python wait on a result, not join(), keeps the GIL free: heartbeats go on while a frozen
            # worker holds a step, and the watcher blames that worker. The chunk's last call stands for
            # the chunk: queued last, it usually ends last (its count is a lower bound when it does not).
            chunk, calls = in_flight.popleft()
            try:
                fetched, count = calls[-1].fetch()
            except tf.errors.OpError:
                # Our fetch can copy a call's result off its worker before the coordinator does: a worker
                # lost then fails it, and the call is re-run. The next schedule or join raises real errors.
                continue
            chunk_seconds, step_seconds = clock.fetched(time.monotonic(), chunk)
            spe = steps_per_call(t.steps_per_execution, step_seconds, t.log_every)
            depth = queue_depth(chunk_seconds, cfg.num_workers, math.ceil(t.log_every / spe))
            step, loss = max(step, int(count)), float(fetched)  # counted when that call ended
            hooks.on_progress(step, loss, meter.tick(step))
            continue
        coordinator.join()
        exact = global_step()
        if exact > step and loss is not None:
            # Calls end out of order across workers: the chunk's last call may have ended before the
            # others, so the count it brought lags. The segment's end reports the exact count (the last
            # progress report of a run is its final step, in the log and in TensorBoard).
            hooks.on_progress(exact, loss, meter.tick(exact))
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
    return Outcome(
        model,
        global_step(),
        scale,
        meter.examples_per_sec,
        meter.steps_per_sec,
        meter.seconds,
        dict(by_size),
        by_size.total(),
    )


# ---------------------------------------------------------------- multi-worker mirrored (sync)


def make_mirrored_strategy() -> Any:
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def train_mirrored(cfg: NodeConfig, program: Program, hooks: Hooks, strategy: Any) -> Outcome:
    """Runs on every worker: synchronous all-reduce; worker 0 (the chief) saves for real."""
    import tensorflow as tf

    configure_keras(cfg)
    t = cfg.training
    scale = mirrored_scale(cfg, strategy.num_replicas_in_sync)  # every GPU of every worker
    global_batch = scale.global_batch
    with strategy.scope():
        model = program.build_model()
        optimizer = make_optimizer(cfg, scale.learning_rate)
        optimizer.build(model.trainable_variables)
    # Every worker must take part in saving (the save is collective); only the chief's copy counts.
    ckpt_dir = hooks.work_dir / ("checkpoints" if cfg.is_chief else f"checkpoints-tmp-{cfg.index}")
    ckpt, manager = _checkpoint(ckpt_dir, model=model, optimizer=optimizer)
    _restore(ckpt, hooks)
    loss_fn = _loss_fn()
    resumed_at = int(optimizer.iterations.numpy())  # each step took one batch from every pipeline

    def dataset_fn(ctx: Any) -> Any:
        shard = Shard(ctx.input_pipeline_id, ctx.num_input_pipelines)
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        return _batched(
            program.train_data(shard), per_replica, shuffle_seed=t.seed + shard.index, skip_batches=resumed_at
        )

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    # The replica's forward and backward pass, XLA-compiled when asked; the all-reduce and the update
    # stay outside it (XLA does not compile the collectives).
    @tf.function(jit_compile=t.jit_compile)
    def gradients(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        return loss, tape.gradient(loss, model.trainable_variables)

    @tf.function
    def train_steps(it: Any, n: Any) -> Any:
        def replica_fn(x: Any, y: Any) -> Any:
            loss, grads = gradients(x, y)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        loss = tf.constant(0.0)
        for _ in tf.range(n):
            x, y = next(it)
            loss = strategy.reduce("SUM", strategy.run(replica_fn, args=(x, y)), axis=None)
        return loss

    step = int(optimizer.iterations.numpy())
    meter = _Meter(step, global_batch)
    last_ckpt = step
    while step < t.steps:
        n = min(t.log_every, t.steps - step, last_ckpt + t.checkpoint_every - step)
        loss = float(train_steps(iterator, tf.constant(n)))
        step = int(optimizer.iterations.numpy())
        hooks.on_progress(step, loss, meter.tick(step))
        urgent = hooks.checkpoint_now is not None and _any_worker(strategy, hooks.checkpoint_now())
        if urgent or step - last_ckpt >= t.checkpoint_every or step >= t.steps:
            manager.save(checkpoint_number=step)
            if cfg.is_chief:
                hooks.on_checkpoint(step, ckpt_dir)
            last_ckpt = step
    return Outcome(model, step, scale, meter.examples_per_sec, meter.steps_per_sec, meter.seconds)


def _any_worker(strategy: Any, wanted: bool) -> bool:
    """Whether any worker wants a checkpoint now: the save is collective, so every worker must decide
    alike at the same step (only the chief sees a spot notice)."""
    import tensorflow as tf

    flags = strategy.run(lambda: tf.constant(1.0 if wanted else 0.0))
    return float(strategy.reduce("MAX", flags, axis=None)) > 0

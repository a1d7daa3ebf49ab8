"""Custom training loops, on Keras 3 layers and optimizers: what both strategies share, and the
multi-worker mirrored loop (sync); the parameter-server loop is in training.parameter_servers.

Why custom loops and not `model.fit`: Keras 3's `fit` fails under ParameterServerStrategy
(keras#18624) and under MultiWorkerMirroredStrategy (keras#20585). tf-keras `fit` works but is
slower here and its wheel drags the full GPU `tensorflow` package over `tensorflow-cpu`. A loop
over `ClusterCoordinator.schedule` / `strategy.run` works with Keras 3 and gives us exact control
of step counting, checkpoints and progress (docs/program.md, "Why custom training loops").

Progress is always counted where the updates land, never from what was scheduled (mirrored: the
optimizer's step variable; parameter servers: a counter on the ps that each remote call increments
once it has run all its steps): a lost worker's call is re-run elsewhere, so counting scheduled
calls would drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlinfra.contract import NodeConfig
from dlinfra.training import fit_check, objective, sharding, staging
from dlinfra.training.meter import Computed, InputClock, Meter
from dlinfra.training.objective import Objective
from dlinfra.training.program import Program, Shard
from dlinfra.training.tracing import plain

if TYPE_CHECKING:
    from dlinfra.training.dispatch import Dispatch

SHUFFLE_BUFFER = 4096


@dataclass
class Hooks:
    """How a loop talks to the node agent (status, store) without knowing about either."""

    work_dir: Path
    # (step, loss, examples/s, the share of step time spent waiting on input since the last report,
    # **figures for the node's status)
    on_progress: Callable[..., None] = lambda step, loss, eps, wait, **figures: None
    on_figures: Callable[..., None] = lambda **figures: None  # figures for its status between reports
    on_checkpoint: Callable[[int, Path], None] = lambda step, directory: None
    restore_from: Path | None = None  # a local checkpoint prefix (…/ckpt-N) to resume from
    # Asked at each progress report when some node is spot: True once a notice wants a checkpoint now.
    checkpoint_now: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Scale:
    """How a run's batch and learning rate relate to its replicas (stated in the metrics)."""

    replicas: int  # model copies computing gradients: one per GPU of every worker, or per CPU worker
    global_batch: int  # examples behind one optimizer update
    learning_rate: float | None  # as used, after lr_scaling (None: a schedule of the program's)
    lr_scaling: str  # the rule, in words


@dataclass
class Outcome:
    model: Any
    step: int
    scale: Scale
    objective: Objective
    optimizer: str  # its class, and where it came from
    meter: Meter  # the rates between progress reports and the input wait, over this life
    steps_per_call: dict[int, int] = field(default_factory=dict)  # parameter servers: steps at each size
    steps_scheduled: int | None = None  # parameter servers: steps handed to workers in this life


def mirrored_scale(cfg: NodeConfig, replicas: int) -> Scale:
    """Sync all-reduce: one update averages every replica's batch, so the global batch grows with
    the replicas; `linear` grows the learning rate with it (Goyal et al., 2017)."""
    t = cfg.training
    if t.lr_scaling == "linear":
        return Scale(replicas, t.batch_size * replicas, t.learning_rate * replicas, f"linear (x{replicas})")
    return Scale(replicas, t.batch_size * replicas, t.learning_rate, "none (learning_rate as given)")


def choose_optimizer(cfg: NodeConfig, program: Program, model: Any, scale: Scale) -> tuple[Any, Scale, str]:
    """The program's optimizer, built for the variables it updates; `scale` restated when the learning
    rate is the program's own (the spec's and its scaling then do not apply)."""
    made, source = objective.optimizer(
        program, model, lambda: make_optimizer(cfg.training.optimizer, scale.learning_rate or 0)
    )
    made.build(sharding.trained(model.trainable_variables))  # slots must exist before remote steps
    described = f"{type(made).__name__} ({source})"
    if source == "training.optimizer":
        return made, scale, described
    import keras

    schedule = isinstance(
        getattr(made, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule
    )
    rate = None if schedule else float(keras.ops.convert_to_numpy(made.learning_rate))
    return made, Scale(scale.replicas, scale.global_batch, rate, f"none ({source})"), described


def make_optimizer(name: str, learning_rate: float) -> Any:
    """The spec's optimizer. Mixed precision runs without loss scaling: Keras 3's LossScaleOptimizer
    fails inside tf.distribute replica contexts ("No gradients provided", measured with 3.15), so
    variables stay float32 and gradients flow through float16 activations unscaled."""
    import keras

    return {
        "adam": lambda: keras.optimizers.Adam(learning_rate),
        "sgd": lambda: keras.optimizers.SGD(learning_rate, momentum=0.9),
        "rmsprop": lambda: keras.optimizers.RMSprop(learning_rate),
        "adagrad": lambda: keras.optimizers.Adagrad(learning_rate),
    }[name]()


def configure_keras(cfg: NodeConfig) -> None:
    """Seeds, determinism and the precision policy: before any layer exists."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(cfg.training.seed)
    if cfg.training.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy("mixed_float16" if cfg.training.mixed_precision else "float32")


def batched(ds: Any, batch: int, shuffle_seed: int | None, skip_batches: int = 0) -> Any:
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


def checkpoint(directory: Path, **objects: Any) -> Any:
    import tensorflow as tf

    ckpt = tf.train.Checkpoint(**objects)
    return ckpt, tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=2)


def restore(ckpt: Any, hooks: Hooks, options: Any = None) -> None:
    if hooks.restore_from is not None:
        ckpt.restore(str(hooks.restore_from), options=options).assert_existing_objects_matched()


# ---------------------------------------------------------------- multi-worker mirrored (sync)


def make_mirrored_strategy() -> Any:
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def train_mirrored(cfg: NodeConfig, program: Program, hooks: Hooks, strategy: Any) -> Outcome:
    """Runs on every worker: synchronous all-reduce; worker 0 (the chief) saves for real."""
    import tensorflow as tf

    configure_keras(cfg)
    t = cfg.training
    if program.variable_partitioner is not None:
        print("Program.variable_partitioner: unused under multi_worker_mirrored (no ps to split over)")
    goal = set_up(program, strategy, cfg, hooks)
    with strategy.scope():
        model = program.build_model()
        # every GPU of every worker
        optimizer, scale, described = choose_optimizer(
            cfg, program, model, mirrored_scale(cfg, strategy.num_replicas_in_sync)
        )
    global_batch, replicas = scale.global_batch, scale.replicas
    # Every worker must take part in saving (the save is collective); only the chief's copy counts.
    ckpt_dir = hooks.work_dir / ("checkpoints" if cfg.is_chief else f"checkpoints-tmp-{cfg.index}")
    ckpt, manager = checkpoint(ckpt_dir, weights=sharding.saved(model), optimizer=optimizer)
    restore(ckpt, hooks)
    resumed_at = int(optimizer.iterations.numpy())  # each step took one batch from every pipeline

    def dataset_fn(ctx: Any) -> Any:
        shard = input_shard(cfg, ctx.input_pipeline_id, ctx.num_input_pipelines)
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        return batched(
            program.train_data(shard), per_replica, shuffle_seed=t.seed + shard.index, skip_batches=resumed_at
        )

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    clock = InputClock(on=not t.deterministic)
    done = Computed(host=bool(tf.config.list_logical_devices("GPU")))

    # The replica's forward and backward pass, XLA-compiled when asked; the all-reduce and the update
    # stay outside it (XLA does not compile the collectives).
    @tf.function(jit_compile=t.jit_compile, autograph=goal.user_code)  # see training.tracing
    def gradients(x: Any, y: Any, *weights: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = goal.replica_loss(model, y, model(x, training=True), global_batch, replicas, *weights)
        return loss, tape.gradient(loss, model.trainable_variables)

    replica_fn = timed_replica_step(model, optimizer, gradients, clock, done)
    # this worker's replicas: each brings 1/local_replicas of the worker's loss to the call's reduce
    local_replicas = len(strategy.extended.worker_devices)

    start, next_batch, since = plain(clock.start), plain(clock.next), plain(clock.since)

    @tf.function(autograph=goal.user_code)  # the loop is a while_loop of its own (training.tracing)
    def train_steps(it: Any, n: Any) -> Any:
        def step(i: Any, loss: Any, own: Any, waited: Any) -> Any:
            batch, waited = next_batch(it, waited, loss)  # (x, y) or (x, y, sample_weight)
            losses, seconds = strategy.run(replica_fn, args=batch)
            loss = tf.add_n(strategy.experimental_local_results(losses))  # this worker's replicas
            # this worker's slowest device: no collective (a figure of its own, not the cluster's)
            own += tf.reduce_max(tf.stack(strategy.experimental_local_results(seconds)))
            return i + 1, loss, own, waited

        began, waited = start()
        # `own`: this worker's compute seconds over the call's steps
        start_vars = (tf.zeros_like(n), tf.constant(0.0), tf.constant(0.0, tf.float64), waited)
        _, loss, own, waited = tf.while_loop(lambda i, *_: i < n, step, start_vars)
        # The last step's loss summed over every worker once per call: the guide's reduce at every
        # step is a second all-reduce per step, 6.5 % of two digits workers' throughput (BENCHMARKS).
        shares = strategy.run(lambda mine: mine / local_replicas, args=(loss,))
        loss = strategy.reduce("SUM", shares, axis=None)
        # the step count read in the call (ordered after its updates): an eager read of the mirrored
        # variable after it costs ~0.15 ms of the training thread at every report
        return (
            loss,
            waited,
            since(began, (loss, waited)),
            optimizer.iterations,
            own / tf.cast(n, own.dtype),
        )

    step = int(optimizer.iterations.numpy())
    meter = Meter(step, global_batch)
    last_ckpt = step
    while step < t.steps:
        n = min(t.log_every, t.steps - step, last_ckpt + t.checkpoint_every - step)
        fetched, waited, busy, count, own = train_steps(iterator, tf.constant(n))
        loss = float(fetched)
        meter.input(float(waited), float(busy))  # the chief's own pipeline: each worker reads its own
        step = int(count)
        # None under training.deterministic, where no timestamp runs
        computed = {"compute_seconds": round(float(own), 6)} if float(own) > 0 else {}
        hooks.on_progress(step, loss, meter.tick(step), meter.interval_wait(), **computed)
        urgent = hooks.checkpoint_now is not None and _any_worker(strategy, hooks.checkpoint_now())
        if urgent or step - last_ckpt >= t.checkpoint_every or step >= t.steps:
            manager.save(checkpoint_number=step)
            if cfg.is_chief:
                hooks.on_checkpoint(step, ckpt_dir)
            last_ckpt = step
    return Outcome(model, step, scale, goal, described, meter)


def timed_replica_step(
    model: Any, optimizer: Any, gradients: Callable[..., Any], clock: InputClock, done: Computed
) -> Callable[..., Any]:
    """A mirrored replica's step: its gradients, then the update (whose all-reduce every worker
    waits in for the slowest). It returns its loss and its own forward and backward pass's seconds,
    timed from its batch (and the previous update) to its gradients, before that all-reduce: so a
    straggler is named by its own figure (runs.stragglers), at no extra step."""
    import tensorflow as tf

    def replica_fn(*batch: Any) -> Any:
        began = clock.after(done(batch, optimizer.iterations))
        with tf.control_dependencies([began]):  # the pass reads its batch only after `began`
            batch = tf.nest.map_structure(tf.identity, batch, expand_composites=True)
        loss, grads = gradients(*batch)
        seconds = clock.since(began, done(loss, grads))
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss, seconds

    return replica_fn


def set_up(program: Program, strategy: Any, cfg: NodeConfig, hooks: Hooks) -> Objective:
    """The program's own set-up in the strategy's scope, then its first batch checked against its
    objective (on a plain copy of the model), before any step runs. What
    the program says that the loop does not do goes into the node's status (the CLI prints it)."""
    if program.setup is not None:
        with strategy.scope():
            program.setup()
    goal = fit_check.first_batch(program, cfg.training.batch_size, input_shard(cfg, 0, 1))
    if goal.warnings:
        hooks.on_figures(warnings=list(goal.warnings))
    return goal


def input_shard(cfg: NodeConfig, index: int, count: int, dispatch: Dispatch | None = None) -> Shard:
    """What one input pipeline reads. A packed data set's node has staged its own share, so its
    files are the whole of its part (see training.staging), or takes them as it is free (dispatch)."""
    ds = cfg.training.dataset
    if ds.staged:
        streamed = ds.cache_gb is not None
        return Shard(0, 1, staging.patterns(ds.format)[0], streamed, ds.compression_type, dispatch)
    return Shard(index, count)


def _any_worker(strategy: Any, wanted: bool) -> bool:
    """Whether any worker wants a checkpoint now: the save is collective, so every worker must decide
    alike at the same step (only the chief sees a spot notice)."""
    import tensorflow as tf

    flags = strategy.run(lambda: tf.constant(1.0 if wanted else 0.0))
    return float(strategy.reduce("SUM", flags, axis=None)) > 0  # ReduceOp has no MAX: SUM and MEAN

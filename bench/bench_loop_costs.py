"""Where the built-in MWMS loop's time goes (issue 59): the hand-written program of TensorFlow's
multi-worker guide, then dlinfra's loop's differences added one at a time, in one process, each
variant timed in turn within every repetition (so load on a shared machine falls on all alike).

- hand: the guide's custom loop (bench_anchors.hand_mwms): no value read back between calls;
- +fetch: the loss and the optimizer's step count (returned by the call) read back after every
  call, as dlinfra's loop reads them for its progress report;
- +data: dlinfra's input pipeline (loop.batched: seeded shuffle, skip, prefetch AUTOTUNE) instead
  of the guide's;
- +loss: dlinfra's objective (objective.replica_loss, from the program's first batch check);
- +clock: dlinfra's input clock (meter.InputClock): each step's `next()` timed inside the call,
  after the previous step's loss;
- +compute: each replica's forward and backward pass timed inside its step too (loop's
  timed_replica_step: what names a mirrored straggler). That is dlinfra's loop's graph as it runs;
- +status: the node's report after every call (node.reporting.Progress): its status file and its
  log line (to a file, as a node's stdout is);
- +tensorboard: the chief's part of the report too: three TensorBoard scalars per report and the
  event files copied to the store every 10 s. That is dlinfra's chief as it runs;
- overlap-clock: the same, with a clock that lets `next()` run beside the previous step and counts
  only the time the step waited past it (what a fix would run).

One worker by default, no TF_CONFIG: the strategy's own overhead is the same in every variant, and
what differs is the loop. `--workers N` runs N worker processes in one MWMS cluster (TF_CONFIG on
the loopback, as the hand-written anchor), every variant in turn on all of them, timed on worker 0:
what each difference costs once a step waits on its peers' all-reduce (not trustworthy yet: at 2
workers every variant ran at about half the rate of the same program alone, cause not found;
BENCHMARKS.md). Examples/s (the cluster's) are mean ± sd over `--reps`; each variant's ratio is to
`hand`.

    python bench/bench_loop_costs.py [--model digits|resnet20] [--steps 600] [--reps 3] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_anchors import BATCH, STEPS_PER_CALL, loopback_cluster, mirrored_model, tf_config
from node_report import node_reporter

VARIANTS = [
    "hand",
    "+fetch",
    "+data",
    "+loss",
    "+clock",
    "+compute",
    "+status",
    "+tensorboard",
    "overlap-clock",
]


class OverlapClock:
    """Input wait without ordering `next()` after the previous step: a step waited only for the
    time its batch came later than the previous step's end."""

    def start(self) -> tuple[Any, Any]:
        import tensorflow as tf

        began = tf.timestamp()
        with tf.control_dependencies([began]):
            return began, began * 0.0

    def next(self, it: Any, waited: Any, after: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        with tf.control_dependencies(tf.nest.flatten([waited, after], expand_composites=True)):
            done = tf.timestamp()  # first: timestamps run in program order (automatic control deps)
        batch = next(it)
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            ready = tf.timestamp()
        return batch, waited + tf.maximum(ready - done, 0.0)

    def since(self, began: Any, after: Any) -> Any:
        import tensorflow as tf

        with tf.control_dependencies(tf.nest.flatten(after, expand_composites=True)):
            return tf.timestamp() - began


def build(variant: str, strategy: Any, model_name: str) -> Callable[[int], None]:
    """The variant's model, optimizer, iterator and training call; returns `run(calls)`."""
    import keras
    import tensorflow as tf

    from dlinfra.training import fit_check
    from dlinfra.training.loop import batched, timed_replica_step
    from dlinfra.training.meter import Computed, InputClock, Meter
    from dlinfra.training.program import Shard

    rank = VARIANTS.index(variant)
    program, net, optimizer = mirrored_model(strategy, model_name)
    goal = fit_check.first_batch(program, BATCH)
    global_batch, replicas = BATCH * strategy.num_replicas_in_sync, strategy.num_replicas_in_sync
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def dataset_fn(ctx: Any) -> Any:
        shard = Shard(ctx.input_pipeline_id, ctx.num_input_pipelines)
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        if rank >= VARIANTS.index("+data"):
            return batched(program.train_data(shard), per_replica, shuffle_seed=shard.index)
        ds = program.train_data(shard).shuffle(4096).repeat()
        return ds.batch(per_replica, drop_remainder=True).prefetch(2)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def gradients(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            if rank >= VARIANTS.index("+loss"):
                loss = goal.replica_loss(net, y, net(x, training=True), global_batch, replicas)
            else:
                per_example = loss_fn(y, net(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        return loss, tape.gradient(loss, net.trainable_variables)

    def step(x: Any, y: Any) -> Any:
        loss, grads = gradients(x, y)
        optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))
        return loss

    @tf.function
    def plain(it: Any, n: Any) -> Any:
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = strategy.reduce("SUM", strategy.run(step, args=next(it)), axis=None)
        return loss, optimizer.iterations

    clock = OverlapClock() if variant == "overlap-clock" else InputClock()
    timed = timed_replica_step(net, optimizer, gradients, InputClock(), Computed())
    compute = rank >= VARIANTS.index("+compute")

    @tf.function
    def clocked(it: Any, n: Any) -> Any:
        loss = tf.constant(0.0)
        own = tf.constant(0.0, tf.float64)
        began, waited = clock.start()
        for _ in tf.range(n):
            batch, waited = clock.next(it, waited, loss)
            if compute:
                losses, seconds = strategy.run(timed, args=batch)
                own += tf.reduce_max(tf.stack(strategy.experimental_local_results(seconds)))
            else:
                losses = strategy.run(step, args=batch)
            loss = strategy.reduce("SUM", losses, axis=None)
        return loss, waited, clock.since(began, (loss, waited)), own, optimizer.iterations

    fetch = rank >= VARIANTS.index("+fetch")
    call = clocked if rank >= VARIANTS.index("+clock") else plain
    report = None
    if rank >= VARIANTS.index("+status"):  # a worker's report (no TensorBoard), then the chief's
        work = Path(tempfile.mkdtemp(prefix=f"loop-costs-{variant.strip('+')}-"))
        index = 1 if variant == "+status" else 0
        report = node_reporter(work, "worker", index, "multi_worker_mirrored")
    meter = Meter(0, global_batch)

    def run(calls: int) -> None:
        out = None
        for _ in range(calls):
            out = call(iterator, tf.constant(STEPS_PER_CALL))
            if fetch:  # what the loop reads for its report, after every call
                loss, step = float(out[0]), int(out[-1])
                if report is not None:
                    meter.input(float(out[1]), float(out[2]))
                    computed = {"compute_seconds": round(float(out[3]), 6)} if compute else {}
                    report(step, loss, meter.tick(step), meter.interval_wait(), **computed)
        float(out[0])

    return run


def start_peers(workers: int) -> list[subprocess.Popen[bytes]]:
    """Workers 1..n-1: this script with the same arguments, each with its TF_CONFIG; this process
    becomes worker 0. Every worker builds and runs the same variants in the same order, so their
    collectives pair up, and the whole cluster runs one variant at a time."""
    cluster = loopback_cluster(workers)
    environ = lambda i: dict(os.environ, TF_CONFIG=tf_config(cluster, "worker", i))  # noqa: E731
    peers = [subprocess.Popen([sys.executable, *sys.argv], env=environ(i)) for i in range(1, workers)]
    os.environ["TF_CONFIG"] = tf_config(cluster, "worker", 0)
    return peers


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="digits", choices=["digits", "resnet20"])
    parser.add_argument("--steps", type=int, default=600, help="timed steps per variant and repetition")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--workers", type=int, default=1, help="MWMS workers, each a process")
    args = parser.parse_args()
    peers = start_peers(args.workers) if args.workers > 1 and "TF_CONFIG" not in os.environ else []
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    variants = args.variants.split(",")
    runs = {v: build(v, strategy, args.model) for v in variants}
    for run in runs.values():
        run(args.warmup // STEPS_PER_CALL)
    rates: dict[str, list[float]] = {v: [] for v in variants}
    calls = args.steps // STEPS_PER_CALL
    for _ in range(args.reps):
        for variant, run in runs.items():  # in turn: a slow moment of the machine falls on all alike
            t0 = time.perf_counter()
            run(calls)
            examples = calls * STEPS_PER_CALL * BATCH * args.workers
            rates[variant].append(examples / (time.perf_counter() - t0))
    for peer in peers:
        peer.wait()
    if strategy.cluster_resolver.task_id:
        return  # a peer: worker 0 times the cluster
    base = statistics.mean(rates[variants[0]])
    shape = f"batch {BATCH} a worker, {STEPS_PER_CALL} steps a call, {args.steps} steps x {args.reps} reps"
    print(f"{args.model}, {args.workers} worker(s), {shape}")
    print(f"{'variant':<15}{'examples/s':>20}{'x ' + variants[0]:>12}")
    for variant, got in rates.items():
        mean, sd = statistics.mean(got), statistics.stdev(got) if len(got) > 1 else 0.0
        print(f"{variant:<15}{f'{mean:.0f} ± {sd:.0f}':>20}{mean / base:>12.3f}")


if __name__ == "__main__":
    main()

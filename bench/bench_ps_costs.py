"""Where the built-in parameter-server loop's time goes (issue 59): the coordinator loop of
TensorFlow's parameter-server guide, then dlinfra's loop's differences added one at a time, in one
chief process against one set of servers, each variant timed in turn within every repetition (so
load on a shared machine falls on all alike).

- hand: the guide's loop (bench_anchors.hand_ps): every call scheduled, then one join;
- +graph: dlinfra's remote call (parameter_servers.counted_steps: its pipeline, its loss, the input
  clock, the applied-steps counter and the per-worker tally on the ps, the worker's index read where
  it runs, four figures returned), still every call scheduled, then one join;
- +pacing: dlinfra's chief: a chunk of `log_every` steps at a time, a few chunks queued
  (pacing.queue_depth over pacing.ChunkClock), the loop waiting on each chunk's last call;
- +report: the chief's progress report after every chunk (node.reporting.Progress: status file, log
  line, TensorBoard scalars and their sync to a file store). That is dlinfra's chief as it runs.

The ps and the workers are dlinfra's serving nodes (node.serving.start_server, lean), local
processes with TF_CONFIG. Examples/s are mean ± sd over `--reps`; each variant's ratio is to `hand`.

    python bench/bench_ps_costs.py [--workers 1] [--steps 600] [--reps 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
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

from bench_anchors import BATCH, STEPS_PER_CALL, guide_ps_steps, loopback_cluster, tf_config, training
from node_report import node_reporter

VARIANTS = ["hand", "+graph", "+pacing", "+report"]
LOG_EVERY = STEPS_PER_CALL  # one call per chunk, as bench_anchors' dlinfra-ps rows run


def serve(role: str, index: int) -> None:
    from dlinfra.node.serving import start_server

    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    start_server(cluster, role, index, 0, lean=True).join()


def servers(workers: int, home: Path) -> tuple[dict[str, list[str]], list[subprocess.Popen[bytes]]]:
    """The ps and the workers, each in a directory of its own holding its worker index (what
    dlinfra's remote call reads where it runs, as a node's work dir does)."""
    from dlinfra.contract import WORKER_INDEX_FILE

    cluster = loopback_cluster(workers, parameter_servers=True)
    procs = []
    for role, index in [("ps", 0)] + [("worker", i) for i in range(workers)]:
        work = home / f"{role}-{index}"
        work.mkdir()
        (work / WORKER_INDEX_FILE).write_text(str(index))
        env = dict(os.environ, TF_CONFIG=tf_config(cluster, role, index))
        argv = [sys.executable, __file__, "_serve", role, str(index)]
        procs.append(subprocess.Popen(argv, env=env, cwd=work, stderr=subprocess.DEVNULL))
    return cluster, procs


def build(variant: str, strategy: Any, coordinator: Any, workers: int, home: Path) -> Callable[[int], None]:
    """The variant's model, optimizer, iterator and loop; returns `run(steps)`."""
    import keras
    import tensorflow as tf

    from dlinfra.training import fit_check
    from dlinfra.training.loop import batched
    from dlinfra.training.meter import InputClock, Meter
    from dlinfra.training.pacing import ChunkClock, queue_depth
    from dlinfra.training.parameter_servers import counted_steps
    from dlinfra.training.program import Shard, builtin_program

    rank = VARIANTS.index(variant)
    program = builtin_program(training("digits"), home / f"data-{variant.strip('+')}")
    goal = fit_check.first_batch(program, BATCH)
    with strategy.scope():
        net = program.build_model()
        optimizer = keras.optimizers.Adam(0.001)
        optimizer.build(net.trainable_variables)
        applied = tf.Variable(0, dtype=tf.int64, trainable=False)
        tally = tf.Variable(tf.zeros([workers, 2], tf.float64), trainable=False)

    if rank == 0:
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def dataset_fn() -> Any:
            ds = program.train_data(Shard(0, 1)).shuffle(4096).repeat()
            return ds.batch(BATCH, drop_remainder=True).prefetch(2)

        train_steps = guide_ps_steps(strategy, net, optimizer, loss_fn)

    else:

        def dataset_fn() -> Any:
            return batched(program.train_data(Shard(0, 1)), BATCH, shuffle_seed=None)

        train_steps = counted_steps(strategy, net, optimizer, goal, applied, tally, InputClock())

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    n = tf.constant(STEPS_PER_CALL)

    def scheduled_all(steps: int) -> None:
        for _ in range(steps // STEPS_PER_CALL):
            coordinator.schedule(train_steps, args=(iterator, n))
        coordinator.join()

    if rank < VARIANTS.index("+pacing"):
        return scheduled_all

    reports = rank >= VARIANTS.index("+report")
    report = node_reporter(home / "chief-report", "chief", 0, "parameter_server") if reports else None
    meter = Meter(0, BATCH)

    def paced(steps: int) -> None:
        """parameter_servers.train_parameter_server's scheduling and fetching, without a checkpoint."""
        in_flight: collections.deque[Any] = collections.deque()
        clock = ChunkClock(workers, time.monotonic())
        depth = queue_depth(math.inf, workers, 1)
        scheduled = 0
        while scheduled < steps or in_flight:
            while scheduled < steps and len(in_flight) < depth:
                in_flight.append(coordinator.schedule(train_steps, args=(iterator, n)))
                scheduled += LOG_EVERY
            fetched, count, waited, busy = in_flight.popleft().fetch()
            chunk_seconds, _ = clock.fetched(time.monotonic(), LOG_EVERY)
            depth = queue_depth(chunk_seconds, workers, 1)
            meter.input(waited, busy)
            if report is not None:
                report(int(count), float(fetched), meter.tick(int(count)), meter.interval_wait())
        coordinator.join()

    return paced


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=600, help="timed steps per variant and repetition")
    parser.add_argument("--warmup", type=int, default=120)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ps-costs-"))
    cluster, procs = servers(args.workers, home)
    os.environ["TF_CONFIG"] = tf_config(cluster, "chief", 0)
    try:
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        variants = args.variants.split(",")
        runs = {v: build(v, strategy, coordinator, args.workers, home) for v in variants}
        for run in runs.values():
            run(args.warmup)
        rates: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.reps):
            for variant, run in runs.items():  # in turn: a slow moment of the machine falls on all alike
                t0 = time.perf_counter()
                run(args.steps)
                rates[variant].append(args.steps * BATCH / (time.perf_counter() - t0))
        _print(args, rates)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    os._exit(0)  # the coordinator's threads would only report the servers gone at exit


def _print(args: argparse.Namespace, rates: dict[str, list[float]]) -> None:
    variants = list(rates)
    base = statistics.mean(rates[variants[0]])
    shape = f"batch {BATCH}, {STEPS_PER_CALL} steps per call, {args.steps} steps x {args.reps} reps"
    print(f"digits, parameter servers, {args.workers} worker(s) and 1 ps, {shape}")
    print(f"{'variant':<15}{'examples/s':>20}{'x ' + variants[0]:>12}")
    for variant, got in rates.items():
        mean, sd = statistics.mean(got), statistics.stdev(got) if len(got) > 1 else 0.0
        print(f"{variant:<15}{f'{mean:.0f} ± {sd:.0f}':>20}{mean / base:>12.3f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["_serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        main()

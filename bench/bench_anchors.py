"""Throughput against the anchors a user would otherwise pick, side by side in one run:

- keras-fit: the best single-process Keras 3, `model.fit` with steps_per_execution, with and without
  jit_compile (the faster one is the anchor);
- hand-ps / hand-mwms: TensorFlow's parameter-server and multi-worker-mirrored strategies written the
  way the distributed training guides show (ClusterCoordinator.schedule; strategy.run inside a
  tf.function), as local processes with TF_CONFIG: the same strategy without dlinfra;
- dlinfra-ps / dlinfra-mwms: `dlinfra deploy`, the same model, data, batch and steps per call;
  dlinfra-ps-auto: dlinfra's defaults (steps_per_execution auto, a report every 20 steps).
- hand-mwms-jit / dlinfra-mwms-jit (by name in --configs): each replica's step compiled with XLA.
- dlinfra-ps-host / dlinfra-mwms-host (by name in --configs): the nodes on the host's loopback
  (cluster.local_network: host), as the hand-written programs are, instead of a private network.

Same model and data for all (dlinfra's model builders: the digits CNN, and ResNet-20 on synthetic
CIFAR-shaped data), batch 64 per worker, `--steps` timed after `--warmup` steps. Examples/s is mean
± sd over `--reps` repetitions, each of which runs every configuration of a cell (model, workers)
once, in turn, so that the machine's drift falls on them alike (each dlinfra configuration's ratio
to the hand-written program of its strategy is also given rep by rep, with its spread); CPU is the
whole process tree's CPU time over its wall time and the machine's cores (start-up included);
bytes/step is what a worker moves per step, from the variables' sizes (ps: reads every variable and
sends every gradient; mwms: a ring all-reduce of the gradients).

    python bench/bench_anchors.py [--models digits,resnet20] [--workers 1,2,3] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    "digits": {"model": {"name": "cnn"}, "dataset": {"format": "digits"}},
    "resnet20": {
        "model": {"name": "resnet20"},
        "dataset": {"format": "synthetic", "shape": [32, 32, 3], "classes": 10, "size": 4096},
    },
}
BATCH = 64
STEPS_PER_CALL = 10  # steps per schedule() call or per tf.function call, as dlinfra's default


def training(model: str) -> Any:
    from dlinfra.spec.training import TrainingSpec

    return TrainingSpec.model_validate({**MODELS[model], "batch_size": BATCH, "learning_rate": 0.001})


# ---------------------------------------------------------------- the programs (one process each)


def keras_fit(model: str, warmup: int, steps: int, jit: bool) -> float:
    import keras
    import tensorflow as tf

    from dlinfra.training.program import Shard, builtin_program

    program = builtin_program(training(model), Path(tempfile.mkdtemp()))
    net = program.build_model()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    net.compile(keras.optimizers.Adam(0.001), loss, steps_per_execution=STEPS_PER_CALL, jit_compile=jit)
    data = program.train_data(Shard(0, 1)).shuffle(4096).repeat().batch(BATCH, drop_remainder=True)
    data = data.prefetch(tf.data.AUTOTUNE)
    net.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0)
    t0 = time.perf_counter()
    net.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    return steps * BATCH / (time.perf_counter() - t0)


def mirrored_model(strategy: Any, model: str) -> tuple[Any, Any, Any]:
    """(dlinfra's program of `model`, its Keras model and a built Adam, both in the strategy's scope)."""
    import keras

    from dlinfra.training.program import builtin_program

    program = builtin_program(training(model), Path(tempfile.mkdtemp()))
    with strategy.scope():
        net = program.build_model()
        optimizer = keras.optimizers.Adam(0.001)
        optimizer.build(net.trainable_variables)
    return program, net, optimizer


def hand_mwms(model: str, warmup: int, steps: int, jit: bool = False) -> float:
    """The Keras-with-a-custom-loop program of TensorFlow's multi-worker tutorial (`jit`: the
    replica's forward and backward pass compiled with XLA, the all-reduce outside it)."""
    import keras
    import tensorflow as tf

    from dlinfra.training.program import Shard

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    program, net, optimizer = mirrored_model(strategy, model)
    global_batch = BATCH * strategy.num_replicas_in_sync
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def dataset_fn(ctx: Any) -> Any:
        shard = Shard(ctx.input_pipeline_id, ctx.num_input_pipelines)
        ds = program.train_data(shard).shuffle(4096).repeat()
        return ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True).prefetch(2)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function(jit_compile=jit)
    def gradients(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, net(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        return loss, tape.gradient(loss, net.trainable_variables)

    @tf.function
    def train_steps(it: Any, n: Any) -> Any:
        def step(x: Any, y: Any) -> Any:
            loss, grads = gradients(x, y)
            optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))
            return loss

        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = strategy.reduce("SUM", strategy.run(step, args=next(it)), axis=None)
        return loss

    float(train_steps(iterator, tf.constant(warmup)))
    t0 = time.perf_counter()
    for _ in range(steps // STEPS_PER_CALL):
        loss = train_steps(iterator, tf.constant(STEPS_PER_CALL))
    float(loss)
    return steps * global_batch / (time.perf_counter() - t0)


def hand_ps(model: str, warmup: int, steps: int) -> float:
    """The coordinator of TensorFlow's parameter-server tutorial (a custom loop over schedule())."""
    import keras
    import tensorflow as tf

    from dlinfra.training.program import Shard, builtin_program

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    program = builtin_program(training(model), Path(tempfile.mkdtemp()))
    with strategy.scope():
        net = program.build_model()
        optimizer = keras.optimizers.Adam(0.001)
        optimizer.build(net.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def dataset_fn() -> Any:
        ds = program.train_data(Shard(0, 1)).shuffle(4096).repeat()
        return ds.batch(BATCH, drop_remainder=True).prefetch(2)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    train_steps = guide_ps_steps(strategy, net, optimizer, loss_fn)

    def run(count: int) -> None:
        for _ in range(count // STEPS_PER_CALL):
            coordinator.schedule(train_steps, args=(iterator, tf.constant(STEPS_PER_CALL)))
        coordinator.join()

    run(warmup)
    t0 = time.perf_counter()
    run(steps)
    return steps * BATCH / (time.perf_counter() - t0)


def guide_ps_steps(strategy: Any, net: Any, optimizer: Any, loss_fn: Any) -> Any:
    """The parameter-server guide's remote call: `n` steps from iterator `it`, the last loss back."""
    import tensorflow as tf

    @tf.function
    def train_steps(it: Any, n: Any) -> Any:
        def step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, net(x, training=True))
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))
            return loss

        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = strategy.run(step, args=next(it))
        return loss

    return train_steps


def serve(role: str, index: int) -> None:
    import tensorflow as tf

    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=role, task_index=index, start=True).join()


# ---------------------------------------------------------------- running them


def measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], float]:
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL), time.time()


def cpu_share(proc: subprocess.Popen[bytes], started: float) -> float:
    """The tree's CPU seconds over its wall seconds and the machine's cores (wait4: every descendant
    the tree waited for is counted)."""
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return (usage.ru_utime + usage.ru_stime) / (time.time() - started) / (os.cpu_count() or 1)


def run_keras(model: str, warmup: int, steps: int, jit: bool) -> tuple[float, float]:
    proc, t0 = measured([sys.executable, __file__, "_keras", model, str(warmup), str(steps), str(int(jit))])
    out = proc.stdout.read() if proc.stdout else b""
    return float(out.split()[-1]), cpu_share(proc, t0)


def run_hand(kind: str, model: str, workers: int, warmup: int, steps: int, jit: bool) -> tuple[float, float]:
    """Workers (and for ps: one ps) as servers, the chief (ps) or every worker (mwms) training; all
    children of one launcher process, so one wait4 counts their CPU."""
    cluster = loopback_cluster(workers, parameter_servers=kind == "ps")
    run = {"kind": kind, "model": model, "warmup": warmup, "steps": steps, "jit": jit}
    spec = json.dumps({"cluster": cluster, **run})
    proc, t0 = measured([sys.executable, __file__, "_launch", spec])
    out = proc.stdout.read() if proc.stdout else b""
    return float(out.split()[-1]), cpu_share(proc, t0)


def loopback_cluster(workers: int, parameter_servers: bool = False) -> dict[str, list[str]]:
    """A TF cluster of local processes on free loopback ports: `workers` workers, and with
    `parameter_servers` a chief and one ps (the benches' clusters; dlinfra's own come from its
    renderer)."""
    from dlinfra.render.addresses import free_ports

    ports = free_ports(workers + 2)
    address = lambda: f"127.0.0.1:{next(ports)}"  # noqa: E731
    cluster = {"worker": [address() for _ in range(workers)]}
    if parameter_servers:
        cluster |= {"chief": [address()], "ps": [address()]}
    return cluster


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})


def launch(spec: dict[str, Any]) -> None:
    cluster, kind = spec["cluster"], spec["kind"]
    tasks = [(role, i) for role in cluster for i in range(len(cluster[role]))]
    trainer = ("chief", 0) if kind == "ps" else ("worker", 0)
    procs = {}
    for role, i in tasks:
        env = dict(os.environ, TF_CONFIG=tf_config(cluster, role, i))
        serves = kind == "ps" and role != "chief"
        work = ["_" + kind, spec["model"], str(spec["warmup"]), str(spec["steps"]), str(int(spec["jit"]))]
        argv = ["_serve", role, str(i)] if serves else work
        procs[(role, i)] = subprocess.Popen(
            [sys.executable, __file__, *argv], env=env, stdout=subprocess.PIPE
        )
    out = procs[trainer].stdout.read() if procs[trainer].stdout else b""
    for proc in procs.values():
        if proc.poll() is None and kind == "ps":
            proc.kill()  # servers never end by themselves
        proc.wait()
    print(out.decode().split()[-1])


def run_dlinfra(
    strategy: str, model: str, workers: int, warmup: int, steps: int, suffix: str
) -> tuple[float, float]:
    """`suffix` jit: XLA; auto: steps_per_execution auto with the default log_every (20), which caps
    its calls; otherwise 10 steps per call and per report, as the hand-written programs; host: the
    nodes on the host's network."""
    home = tempfile.mkdtemp()
    spec = Path(home) / "exp.yaml"
    body = {"name": "anchor", "strategy": strategy, "training": {**MODELS[model], "batch_size": BATCH}}
    body["training"] |= {"learning_rate": 0.001, "steps": warmup + steps, "log_every": STEPS_PER_CALL}
    body["training"] |= {"checkpoint_every": warmup + steps, "steps_per_execution": STEPS_PER_CALL}
    body["training"] |= {"jit_compile": suffix == "jit"}
    if suffix == "auto":
        body["training"] |= {"steps_per_execution": "auto", "log_every": 20}
    if suffix == "host":  # the nodes on the host's loopback, as the hand-written programs are
        body["cluster"] = {"local_network": "host"}
    spec.write_text(json.dumps(body))
    argv = [sys.executable, "-m", "dlinfra", "deploy", str(spec), "--workers", str(workers)]
    proc, t0 = measured(argv, dict(os.environ, DLINFRA_HOME=home))
    if proc.stdout:
        proc.stdout.read()
    cpu = cpu_share(proc, t0)
    run_dir = next((Path(home) / "runs").iterdir())
    metrics = json.loads((run_dir / "store" / "metrics.json").read_text())
    series = [(t, s) for t, s, _ in metrics["examples_per_sec_series"]]
    (t1, s1), (t2, s2) = next(p for p in series if p[1] >= warmup), series[-1]
    return (s2 - s1) * metrics["global_batch"] / (t2 - t1), cpu


def bytes_per_step(model: str, workers: int) -> dict[str, int]:
    from dlinfra.training.program import builtin_program

    net = builtin_program(training(model), Path(tempfile.mkdtemp())).build_model()
    size = sum(int(v.numpy().nbytes) for v in net.trainable_variables)
    return {"ps": 2 * size, "mwms": int(2 * (workers - 1) / workers * size)}


def configuration(name: str, model: str, workers: int, warmup: int, steps: int) -> tuple[float, float]:
    """`hand-mwms`, `dlinfra-ps`, …; a `-jit` suffix (mwms only) compiles each replica's step with XLA;
    `dlinfra-ps-auto` lets dlinfra size its remote calls."""
    who, kind, *suffix = name.split("-")
    if who == "hand":
        return run_hand(kind, model, workers, warmup, steps, suffix == ["jit"])
    strategy = {"mwms": "multi_worker_mirrored", "ps": "parameter_server"}[kind]
    return run_dlinfra(strategy, model, workers, warmup, steps, "".join(suffix))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    listed = lambda text: [x for x in text.split(",") if x]  # noqa: E731
    parser.add_argument("--models", type=listed, default=["digits", "resnet20"])
    parser.add_argument("--workers", type=lambda t: [int(n) for n in listed(t)], default=[1, 2, 3])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--configs",
        type=listed,
        default=["hand-mwms", "dlinfra-mwms", "hand-ps", "dlinfra-ps", "dlinfra-ps-auto"],
    )
    parser.add_argument("--steps", type=listed, default=[], help="model=steps, e.g. resnet20=60")
    args = parser.parse_args()
    steps = {"digits": 600, "resnet20": 100} | {k: int(v) for k, v in (kv.split("=") for kv in args.steps)}
    header = f"{'model':<9} {'configuration':<16} {'workers':>7} {'examples/s':>17} {'x best keras':>12}"
    print(f"{header} {'CPU %':>6} {'bytes/step':>11}", flush=True)
    for model in args.models:
        n, warmup = steps[model], max(STEPS_PER_CALL, steps[model] // 5)
        keras_runs = {f"keras-fit{'-jit' if jit else ''}": jit for jit in (False, True)}
        keras_rows = interleaved(
            {name: partial(run_keras, model, warmup, n, jit) for name, jit in keras_runs.items()},
            args.reps,
        )
        best = max(statistics.mean(eps for eps, _ in results) for results in keras_rows.values())
        for name, results in keras_rows.items():
            _print(model, name, 1, results, best, None)
        for workers in args.workers:
            moved = bytes_per_step(model, workers)
            runs = {name: partial(configuration, name, model, workers, warmup, n) for name in args.configs}
            cell = interleaved(runs, args.reps)
            for name, results in cell.items():
                _print(model, name, workers, results, best, moved[name.split("-")[1]])
            for line in against_hand(cell):
                print(f"{model:<9} {line}", flush=True)


def interleaved(
    runs: dict[str, Callable[[], tuple[float, float]]], reps: int
) -> dict[str, list[tuple[float, float]]]:
    """Each rep runs every configuration once, in turn: the hour's drift (a slower machine, a
    neighbour's job) falls on all configurations of a cell alike instead of between their rows."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            results[name].append(run())
    return results


def against_hand(cell: dict[str, list[tuple[float, float]]]) -> list[str]:
    """Each dlinfra configuration over the hand-written program of its strategy, rep by rep: a rep's
    two runs share its moment of the machine, so the spread of their ratio is the noise left in the
    cell's ratio. A ratio within that spread of 1 does not tell the two apart."""
    lines = []
    for name, results in cell.items():
        who, kind, *suffix = name.split("-")
        hand = cell.get("-".join(["hand", kind, *(["jit"] if suffix == ["jit"] else [])]))
        if who != "dlinfra" or hand is None:
            continue
        ratios = [ours[0] / theirs[0] for ours, theirs in zip(results, hand, strict=True)]
        sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        lines.append(f"{name} ÷ hand, paired by rep: {statistics.mean(ratios):.3f} ± {sd:.3f}")
    return lines


def _print(
    model: str, name: str, workers: int, results: list[tuple[float, float]], best: float, moved: int | None
) -> None:
    eps = [r[0] for r in results]
    sd = statistics.stdev(eps) if len(eps) > 1 else 0.0
    mean, cpu = statistics.mean(eps), statistics.mean(r[1] for r in results)
    bytes_text = "-" if moved is None else f"{moved:,}"
    print(
        f"{model:<9} {name:<16} {workers:>7} {mean:>9.0f} ± {sd:<5.0f} {mean / best:>12.2f} "
        f"{100 * cpu:>6.0f} {bytes_text:>11}",
        flush=True,
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        role, rest = sys.argv[1], sys.argv[2:]
        if role == "_keras":
            print(keras_fit(rest[0], int(rest[1]), int(rest[2]), bool(int(rest[3]))))
        elif role == "_serve":
            serve(rest[0], int(rest[1]))
        elif role == "_launch":
            launch(json.loads(rest[0]))
        else:
            if role == "_mwms":
                eps = hand_mwms(rest[0], int(rest[1]), int(rest[2]), bool(int(rest[3])))
            else:
                eps = hand_ps(rest[0], int(rest[1]), int(rest[2]))
            print(eps if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0 else 0.0)
    else:
        main()

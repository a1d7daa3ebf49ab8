"""Input at scale, side by side in one run: how fast a packed set reaches TensorFlow, against the raw
read of the same bytes.

- raw local: every shard's bytes read from disk (what `cat` does), page cache warm;
- pipeline local, raw records: `Shard.records()` alone (TFRecord framing and its CRC, no parsing);
- pipeline local: `Shard.records()` and the built-in parser (JPEG decode, in TensorFlow ops) over the
  same files, counted in records and in the files' bytes;
- raw s3: a parallel boto3 download of every shard from a moto server (whole objects, 8 at once:
  moto re-reads a whole object for each ranged GET, so ranges are not measured against it);
- staging s3: what a node does before it trains (training.staging.stage: the same objects, checked
  against their sha256), to local disk;
- streamed s3: the same objects through the least cache `cache_gb` allows (5 files: training.streaming),
  from an empty disk until every raw record is read once: the time to the first record, and the
  most bytes on disk at once;
- dispatched s3: the same, the files taken from a tf.data dispatcher as parameter-server workers take
  them (training.dispatch.dispatched_records: the tf.data service moves the records);
- feeding ResNet-20: the local pipeline into real training steps on this CPU, with the input-wait
  share the training loops report (training.meter.InputClock);
- peak RSS of this process and the bytes staged on disk.

The set is CIFAR-shaped (32x32x3) random images, JPEG-encoded, in `--shards` train shards.

    python bench/bench_input.py [--images 8192] [--shards 16] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def packed_set(root: Path, images: int, shards: int) -> Any:
    import numpy as np

    from dlinfra.runs.store_url import open_store
    from dlinfra.training import shards as packing

    rng = np.random.default_rng(0)
    x = rng.random((images, 32, 32, 3), dtype="float32")
    y = rng.integers(0, 10, images)
    held = images // 8
    source = packing.array_source("cifar-shaped", x[held:], y[held:], x[:held], y[:held], "jpeg")
    return packing.pack(source, open_store(f"file://{root}"), shards, max(1, shards // 8))


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30, help="ResNet-20 steps fed by the pipeline")
    args = parser.parse_args()
    os.environ.update(CREDS)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import boto3
    import keras
    import tensorflow as tf
    from moto.server import ThreadedMotoServer

    from dlinfra.render.addresses import free_ports
    from dlinfra.runs.store_url import open_store
    from dlinfra.spec.dataset import DatasetSpec
    from dlinfra.spec.layers import ModelSpec
    from dlinfra.spec.training import TrainingSpec
    from dlinfra.training import dispatch, gates, staging, streaming
    from dlinfra.training.meter import InputClock, Meter
    from dlinfra.training.packed import packed_program
    from dlinfra.training.program import Shard

    work = Path(tempfile.mkdtemp(prefix="bench-input-"))
    manifest = packed_set(work / "packed", args.images, args.shards)
    train = manifest.splits["train"].shards
    files = [work / "packed" / s.name for s in train]
    size = sum(s.bytes for s in train)
    rows: list[tuple[str, float, str]] = []

    seconds, _ = timed(lambda: [p.read_bytes() for p in files])
    rows.append(("raw local (read every shard)", size / seconds / 1e6, ""))

    staged = work / "node"
    (staged / staging.TRAIN_DIR).mkdir(parents=True)
    for p in files:
        (staged / staging.TRAIN_DIR / p.name).write_bytes(p.read_bytes())
    os.chdir(staged)  # what the agent does: staged paths are relative to the work dir
    training = TrainingSpec(
        model=ModelSpec(name="resnet20"), dataset=DatasetSpec(format="tfrecord", uri=f"file://{work}/packed")
    )
    program = packed_program(training, manifest)
    raw_records = Shard(0, 1, staging.TRAIN_PATTERN).records()
    sum(1 for _ in raw_records.take(256))  # warm-up
    seconds, _ = timed(lambda: sum(1 for _ in raw_records.batch(256).prefetch(tf.data.AUTOTUNE)))
    rows.append(("pipeline local (raw records, no parsing)", size / seconds / 1e6, "Shard.records()"))
    pipeline = program.train_data(Shard(0, 1, staging.TRAIN_PATTERN))
    count = sum(1 for _ in pipeline.take(256))  # warm-up: the graph and the files in the page cache
    seconds, count = timed(lambda: sum(1 for _ in pipeline.batch(256).prefetch(tf.data.AUTOTUNE)))
    records = manifest.splits["train"].records
    assert count * 256 >= records - 256, (count, records)
    rows.append(
        ("pipeline local (records, JPEG decoded)", size / seconds / 1e6, f"{records / seconds:.0f} records/s")
    )

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="bench-data")
    store = open_store("s3://bench-data/packed", endpoint)
    for p in [*files, work / "packed" / "manifest.json"]:
        store.put_file(p.name, p)
    down = work / "raw-s3"
    down.mkdir()

    def get(name: str) -> None:
        s3.download_fileobj("bench-data", f"packed/{name}", open(down / name, "wb"))  # noqa: SIM115

    with ThreadPoolExecutor(max_workers=staging.PARALLEL_OBJECTS) as pool:
        seconds, _ = timed(lambda: list(pool.map(get, [s.name for s in train])))
    rows.append(("raw s3 (boto3, 8 objects at once)", size / seconds / 1e6, ""))
    seconds, _ = timed(lambda: staging.stage(store, train, work / "staged-s3"))
    rows.append(("staging s3 (dlinfra: checked, to disk)", size / seconds / 1e6, ""))

    # streamed, from an empty disk until every record is read once: through the least cache allowed
    # (5 files: the reader holds 4), and through a cache that holds every file
    least = (gates.READ_PARALLEL + 1) * max(s.bytes for s in train)
    for budget, what in ((least, "5-file cache"), (size, "cache holds all")):
        into = work / f"streamed-{budget}"
        into.mkdir()
        os.chdir(into)
        began = time.perf_counter()
        stream = streaming.Stream(store, train, into, budget).start()
        batches = iter(gates.gated_records().batch(256).prefetch(tf.data.AUTOTUNE))
        read = len(next(batches))
        to_first = time.perf_counter() - began
        read += sum(len(batch) for batch in batches)
        seconds = time.perf_counter() - began
        stream.stop()
        assert read == records, (read, records)
        note = (
            f"first 256 at {to_first:.2f}s; at most {stream.peak / 1e6:.1f} MB on disk, {stream.fetches} GETs"
        )
        rows.append((f"streamed s3 (raw records, {what})", size / seconds / 1e6, note))

    # dispatched (parameter servers): the same, the files taken from a tf.data dispatcher by one
    # worker's data worker (both in this process), through the least cache
    service = tf.data.experimental.service
    address = f"127.0.0.1:{next(free_ports(1))}"
    handout = dispatch.Dispatch.of(manifest, address, seed=1)
    dispatcher = dispatch.start_dispatcher(handout)
    data_worker = service.WorkerServer(service.WorkerConfig(address, worker_address="127.0.0.1:%port%"))
    into = work / "dispatched"
    into.mkdir()
    os.chdir(into)
    began = time.perf_counter()
    stream = streaming.Stream(store, train, into, least, ordered=False).start()
    batches = iter(dispatch.dispatched_records(handout).take(records).batch(256).prefetch(tf.data.AUTOTUNE))
    read = len(next(batches))
    to_first = time.perf_counter() - began
    read += sum(len(batch) for batch in batches)
    seconds = time.perf_counter() - began
    stream.stop()
    data_worker.stop()
    dispatcher.stop()
    assert read == records, (read, records)
    note = f"first 256 at {to_first:.2f}s; at most {stream.peak / 1e6:.1f} MB on disk, {stream.fetches} GETs"
    rows.append(("dispatched s3 (raw records, 5-file cache)", size / seconds / 1e6, note))
    os.chdir(staged)

    model = program.build_model()
    optimizer = keras.optimizers.SGD(0.01)
    it = iter(pipeline.shuffle(1024).repeat().batch(64).prefetch(tf.data.AUTOTUNE))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    clock = InputClock()

    @tf.function
    def steps(it: Any, n: Any) -> Any:
        began, waited = clock.start()
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            (x, y), waited = clock.next(it, waited, loss)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            variables = model.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return waited, clock.since(began, (loss, waited))

    steps(it, tf.constant(2))  # tracing
    meter = Meter(0, 64)
    seconds, (waited, busy) = timed(lambda: steps(it, tf.constant(args.steps)))
    meter.input(float(waited), float(busy))
    rows.append(
        ("feeding ResNet-20 (64 a step)", 64 * args.steps / seconds, f"input wait {meter.input_wait:.1%}")
    )
    server.stop()

    on_disk = sum(p.stat().st_size for p in (work / "staged-s3").glob("*.tfrecord"))
    print(
        f"\n{records} train records in {len(train)} shards, {size / 1e6:.1f} MB "
        f"({size / records:.0f} B a record)"
    )
    print(f"{'path':42} {'MB/s':>9}  note")
    for name, rate, note in rows:
        unit = "" if "ResNet" not in name else " (examples/s)"
        print(f"{name:42} {rate:9.1f}  {note}{unit}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB; staged on disk {on_disk / 1e6:.1f} MB (the whole share, no cache_gb)")


if __name__ == "__main__":
    main()

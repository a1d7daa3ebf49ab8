"""Train files handed out by the chief's tf.data dispatcher under parameter servers: each worker takes
the next file as it is free (ShardingPolicy DYNAMIC), so a faster worker reads more of them. The files
still come through each node's bounded cache (training.streaming) and its gates (training.gates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlinfra.training.gates import GATES_DIR, READ_PARALLEL, WANTED_DIR, gated_file
from dlinfra.training.shards import ShardManifest
from dlinfra.training.staging import local_name

RECORDS_PER_ELEMENT = 64  # records the tf.data service moves at once (dispatched_records)


@dataclass(frozen=True)
class Dispatch:
    """Where parameter-server workers take train files as they are free: the chief's dispatcher."""

    dispatcher: str  # host:port
    files: tuple[str, ...]  # every train file's local name, in the order every node lists them
    seed: int  # each pass's order of the files

    @classmethod
    def of(cls, manifest: ShardManifest, dispatcher: str, seed: int) -> Dispatch:
        return cls(
            dispatcher,
            tuple(sorted(local_name(s, "tfrecord") for s in manifest.splits["train"].shards)),
            seed,
        )


def start_dispatcher(dispatch: Dispatch) -> Any:
    """The chief's tf.data dispatcher, started before the chief waits for its peers: each worker's
    data worker registers with it before the worker serves (node.serving.start_data_worker)."""
    import tensorflow as tf

    service = tf.data.experimental.service
    port = int(dispatch.dispatcher.rpartition(":")[2])
    # the train job lives as long as the run: by default one unread for minutes (its workers paused
    # or restarting) is collected, and readers of a collected job end early (OUT_OF_RANGE)
    server = service.DispatchServer(service.DispatcherConfig(port=port, job_gc_timeout_ms=-1))
    print(f"tf.data dispatcher at {dispatch.dispatcher}: {len(dispatch.files)} train files", flush=True)
    return server


def dispatched_records(dispatch: Dispatch, compression: str = "") -> Any:
    """The reader's side under parameter servers: the raw records of the train files, each read by
    whichever worker asks the chief's tf.data dispatcher first (ShardingPolicy DYNAMIC), so a faster
    worker reads more files. The splits are file numbers of an endless sequence of passes, each pass
    a fresh permutation of the files: every file is handed out once per pass, pass after pass."""
    import tensorflow as tf

    gates = tf.constant([f"{GATES_DIR}/{name}" for name in dispatch.files])
    n = len(dispatch.files)
    seed = dispatch.seed

    def take(i: Any) -> Any:
        """Split i: its file's gate, once `wanted/<pass>-<file>` tells the agent it may fetch it."""
        order = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=[seed, i // n])
        path = tf.gather(gates, order[i % n])
        name = tf.strings.regex_replace(path, f"{GATES_DIR}/", "")
        marked = tf.strings.join([str(WANTED_DIR), "/", tf.strings.as_string(i // n), "-", name])
        return (tf.io.write_file(marked, ""), path)[1]

    service = tf.data.experimental.service
    return (
        tf.data.Dataset.range(2**62)  # a source the dispatcher can split: one split per file
        .map(take)
        .prefetch(READ_PARALLEL)
        .interleave(lambda path: gated_file(path, compression), cycle_length=READ_PARALLEL)
        .batch(RECORDS_PER_ELEMENT)  # the service moves elements one by one: fewer, larger ones
        .apply(
            service.distribute(
                service.ShardingPolicy.DYNAMIC,
                service=f"grpc://{dispatch.dispatcher}",
                job_name="train",  # one job for every worker: the files are shared out, not repeated
                target_workers="LOCAL",  # each worker reads the files it took, on its own disk
            )
        )
        .unbatch()
    )

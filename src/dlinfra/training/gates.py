"""The reader's side of a streamed train set: its gates and markers, in TensorFlow ops alone.

A parameter-server worker's pipeline runs no Python of ours (see training.staging), so the reader
and the node agent (training.streaming.Stream) talk through the file system. For each train file the
agent makes a named pipe (a FIFO) in `gates/`. The reader's pipeline, per file:

  1. writes `asked/<file>@<ask>`: which file it waits for (a restarted reader starts over at file 0);
  2. opens the file's gate: opening a FIFO blocks until the agent opens its other end, which the
     agent does once the file is whole on disk;
  3. writes `passed/<file>@<ask>`: through the gate;
  4. reads the file's records;
  5. writes `done/<file>@<ask>` after its last record: the agent may then evict it.

`<ask>` (the reader's clock) tells one read from another of the same file: two passes over a file
can ask for it at once, and one gate lets through every reader waiting at it. So an ask is retired
by its own `passed`, never by the gate's opening: a reader whose ask was merged into another's, or
removed once the gate had opened for the other, waited at the gate for good (seen: a dispatched
worker took one file for two passes in a row and its pipeline hung there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlinfra.training.staging import SHARDS_DIR, TRAIN_DIR

GATES_DIR = SHARDS_DIR / "gates"
ASKED_DIR = SHARDS_DIR / "asked"
PASSED_DIR = SHARDS_DIR / "passed"
DONE_DIR = SHARDS_DIR / "done"
ASK = "@"  # between a marker's file name and its ask
WANTED_DIR = SHARDS_DIR / "wanted"  # taken from the dispatcher, not yet opened (dispatched_records)
TAKEN_LOG = SHARDS_DIR / "taken.tsv"  # pass and file of each file this node took from the dispatcher
GATE_PATTERN = f"{GATES_DIR}/*"
READ_PARALLEL = 4  # files one input pipeline reads at once (program.Shard.records)


def gated_records(compression: str = "") -> Any:
    """The reader's side: a tf.data.Dataset of the raw records of this node's train files, each file
    read once the agent has it on disk (pure TensorFlow ops: it runs on parameter-server workers).
    `compression`: TFRecordDataset's compression_type."""
    import tensorflow as tf

    # not a parallel interleave: that opens as many files again ahead of the cycle, past the cache
    return tf.data.Dataset.list_files(GATE_PATTERN, shuffle=False).interleave(
        lambda gate: gated_file(gate, compression), cycle_length=READ_PARALLEL
    )


def gated_file(gate: Any, compression: str) -> Any:
    """One train file's records, read once the agent opens its `gate` (see the module's doc)."""
    import tensorflow as tf

    # this read's own name for its markers: microseconds of the clock when the file was asked for
    ask = tf.strings.as_string(tf.timestamp() * 1e6, precision=0)

    def marker(directory: Path) -> Any:
        path = tf.strings.join([beside(directory), ask], separator=ASK)
        # an element that writes a file and is then dropped: a side effect at one point of the stream
        write = tf.data.Dataset.from_tensors(path).map(lambda p: (tf.io.write_file(p, ""), p)[1])
        return write.filter(lambda _: False)

    def beside(directory: Path) -> Any:
        return tf.strings.regex_replace(gate, f"{GATES_DIR}/", f"{directory}/")

    # a FIFO holds no bytes: the gate yields no record, it only waits to be opened
    opened = tf.data.FixedLengthRecordDataset(gate, 1)
    # opened only once the gate has passed
    records = tf.data.TFRecordDataset(beside(TRAIN_DIR), compression_type=compression)
    return (
        marker(ASKED_DIR)
        .concatenate(opened)
        .concatenate(marker(PASSED_DIR))
        .concatenate(records)
        .concatenate(marker(DONE_DIR))
    )

"""Scalars in TensorBoard event files, read and written without TensorFlow's ops: a script's progress
when it calls no dlinfra.report (what `tf.summary.scalar` and Keras' TensorBoard callback write), and
the built-in loop's own scalars (ScalarWriter).

An event file is a sequence of TFRecords (length, its CRC, data, its CRC), each an `Event` protobuf:
`step` (field 2) and a `Summary` (field 5) of values, each a `tag` (1) with a `simple_value` (2, TF1)
or a scalar `tensor` (8, TF2: `float_val`/`double_val` packed, or `tensor_content`). Only what a
scalar needs is decoded; everything else is skipped by its wire type. Files are read from where the
last read stopped, whole records only (a writer may be half way through one).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from dlinfra.runs.local_files import open_beneath, regular_files

# TensorFlow's DataType numbers for the scalars a summary holds
_DTYPES = {1: "<f", 2: "<d", 3: "<i", 9: "<q", 19: "<e"}


@dataclass
class EventScalars:
    """The newest value of every scalar tag under a directory, and the highest step seen."""

    root: Path
    step: int | None = None
    values: dict[str, float] = field(default_factory=dict)
    _offsets: dict[Path, int] = field(default_factory=dict)

    def read(self) -> bool:
        """Read what was appended since the last call; whether anything new was found."""
        found = False
        for listed in regular_files(self.root, "tensorboard").files:  # no link out, no FIFO: class 1
            if not listed.rel.rsplit("/", 1)[-1].startswith("events.out.tfevents."):
                continue
            path = self.root / listed.rel
            rel = path.parent.relative_to(self.root).as_posix()
            prefix = "" if rel == "." else f"{rel}/"
            if (opened := open_beneath(self.root, listed.source)) is None:
                continue
            with opened as fh:
                fh.seek(self._offsets.get(path, 0))
                while (record := _record(fh, listed.size)) is not None:
                    step, scalars = _event(record)
                    if scalars:
                        found = True
                        self.step = step if self.step is None else max(self.step, step)
                        self.values.update({prefix + tag: value for tag, value in scalars.items()})
                    self._offsets[path] = fh.tell()
        return found


class ScalarWriter:
    """Scalars as `tf.summary.scalar` writes them (a scalar tensor of the scalars plugin), built as
    protobufs and appended by TensorBoard's own event writer thread: about 0.1 ms for three, where
    three eager summary ops cost 1.5 ms of Python and the GIL beside the training thread
    (bench/bench_loop_costs.py, +tensorboard)."""

    def __init__(self, directory: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._file = EventFileWriter(str(directory))

    def write(self, step: int, at: float, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        summary: Any = Summary(value=[v for tag, x in values.items() for v in scalar_pb(tag, x).value])
        self._file.add_event(Event(wall_time=at, step=step, summary=summary))

    def flush(self) -> None:
        self._file.flush()


def _record(fh: BinaryIO, size: int) -> bytes | None:
    start = fh.tell()
    header = fh.read(12)
    if len(header) < 12:
        fh.seek(start)
        return None
    (length,) = struct.unpack("<Q", header[:8])
    if start + 16 + length > size:  # not all there yet, or a length no file of this size holds
        fh.seek(start)
        return None
    body = fh.read(length + 4)
    if len(body) < length + 4:  # the writer is still at it: read this record next time
        fh.seek(start)
        return None
    return bytes(body[:length])


def _fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of a protobuf message, one level deep."""
    out: list[tuple[int, int, bytes | int]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            out.append((number, wire, value))
        elif wire == 1:
            out.append((number, wire, data[i : i + 8]))
            i += 8
        elif wire == 2:
            length, i = _varint(data, i)
            out.append((number, wire, data[i : i + length]))
            i += length
        elif wire == 5:
            out.append((number, wire, data[i : i + 4]))
            i += 4
        else:  # groups: not in these messages
            break
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


def _event(data: bytes) -> tuple[int, dict[str, float]]:
    step, scalars = 0, {}
    for number, _, value in _fields(data):
        if number == 2 and isinstance(value, int):
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5 and isinstance(value, bytes):
            for vnum, _, v in _fields(value):
                if vnum == 1 and isinstance(v, bytes) and (found := _value(v)) is not None:
                    scalars[found[0]] = found[1]
    return step, scalars


def _value(data: bytes) -> tuple[str, float] | None:
    tag, number = "", None
    for vnum, _, v in _fields(data):
        if vnum == 1 and isinstance(v, bytes):
            tag = v.decode(errors="replace")
        elif vnum == 2 and isinstance(v, bytes):
            number = struct.unpack("<f", v)[0]
        elif vnum == 8 and isinstance(v, bytes):
            number = _tensor_scalar(v)
    return (tag, float(number)) if tag and number is not None else None


def _tensor_scalar(data: bytes) -> float | None:
    dtype, shape, content, packed = 0, b"", b"", {}
    for number, _, v in _fields(data):
        if number == 1 and isinstance(v, int):
            dtype = v
        elif number == 2 and isinstance(v, bytes):
            shape = v
        elif number == 4 and isinstance(v, bytes):
            content = v
        elif isinstance(v, bytes) and number in (5, 6):
            packed[number] = v
    if shape or dtype not in _DTYPES:  # a non-scalar tensor (an image, a histogram): not progress
        return None
    fmt = _DTYPES[dtype]
    size = struct.calcsize(fmt)
    if len(content) >= size:
        return float(struct.unpack(fmt, content[:size])[0])
    if 5 in packed and len(packed[5]) >= 4:
        return float(struct.unpack("<f", packed[5][:4])[0])
    if 6 in packed and len(packed[6]) >= 8:
        return float(struct.unpack("<d", packed[6][:8])[0])
    return None

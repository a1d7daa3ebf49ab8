"""What a node reads of a packed data set or your own files, before it trains: its share staged
whole (training.staging), or its train files streamed as they are read (training.streaming)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlinfra.contract import NodeConfig
from dlinfra.runs.layout import RunStore
from dlinfra.training.shards import ShardManifest
from dlinfra.training.staging import (
    EVAL_DIR,
    TRAIN_DIR,
    NodeShare,
    checked_records,
    node_set,
    node_shares,
    pin_name,
    size,
    split_store,
    stage,
    stages,
)
from dlinfra.training.streaming import Stream, cache_bytes


@dataclass(frozen=True)
class Staged:
    manifest: ShardManifest
    stream: Stream | None  # the train files, served as the reader asks (training.dataset.cache_gb)


def stage_node(cfg: NodeConfig, run: RunStore, work: Path, starting: Callable[[], None]) -> Staged | None:
    """What this node reads of a packed data set, under `work`: its training share, staged whole or
    streamed through the cache, and the eval shards where it evaluates, staged whole. None when it
    reads no packed set (a ps never does)."""
    if not stages(cfg):
        return None
    starting()
    began = time.monotonic()
    pinned = node_set(cfg, run)
    shares = node_shares(
        pinned.manifest, cfg.strategy, cfg.num_workers, dispatched=cfg.dispatcher is not None
    )
    mine = shares.get(cfg.name, NodeShare([], []))
    # a dispatched worker reads any train file (the chief's fit check reads its one, staged)
    dispatched = mine.every_file
    fmt = pinned.manifest.format
    records = checked_records(cfg)
    held = stage(split_store(cfg, pinned.manifest, "eval"), mine.eval, work / EVAL_DIR, fmt, records)
    cache_gb = cfg.training.dataset.cache_gb
    stream = None
    if cache_gb is None and not dispatched:
        train = stage(split_store(cfg, pinned.manifest, "train"), mine.train, work / TRAIN_DIR, fmt, records)
        what = f"{len(train)} train + {len(held)} eval shards, {size(_bytes(train + held))}, staged"
    else:
        # dispatched with no cache_gb: files stay once read, up to all of them (the plan counted that)
        budget = cache_bytes(cache_gb) if cache_gb is not None else sum(s.bytes for s in mine.train)
        train_store = split_store(cfg, pinned.manifest, "train")

        # the run's verdict is the file and the reason, written before any reader fails: else the
        # first marker is a parameter-server chief's, a remote TensorFlow error of many kB
        def failed(reason: str) -> None:
            run.write_marker("FAILED", node=cfg.name, verdict="data", error=reason, traceback="")

        stream = Stream(train_store, mine.train, work, budget, ordered=not dispatched)
        stream.failed, stream.records = failed, records
        stream.start()
        evicts = "read ones evicted" if stream.evicts else "kept for every epoch"
        what = (
            f"{len(mine.train)} train shards, {size(sum(s.bytes for s in mine.train))}, streamed through "
            f"a {size(budget)} cache ({evicts})"
            + (f"; {len(held)} eval shards, {size(_bytes(held))}, staged" if held else "; stream started")
        )
    print(
        f"data: {pinned.manifest.source} ({pin_name(pinned.manifest)} {pinned.sha256[:12]}): "
        f"{what} in {time.monotonic() - began:.1f}s",
        flush=True,
    )
    return Staged(pinned.manifest, stream)


def _bytes(paths: list[Path]) -> int:
    return sum(path.stat().st_size for path in paths)

"""TensorFlow's checkpoint files as a synced directory sees them, read without TensorFlow (the agent
imports none).

A checkpoint is a family of files sharing a prefix: `ckpt-3.index`, `ckpt-3.data-00000-of-00001`
(one data file per shard: under parameter servers each ps writes its own) and, from a v1 Saver such as
an Estimator's, `model.ckpt-100.meta`. A directory's `checkpoint` state file, a text proto, names the
newest (`model_checkpoint_path: "ckpt-3"`) and those the script still keeps
(`all_model_checkpoint_paths: "ckpt-2"`); a restore reads the newest. Keys here are '/'-separated
paths relative to the synced directory."""

from __future__ import annotations

import codecs
import posixpath
import re
from dataclasses import dataclass, field

STATE_FILE = "checkpoint"
# A state file is a few hundred bytes; a script's file of that name beyond this is read as no state
# (never into memory).
MAX_STATE_BYTES = 1 << 20
_FAMILY = re.compile(r"(?P<prefix>.+)\.(?:index|meta|data-\d{5}-of-\d{5})")
_FIELD = re.compile(r'^\s*(model_checkpoint_path|all_model_checkpoint_paths)\s*:\s*"((?:[^"\\]|\\.)*)"\s*$')
_NUMBERED = re.compile(r"-(\d+)$")


def is_state(rel: str) -> bool:
    return posixpath.basename(rel) == STATE_FILE


def family(rel: str) -> str | None:
    """The checkpoint prefix a file belongs to ('sub/ckpt-3'), None for a file of no checkpoint."""
    match = _FAMILY.fullmatch(rel)
    return match.group("prefix") if match else None


@dataclass(frozen=True)
class CheckpointState:
    """One state file: the prefixes it names, as keys of the synced directory."""

    latest: str | None
    kept: frozenset[str] = field(default_factory=frozenset)  # all_model_checkpoint_paths, and latest

    def obsolete(self, prefix: str) -> bool:
        """Whether the script no longer keeps this checkpoint: older than the newest (by TensorFlow's
        `-N` save counter) and not among those kept. Unnumbered prefixes are never judged old."""
        if self.latest is None or prefix in self.kept:
            return False
        mine, newest = _number(prefix), _number(self.latest)
        return mine is not None and newest is not None and mine < newest


def parse_state(rel: str, text: bytes) -> CheckpointState:
    """The state file at `rel`. A path it names is relative to the state file's folder, or absolute
    (a v1 Saver without relative paths): then the checkpoint is taken to sit beside the state file, as
    TensorFlow writes it, whatever the folder was called on the node that wrote it."""
    folder = posixpath.dirname(rel)
    latest, kept = None, set()
    for line in text.decode("utf-8", "replace").splitlines():
        match = _FIELD.match(line)
        if match is None:
            continue
        named = codecs.escape_decode(match.group(2).encode())[0].decode("utf-8", "replace")
        beside = posixpath.basename(named) if named.startswith("/") else named
        key = posixpath.normpath(posixpath.join(folder, beside))
        if match.group(1) == "model_checkpoint_path":
            latest = key
        kept.add(key)
    return CheckpointState(latest, frozenset(kept))


def worth_pulling(keys: list[str], states: dict[str, CheckpointState]) -> list[str]:
    """What a restart restores: everything, except a checkpoint's files in a folder whose state file
    names another one as the newest (the old checkpoints a script keeps are not read by a restore)."""
    newest = {posixpath.dirname(rel): state.latest for rel, state in states.items()}
    wanted = []
    for rel in keys:
        prefix = family(rel)
        folder = posixpath.dirname(rel)
        if prefix is not None and folder in newest and prefix != newest[folder]:
            continue
        wanted.append(rel)
    return wanted


def _number(prefix: str) -> int | None:
    match = _NUMBERED.search(prefix)
    return int(match.group(1)) if match else None

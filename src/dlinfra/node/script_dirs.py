"""What a script-mode node gives its script: the DLINFRA_* variables and the local directories they
name."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from dlinfra.contract import NodeConfig
from dlinfra.progress import PROGRESS_FILE

MODEL_DIR = "DLINFRA_MODEL_DIR"
CHECKPOINT_DIR = "DLINFRA_CHECKPOINT_DIR"
TENSORBOARD_DIR = "DLINFRA_TENSORBOARD_DIR"
DATA_DIR = "DLINFRA_DATA_DIR"
RUN_ID = "DLINFRA_RUN_ID"
NODE = "DLINFRA_NODE"
GPUS = "DLINFRA_GPUS"
TRAIN_FILES = "DLINFRA_TRAIN_FILES"  # a packed data set's: this node's share of the train shards
EVAL_FILES = "DLINFRA_EVAL_FILES"  # and the eval shards, on the node that evaluates


@dataclass(frozen=True)
class ScriptDirs:
    """The node's local directories a script is given (the model's is emptied each life)."""

    model: Path
    checkpoint: Path
    tensorboard: Path
    data: Path
    progress: Path

    @staticmethod
    def progress_file(work: Path) -> Path:
        return work / "progress.json"

    @classmethod
    def under(cls, work: Path) -> ScriptDirs:
        # One checkpoint path for every node of the run, as a shared filesystem would give: TensorFlow's
        # programs pass one path to every task (a ps writes its shards of a save under the path the
        # chief names). Nodes sharing a machine (local) share the directory itself.
        dirs = cls(
            work / "model",
            work.parent / "checkpoints",
            work / "tensorboard",
            work / "data",
            cls.progress_file(work),
        )
        shutil.rmtree(dirs.model, ignore_errors=True)
        dirs.progress.unlink(missing_ok=True)
        for path in (dirs.model, dirs.checkpoint, dirs.tensorboard, dirs.data):
            path.mkdir(parents=True, exist_ok=True)
        return dirs

    def environ(self, cfg: NodeConfig) -> dict[str, str]:
        return {
            MODEL_DIR: str(self.model),
            CHECKPOINT_DIR: str(self.checkpoint),
            TENSORBOARD_DIR: str(self.tensorboard),
            DATA_DIR: str(self.data),
            PROGRESS_FILE: str(self.progress),
            RUN_ID: cfg.run_id,
            NODE: cfg.name,
            GPUS: str(cfg.gpus),
        }

"""The experiment's training section: what is trained (a built-in model, a Program or a script), on
what data, and how (batch, steps, optimizer, checkpoints)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from dlinfra.spec import pass_env
from dlinfra.spec.counts import MAX_COUNT, auto_or_count
from dlinfra.spec.dataset import DatasetSpec
from dlinfra.spec.input import StrictModel, shown
from dlinfra.spec.layers import ModelSpec
from dlinfra.spec.requirements import FORM_FIX as REQUIREMENT_FIX
from dlinfra.spec.requirements import problem as requirement_problem

StepsPerCall = Annotated[int | Literal["auto"], BeforeValidator(auto_or_count(1, 1000, "steps"))]


OUTPUTS_MAX_GB = 20.0


class TrainingSpec(StrictModel):
    model: ModelSpec = ModelSpec()
    dataset: DatasetSpec = DatasetSpec()
    entrypoint: str | None = Field(
        None,
        description="User code 'path/to/file.py:function' returning a dlinfra.training.program.Program, "
        "trained by dlinfra's loop. One of entrypoint or command.",
    )
    command: list[str] | None = Field(
        None,
        min_length=1,
        description="Script mode: the program every node runs as it is, e.g. [python, train.py, --epochs, "
        "'3'], from the experiment file's directory, with TF_CONFIG and the DLINFRA_* variables set "
        "(docs/script.md: Bring your own script). One of entrypoint or command.",
    )
    outputs_max_gb: float = Field(
        OUTPUTS_MAX_GB,
        gt=0,
        le=100_000,
        description="Script mode: the most a script's model, checkpoint or TensorBoard directory may hold "
        "(GB, sparse files at their full length) for the node to upload it; past it the run fails naming "
        "this field. Only regular files under a directory are uploaded: a link out of it is refused.",
    )
    require_model: bool = Field(
        False,
        description="Script mode: a script that exits 0 without leaving a model TensorFlow can load "
        "(a SavedModel, .keras or .h5 file in $DLINFRA_MODEL_DIR) fails the run with verdict 'no model'; "
        "false ends it DONE with 'no model saved' and its checkpoints.",
    )
    requirements: list[str] = Field(
        default_factory=list,
        description="Packages the entrypoint imports beyond dlinfra's own (PEP 508 strings), or the path "
        "of a requirements file beside the experiment file. Locked with hashes once per run.",
    )
    batch_size: int = Field(
        64,
        ge=1,
        le=65536,
        description="Examples per step on each replica (a worker has one replica per GPU, or one on CPU).",
    )
    steps: int = Field(600, ge=1, le=MAX_COUNT, description="Total optimizer steps (global).")
    learning_rate: float = Field(0.003, gt=0, le=10)
    optimizer: Literal["adam", "sgd", "rmsprop", "adagrad"] = Field(
        "adam",
        description="Keras optimizer at learning_rate, its defaults otherwise; sgd is SGD with momentum 0.9.",
    )
    seed: int = Field(
        42, ge=0, le=2**31 - 1, description="Seed of every random stream (NumPy takes 32 bits)."
    )
    checkpoint_every: int = Field(200, ge=1, le=MAX_COUNT, description="Steps between checkpoints.")
    log_every: int = Field(20, ge=1, le=MAX_COUNT, description="Steps between progress reports.")
    steps_per_execution: StepsPerCall = Field(
        10, description="parameter_server: steps per remote call, at most log_every (auto: ~2 s of compute)."
    )
    deterministic: bool = Field(False, description="TF op determinism and fixed seeds.")
    mixed_precision: bool = Field(
        False, description="Keras mixed_float16 on the GPU workers (refused when no worker has a GPU)."
    )
    jit_compile: bool = Field(
        False,
        description="multi_worker_mirrored: compile each replica's forward and backward pass with XLA "
        "(a compile before the first step; 0.6x on ResNet-20 on our 2-core CPU: see BENCHMARKS.md).",
    )
    lr_scaling: Literal["none", "linear"] = Field(
        "none",
        description="multi_worker_mirrored: linear multiplies learning_rate by the replica count "
        "(the global batch grows with it); none uses it as given.",
    )

    pass_env: list[str] = Field(
        default_factory=list, max_length=pass_env.MAX_NAMES, description=pass_env.DESCRIPTION
    )

    @field_validator("pass_env")
    @classmethod
    def _pass_env_names(cls, v: list[str]) -> list[str]:
        if problems := pass_env.problems(v):
            raise ValueError(
                f"{'; '.join(problems)}. Fix: name variables of your shell, e.g. [WANDB_API_KEY]"
            )
        return v

    @field_validator("requirements")
    @classmethod
    def _requirements_form(cls, v: list[str]) -> list[str]:
        problems = [
            f"[{i}] {shown(text)} {why}" for i, text in enumerate(v) if (why := requirement_problem(text))
        ]
        if problems:
            raise ValueError(f"{'; '.join(problems)}. Fix: {REQUIREMENT_FIX}")
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _command_words(cls, v: Any) -> Any:
        """YAML reads `--epochs, 3` as a number: numbers are taken as the words they were written as."""
        if isinstance(v, str):
            raise ValueError(
                f"must be a list of words, not one string (got {shown(v)}). Fix: command: "
                f"{v.split()!r}, as the script's argv"
            )
        if isinstance(v, list):
            return [str(a) if isinstance(a, int | float) and not isinstance(a, bool) else a for a in v]
        return v

    @field_validator("command")
    @classmethod
    def _command_form(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v[0].strip() or any("\0" in arg for arg in v)):
            raise ValueError(f"needs a program to run first, e.g. [python, train.py] (got {shown(v)})")
        return v

    @model_validator(mode="after")
    def _one_program(self) -> TrainingSpec:
        if self.entrypoint and self.command:
            raise ValueError(
                "entrypoint and command are both set: give one. Fix: entrypoint for a Program that "
                "dlinfra's loop trains, command to run your own training script as it is"
            )
        if self.command and self.dataset.cache_gb is not None:
            raise ValueError(
                "dataset.cache_gb streams files to Shard.records(); a script reads "
                "$DLINFRA_TRAIN_FILES, staged whole. Fix: remove cache_gb, or train with a Program "
                "(training.entrypoint)"
            )
        # its default is written out with every spec and node config: only another value is refused
        if self.outputs_max_gb != OUTPUTS_MAX_GB and not self.command:
            raise ValueError(
                "outputs_max_gb caps what a script's directories upload; without training.command "
                "dlinfra's loop writes the model itself. Fix: remove outputs_max_gb, or set command"
            )
        if self.require_model and not self.command:
            raise ValueError(
                "require_model asks a script for its model; without training.command dlinfra's loop "
                "saves the model itself. Fix: remove require_model, or set command"
            )
        return self

    @model_validator(mode="after")
    def _builtin_reads_the_data(self) -> TrainingSpec:
        if not (self.entrypoint or self.command) and (problem := self.dataset.builtin_problem()):
            raise ValueError(problem)  # deploy refused it once the files were listed; validate passed it
        return self

    def dispatches_files(self, strategy: str) -> bool:
        """Parameter-server workers take train files as they are free, from a tf.data dispatcher on
        the chief, instead of a fixed share each: of packed or listed TFRecords that dlinfra reads
        (Shard.records(), the built-in model). A script reads its staged share its own way."""
        ds = self.dataset
        return strategy == "parameter_server" and ds.format == "tfrecord" and not self.command

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"must look like 'path/to/file.py:function' (got {shown(v)})")
        return v

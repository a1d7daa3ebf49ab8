"""Hostile and bad input by class (issue 55): one module here per surface, each with a `CASES` list.

A case makes its own files in a scratch directory and names the `dlinfra` arguments to run; the
suite (tests/test_hostile_inputs.py) and `bench/bench_bad_input.py` both run every case in a fresh
process, so a case written once is both a regression test and a timed, measured bench row."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Case:
    name: str
    # Given a scratch directory, makes what the case needs there and returns the CLI's arguments
    # ("{workdir}" is not expanded: build paths from the directory you are given).
    args: Callable[[Path], list[str]]
    # Text the output (stderr, or stdout where `code` is 0) must hold: the field, or the file, and the fix.
    expected: tuple[str, ...]
    # Text no output may hold: file content that must not be echoed, a secret, an internal name.
    absent: tuple[str, ...] = ()
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)


def training_field(key: str, value: str, command: bool = True) -> Callable[[Path], list[str]]:
    """`dlinfra validate` of an experiment whose `training.<key>` is `value` (YAML as written), in
    script mode unless `command` is False."""

    def args(work: Path) -> list[str]:
        spec = work / "experiment.yaml"
        run = "  command: [python, train.py]\n" if command else ""
        spec.write_text(f"name: {key.replace('_', '-')}\ntraining:\n{run}  {key}: {value}\n")
        return ["validate", str(spec)]

    return args


def all_cases() -> list[Case]:
    """Every module's CASES, in module order; names must be unique across modules."""
    cases: list[Case] = []
    for module in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
        cases.extend(importlib.import_module(f"{__name__}.{module}").CASES)
    names = [c.name for c in cases]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"hostile cases named twice: {duplicated}")
    return cases

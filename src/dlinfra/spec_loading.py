"""Loading an experiment: YAML with file:line errors, CLI overrides, then checks the models cannot
make on their own (a `check` from above, e.g. the GPUs an instance type lacks)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel, ValidationError

from dlinfra.errors import SpecError
from dlinfra.spec import Spec
from dlinfra.spec_errors import describe, line_index, located, parse_yaml


class Problem(NamedTuple):
    """A spec that validates but cannot work: the field, what is wrong, how to fix it."""

    loc: tuple[str, ...]
    message: str
    fix: str


class Overrides(BaseModel):
    """CLI flags that change a spec; each maps to one field path."""

    workers: int | None = None
    ps: int | None = None
    strategy: str | None = None
    steps: int | None = None
    target: str | None = None
    endpoint_url: str | None = None
    sets: list[str] = []

    def as_paths(self) -> list[tuple[str, str, Any]]:
        """(flag, dotted path, value) for every override given."""
        flags = [
            ("--workers", "cluster.workers.count", self.workers),
            ("--ps", "cluster.ps.count", self.ps),
            ("--strategy", "strategy", self.strategy),
            ("--steps", "training.steps", self.steps),
            ("--target", "target", self.target),
            ("--endpoint-url", "aws.endpoint_url", self.endpoint_url),
        ]
        out = [(flag, path, value) for flag, path, value in flags if value is not None]
        for item in self.sets:
            path, sep, raw = item.partition("=")
            if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*", path.strip()):
                raise SpecError(
                    [f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set training.batch_size=256"]
                )
            try:
                value = yaml.safe_load(raw) if raw.strip() else ""
            except yaml.YAMLError:
                value = raw
            out.append((f"--set {path.strip()}", path.strip(), value))
        return out


def load_spec(
    path: str | Path | None = None,
    overrides: Overrides | None = None,
    check: Callable[[Spec], list[Problem]] | None = None,
) -> Spec:
    """Read, override and validate an experiment file (``None``: the built-in default). `check` finds
    what the models cannot see (e.g. GPUs an instance type lacks); its problems exit 2 like theirs."""
    source = str(path) if path else "<built-in default>"
    text = ""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SpecError([f"{source}: no such file. Fix: check the path, or run `dlinfra init {source}`"])
        text = p.read_text(encoding="utf-8")
        data = parse_yaml(text, source)
    flag_of: dict[tuple[str, ...], str] = {}
    for flag, dotted, value in (overrides or Overrides()).as_paths():
        keys = tuple(dotted.split("."))
        _set_path(data, keys, value, flag, source)
        flag_of[keys] = flag
    lines = line_index(text) if text else {}
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise SpecError([describe(e, source, lines, flag_of, Spec) for e in err.errors()]) from None
    found = check(spec) if check else []
    if found:
        raise SpecError([located(source, lines, flag_of, p.loc, p.message, p.fix) for p in found])
    return spec


def _set_path(data: dict[str, Any], keys: tuple[str, ...], value: Any, flag: str, source: str) -> None:
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            path = ".".join(keys[: i + 1])
            raise SpecError([f"{source}: {path}: {flag} needs a mapping here, the file has {child!r}"])
        node = child
    node[keys[-1]] = value

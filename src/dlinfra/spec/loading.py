"""Loading an experiment: YAML with file:line errors, CLI overrides, then checks the models cannot
make on their own (a `check` from above, e.g. the GPUs an instance type lacks). Also the file's
JSON schema and the commented example `dlinfra init` writes."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from dlinfra.errors import SpecError
from dlinfra.spec import requirements
from dlinfra.spec.errors import describe, located
from dlinfra.spec.input import (
    CREDENTIAL_FIX,
    credentials_in,
    parse_document,
    parse_value,
    read_text,
    shown,
)
from dlinfra.spec.model import Spec


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
                    [f"--set {shown(item)}: expected KEY.PATH=VALUE, e.g. --set training.batch_size=256"]
                )
            value = parse_value(raw, f"--set {path.strip()}") if raw.strip() else ""
            out.append((f"--set {path.strip()}", path.strip(), value))
        return out


def load_spec(
    path: str | Path | None = None,
    overrides: Overrides | None = None,
    check: Callable[[Spec], list[Problem]] | None = None,
    *,
    text: str | None = None,
    source: str | None = None,
) -> Spec:
    """Read, override and validate an experiment file (``None``: the built-in default). `check` finds
    what the models cannot see (e.g. GPUs an instance type lacks); its problems exit 2 like theirs.
    `text` (named `source` in errors): the file's content from elsewhere, e.g. a git ref."""
    source = source or (str(path) if path else "<built-in default>")
    data: dict[str, Any] = {}
    lines: dict[tuple[str | int, ...], int] = {}
    if text is not None:
        data, lines = parse_document(text, source)
    elif path is not None:
        data, lines = parse_document(read_text(Path(path), source), source)
    flag_of: dict[tuple[str, ...], str] = {}
    for flag, dotted, value in (overrides or Overrides()).as_paths():
        keys = tuple(dotted.split("."))
        _set_path(data, keys, value, flag, source)
        flag_of[keys] = flag
    _read_requirements(data, Path(path).absolute().parent if path else Path.cwd(), source)
    secrets = credentials_in(data)
    if secrets:
        raise SpecError(
            [
                located(
                    source,
                    lines,
                    flag_of,
                    loc,
                    f"looks like a credential ({what})",
                    CREDENTIAL_FIX,
                )
                for loc, what in secrets
            ]
        )
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise SpecError([describe(e, source, lines, flag_of, Spec) for e in err.errors()]) from None
    found = check(spec) if check else []
    if found:
        raise SpecError([located(source, lines, flag_of, p.loc, p.message, p.fix) for p in found])
    return spec


def _read_requirements(data: dict[str, Any], base: Path, source: str) -> None:
    """`training.requirements: path/to/requirements.txt` becomes the list the file holds."""
    training = data.get("training")
    if isinstance(training, dict) and isinstance(training.get("requirements"), str):
        training["requirements"] = requirements.read_file(training["requirements"], base, source)


def _set_path(data: dict[str, Any], keys: tuple[str, ...], value: Any, flag: str, source: str) -> None:
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            path = ".".join(keys[: i + 1])
            raise SpecError([f"{source}: {path}: {flag} needs a mapping here, the file has {shown(child)}"])
        node = child
    node[keys[-1]] = value


def json_schema() -> dict[str, Any]:
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "dlinfra experiment"
    return schema


EXAMPLE_PATH = Path(__file__).parents[1] / "examples" / "experiment.yaml"


def example_text() -> str:
    """The commented example `dlinfra init` writes; a test keeps it equal to ``Spec()``."""
    return EXAMPLE_PATH.read_text(encoding="utf-8")

"""Turning a bad experiment file into messages a person can act on: file:line, the field, the fix."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from dlinfra.spec.input import shown


def describe(
    error: ErrorDetails,
    source: str,
    lines: dict[tuple[str | int, ...], int],
    flag_of: dict[tuple[str, ...], str],
    root: type[BaseModel],
) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    # a validator that knows the fix says it after ". Fix: "
    msg, _, fix = error["msg"].removeprefix("Value error, ").partition(". Fix: ")
    if error["type"] == "model_type":  # pydantic names the model class, which no user ever wrote
        msg = "Input should be a mapping of keys"
    got = error.get("input")
    quiet = error["type"] in ("missing", "extra_forbidden", "value_error") or isinstance(got, dict | list)
    echoed = "" if quiet else f" (got {shown(got)})"
    return located(source, lines, flag_of, loc, msg + echoed, fix or _fix(error, loc, root))


def located(
    source: str,
    lines: dict[tuple[str | int, ...], int],
    flag_of: dict[tuple[str, ...], str],
    loc: tuple[Any, ...],
    message: str,
    fix: str,
) -> str:
    """'file:line: field.path (from --flag): what is wrong. Fix: what to do'."""
    path = ".".join(str(p) for p in loc) or "(top level)"
    where = source
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            where = f"{source}:{lines[loc[:n]]}"
            break
    flag = next((flag_of[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in flag_of), None)
    origin = f" (from {flag})" if flag else ""
    return f"{where}: {path}{origin}: {message}. Fix: {fix}"


def _fix(error: ErrorDetails, loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = sorted(_model_at(root, loc[:-1]).model_fields)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"{hint}remove it; valid keys here: {', '.join(allowed)}"
    if kind == "string_type" and isinstance(error.get("input"), int | float):
        # YAML took the text for a number, and may have changed it doing so: 1.10 is read as 1.1
        return "quote the value as it was meant (YAML reads an unquoted number as one, and 1.10 as 1.1)"
    if kind == "model_type":
        model = _model_at(root, loc)
        if model.__name__ == (error.get("ctx") or {}).get("class_name"):
            return f"write it as a mapping of its keys: {', '.join(sorted(model.model_fields))}"
        return "write it as a mapping; `dlinfra schema` lists its keys"
    if kind == "missing":
        return "add this key"
    if kind in ("int_parsing", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type"):
        return "give a value of the type named above, without quotes"
    if kind == "finite_number":
        return "give a finite number (.inf and .nan turn the check off)"
    if kind.startswith(("greater_than", "less_than")):
        return "use a value in the allowed range"
    if kind == "literal_error":
        return "use one of the listed values"
    if kind in ("string_pattern_mismatch", "value_error"):
        field = _model_at(root, loc[:-1]).model_fields.get(str(loc[-1])) if loc else None
        if field and field.description:
            return field.description
        if kind == "string_pattern_mismatch":
            return "use the form the pattern describes"
    return "see `dlinfra schema` for the allowed values"


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    model: type[BaseModel] = root
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            args = getattr(annotation, "__args__", ())
            inner = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if inner is None:
                if isinstance(part, int):
                    continue
                break
            model = inner
    return model

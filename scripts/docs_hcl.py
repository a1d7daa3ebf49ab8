"""A small HCL reader for scripts/docs_reference.py: the top-level `variable` and `output` blocks of a
Terraform file and their own attributes, as source text. It skips strings (with their escapes and
`${...}` templates), heredocs and comments when it matches braces; nested blocks (`validation`,
`precondition`) are skipped, not read. Enough for variables.tf and outputs.tf, not a full parser."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator


def hcl_blocks(text: str, kind: str) -> Iterator[tuple[str, str]]:
    """The top-level `kind "name" { body }` blocks of an HCL file: (name, body)."""
    for match in re.finditer(rf'^{kind}\s+"([^"]+)"\s*\{{', text, re.M):
        start = match.end()
        yield match.group(1), text[start : closing(text, start)]


def closing(text: str, start: int) -> int:
    """The index of the brace closing the one opened just before `start`: strings, heredocs and
    comments skipped."""
    depth, i = 1, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i = string_end(text, i)
            continue
        if c == "#" or text.startswith("//", i):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            continue
        if text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        if text.startswith("<<", i):
            heredoc = re.match(r"<<-?([A-Za-z_]+)\n", text[i:])
            if heredoc:
                end = re.compile(rf"^\s*{heredoc.group(1)}\s*$", re.M).search(text, i + heredoc.end())
                i = end.end() if end else len(text)
                continue
        if c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced braces")


def string_end(text: str, i: int) -> int:
    """The index after the string literal opening at text[i] (escapes and ${...} templates skipped)."""
    i += 1
    while text[i] != '"':
        if text[i] == "\\":
            i += 2
        elif text.startswith("${", i):
            i = closing(text, i + 2) + 1
        else:
            i += 1
    return i + 1


def hcl_attributes(body: str) -> dict[str, str]:
    """A block body's own attributes (`key = expression`, nested blocks skipped), as source text."""
    found: dict[str, str] = {}
    i = 0
    while i < len(body):
        line = re.compile(r"[ \t]*([A-Za-z_][A-Za-z0-9_-]*)[ \t]*(=|\{)[ \t]*").match(body, i)
        if not line:
            nl = body.find("\n", i)
            i = len(body) if nl < 0 else nl + 1
            continue
        if line.group(2) == "{":  # a nested block (validation, precondition)
            i = closing(body, line.end()) + 1
            continue
        j = line.end()
        while j < len(body) and body[j] != "\n":
            c = body[j]
            if c == '"':
                j = string_end(body, j)
            elif c in "{[(":
                j = closing(body, j + 1) + 1
            elif c == "#" or body.startswith("//", j):
                break
            else:
                j += 1
        found[line.group(1)] = body[line.end() : j].strip()
        i = j
    return found


def hcl_string(expression: str) -> str:
    if expression.startswith('"') and expression.endswith('"'):
        return json.loads(expression)
    return expression

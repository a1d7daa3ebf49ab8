"""`training.requirements`: the packages a user's program imports beyond dlinfra's own.

Given as a list of PEP 508 strings, or as the path of a requirements file beside the experiment
file; a file is read here, at the input boundary, so a run records the very list it locked (the
file may change after). Only requirement lines are taken: an index belongs in `aws.pip_index_url`
or pip's own variables, where resolution and the nodes' installs both see it.
"""

from __future__ import annotations

from pathlib import Path

from dlinfra.errors import SpecError
from dlinfra.spec.input import shown

FIELD = "training.requirements"
FORM_FIX = "write each as PEP 508, e.g. 'pandas>=2.2' or 'mytokenizer==1.4'"


def problem(text: str) -> str | None:
    """Why `text` is not a requirement a lock can hold (None: it is one)."""
    # here, not at the top: packaging builds its grammar on import (0.17 s), which a spec without
    # requirements, every spec `advise` or `--help` reads, never needs
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        first = str(exc).splitlines()[0]
        return f"{shown(text)} is not a requirement ({first})"
    if req.url and req.url.startswith("file:"):
        return f"{shown(text)} names a file on this machine, which no node has"
    if req.name.lower().replace("_", "-") == "dlinfra":
        return f"{shown(text)}: dlinfra itself is installed by dlinfra (the run's own build)"
    return None


def read_file(value: str, base: Path, source: str) -> list[str]:
    """The requirements a file lists (relative to `base`, the experiment file's directory)."""
    path = (base / value).resolve() if not Path(value).is_absolute() else Path(value)
    where = f"{source}: {FIELD}"
    if not path.is_file():
        raise SpecError(
            [
                f"{where}: {shown(value)} is not a file (looked for {path}). Fix: give a requirements "
                "file relative to the experiment file, or list the requirements themselves"
            ]
        )
    out, problems = [], []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            problems.append(
                f"{path}:{number}: {shown(line)}: only requirements are read here. Fix: give an index in "
                "aws.pip_index_url (or PIP_INDEX_URL / PIP_EXTRA_INDEX_URL), and list each package"
            )
        elif why := problem(line):
            problems.append(f"{path}:{number}: {why}. Fix: {FORM_FIX}")
        else:
            out.append(line)
    if problems:
        raise SpecError(problems)
    return out

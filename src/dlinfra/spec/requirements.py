"""`training.requirements`: the packages a user's program imports beyond dlinfra's own.

Given as a list of PEP 508 strings, or as the path of a requirements file beside the experiment
file; a file is read here, at the input boundary, so a run records the very list it locked (the
file may change after). Only requirement lines are taken: an index belongs in `aws.pip_index_url`
or pip's own variables, where resolution and the nodes' installs both see it.
"""

from __future__ import annotations

from pathlib import Path

from dlinfra.errors import SpecError
from dlinfra.spec.input import MAX_VALUES, bounded_text, checked_path, shown, system_file

FIELD = "training.requirements"
FORM_FIX = "write each as PEP 508, e.g. 'pandas>=2.2' or 'mytokenizer==1.4'"
MAX_LENGTH = 1000  # a name, extras, a version range, a marker, or a URL: a few hundred at most
SHOWN_LINES = 5  # bad lines named one by one; past them, the file is likely no requirements file at all


def problem(text: str) -> str | None:
    """Why `text` is not a requirement a lock can hold (None: it is one). Never quotes `text`: the
    caller does where it came from the spec, and does not where it came from a file."""
    # here, not at the top: packaging builds its grammar on import (0.17 s), which a spec without
    # requirements, every spec `advise` or `--help` reads, never needs
    from packaging.requirements import InvalidRequirement, Requirement

    if len(text) > MAX_LENGTH:  # else the resolver asks the index for a project of that name
        return (
            f"is {len(text):,} characters long, far past any requirement (a name, a version range, a marker)"
        )
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        # packaging's first line is the grammar's complaint, the next ones quote the text; a bad
        # version range is quoted on the first ("Invalid specifier: '>=1.*'"): only its kind is kept
        first = str(exc).splitlines()[0]
        kind = first.split(":", 1)[0] if "'" in first else first[:120]
        return f"is not a requirement ({kind})"
    if req.url and req.url.startswith("file:"):
        return "names a file on this machine, which no node has"
    if req.name.lower().replace("_", "-") == "dlinfra":
        return "is dlinfra itself, which dlinfra installs (the run's own build)"
    return None


def read_file(value: str, base: Path, source: str) -> list[str]:
    """The requirements a file lists (relative to `base`, the experiment file's directory). Refused
    whole, naming the file and never quoting it, when it is no requirements file."""
    where = f"{source}: {FIELD}"
    checked_path(base / value, f"{where}: {shown(value)}", "give the requirements file's path, or list them")
    path = (base / value).resolve() if not Path(value).is_absolute() else Path(value)
    if real := system_file(path):
        raise SpecError(
            [
                f"{where}: {shown(value)} is a system file ({real}), not a requirements file. Fix: give "
                "the requirements file of your project, relative to the experiment file"
            ]
        )
    if not path.is_file():
        raise SpecError(
            [
                f"{where}: {shown(value)} is not a file (looked for {path}). Fix: give a requirements "
                "file relative to the experiment file, or list the requirements themselves"
            ]
        )
    too_big = f"{FIELD} lists the packages your program imports. Fix: list those, not a lock or data"
    text = bounded_text(path, f"{where}: {path}", too_big)
    out: list[str] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            option = shown(line.split("=", 1)[0].split()[0])  # the option, never its value (a URL, a path)
            problems.append(
                f"{path}:{number}: {option}: only requirements are read here. Fix: give an index in "
                "aws.pip_index_url (or PIP_INDEX_URL / PIP_EXTRA_INDEX_URL), and list each package"
            )
        elif why := problem(line):
            problems.append(f"{path}:{number}: the line {why}. Fix: {FORM_FIX}")
        else:
            out.append(line)
    if len(problems) > SHOWN_LINES:
        more = len(problems) - SHOWN_LINES
        problems[SHOWN_LINES:] = [
            f"{path}: and {more} more lines that are no requirement: is it a requirements file? "
            f"Fix: name the file that lists your program's packages in {FIELD}"
        ]
    if problems:
        raise SpecError(problems)
    if len(out) > MAX_VALUES:
        raise SpecError(
            [f"{where}: {path}: {len(out):,} requirements, past the spec's {MAX_VALUES:,} values; {too_big}"]
        )
    return out

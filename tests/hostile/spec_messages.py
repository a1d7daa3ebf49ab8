"""Class 9 of issue 55, the first case: messages that mislead (more are added with their fixes)."""

from __future__ import annotations

from pathlib import Path

from hostile import Case


def _python_tag(work: Path) -> list[str]:
    spec = work / "experiment.yaml"
    spec.write_text("name: !!python/object/apply:os.system ['true']\n")
    return ["validate", str(spec)]


CASES = [
    Case(
        "yaml-python-tag",
        _python_tag,
        expected=("experiment.yaml:1", "Fix: remove the tag"),
        absent=("indentation",),
    ),
]

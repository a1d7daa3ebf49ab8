"""dlinfra's own dependencies as a source checkout declares them in pyproject.toml: what a wheel built
from it carries in its metadata, known before any build. A checkout's lock is resolved from them while
its wheel builds (runs/wheel.py): a fresh start waited for the build (0.5-0.9 s), then the lock."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dlinfra import __version__
from dlinfra.errors import SpecError


@dataclass(frozen=True)
class Declared:
    name: str
    version: str
    requires_python: str
    dependencies: tuple[str, ...]
    extras: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def read(cls, pyproject: Path) -> Declared:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        extras = project.get("optional-dependencies", {})
        return cls(
            name=project["name"],
            version=project.get("version", __version__),  # dynamic: src/dlinfra/__init__.py, running now
            requires_python=project.get("requires-python", ""),
            dependencies=tuple(project.get("dependencies", ())),
            extras=tuple(sorted((name, tuple(lines)) for name, lines in extras.items())),
        )

    def requirements(self, wanted: str) -> list[str]:
        """What `name[wanted]` requires: its dependencies and each named extra's, with an extra that
        names the project's own extras (`dlinfra[train]`) expanded as a wheel's installer would."""
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

        extras = dict(self.extras)
        lines, seen, todo = list(self.dependencies), set(), wanted.split(",")
        while todo:
            extra = todo.pop()
            if extra in seen:
                continue
            seen.add(extra)
            for line in extras[extra]:
                requirement = Requirement(line)
                own = canonicalize_name(requirement.name) == canonicalize_name(self.name)
                if own and not requirement.marker:
                    todo += sorted(requirement.extras)
                elif line not in lines:
                    lines.append(line)
        return lines

    def refuse_python(self, python: str) -> None:
        """Refuse (exit 2) nodes whose Python this dlinfra does not support, as the resolver did for
        its wheel. Only aws.python can ask for one: local nodes run this very Python, VMs Debian's."""
        from packaging.specifiers import SpecifierSet

        if self.requires_python and python not in SpecifierSet(self.requires_python):
            raise SpecError(
                [
                    f"aws.python: the nodes would run Python {python}, and dlinfra {self.version} needs "
                    f"Python {self.requires_python}. Fix: set aws.python to a version that satisfies "
                    f"{self.requires_python}"
                ]
            )

    def key(self) -> str:
        """What of the checkout a lock depends on: an edit of its code keeps its lock."""
        fields = [self.name, self.version, self.requires_python, self.dependencies, self.extras]
        return json.dumps(fields)

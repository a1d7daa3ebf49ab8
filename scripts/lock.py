"""The project's own hash locks (locks/*.txt): what each is resolved from, and its refresh.

`bash scripts/lock.sh` runs this. Each lock is `uv pip compile --generate-hashes` for the one kind of
machine the project installs on (CPython 3.11, Linux x86_64: every developer's and CI's); its header
names the refresh command and records `inputs-sha256`, a digest of what it was resolved from
(requires-python, the dependency tables of pyproject.toml it reads, its locks/*.in files, the target
platform). tests/test_project_locks.py recomputes that digest, so a dependency edited in
pyproject.toml without a refresh fails the suite, offline.

A refresh keeps every pin that still fits (uv prefers what the lock already holds) and changes only
what the edit needs; `--upgrade` takes the newest releases of everything, `--upgrade-package NAME`
of one. Other arguments go to `uv pip compile` as they are.

    python scripts/lock.py [--upgrade | --upgrade-package NAME ...]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "3.11"
PLATFORM = "x86_64-manylinux_2_28"  # glibc 2.28 or newer: Debian 10+, Ubuntu 20.04+
REFRESH = "bash scripts/lock.sh"


@dataclass(frozen=True)
class Profile:
    """One lock: pyproject.toml's dependencies with these extras (None: pyproject.toml is not read),
    plus these requirement files."""

    name: str
    extras: tuple[str, ...] | None
    files: tuple[str, ...]
    venv: str
    what: str
    constrained_by: str | None = None  # another profile's lock: this one takes the same versions

    @property
    def lock(self) -> Path:
        return ROOT / "locks" / f"{self.name}.txt"


# dev first: run is constrained to dev's versions, so `install.sh` installs what CI tested.
PROFILES = (
    Profile(
        "dev",
        ("train", "aws", "report", "dev"),
        ("locks/tools.in",),
        ".venv",
        "`bash scripts/install.sh dev` (and CI)",
    ),
    Profile(
        "run",
        ("train", "aws", "report"),
        ("locks/tools.in",),
        ".venv",
        "`bash scripts/install.sh`",
        constrained_by="dev",
    ),
    Profile("checkov", None, ("locks/checkov.in",), ".venv-checkov", "`bash scripts/install.sh dev`"),
)


def profile(name: str) -> Profile:
    return next(p for p in PROFILES if p.name == name)


def requirement_lines(path: Path) -> list[str]:
    """A requirements file's requirements: comments and blank lines dropped, spaces squeezed."""
    lines = (re.sub(r"\s+#.*$|^#.*$", "", line).strip() for line in path.read_text().splitlines())
    return [" ".join(line.split()) for line in lines if line]


def inputs(p: Profile, root: Path = ROOT) -> dict[str, object]:
    """Everything the lock is resolved from, as plain data."""
    found: dict[str, object] = {"python": PYTHON, "platform": PLATFORM}
    if p.extras is not None:
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        optional = project.get("optional-dependencies", {})
        found["requires-python"] = project.get("requires-python")
        found["dependencies"] = project.get("dependencies", [])
        found["extras"] = {extra: optional[extra] for extra in p.extras}
    found["files"] = {name: requirement_lines(root / name) for name in p.files}
    if p.constrained_by:
        found["constrained-by"] = inputs(profile(p.constrained_by), root)
    return found


def digest(p: Profile, root: Path = ROOT) -> str:
    return hashlib.sha256(json.dumps(inputs(p, root), sort_keys=True).encode()).hexdigest()


def header(p: Profile) -> str:
    sources = (["pyproject.toml [" + ",".join(p.extras) + "]"] if p.extras is not None else []) + list(
        p.files
    )
    lines = [
        f"# locks/{p.name}.txt: what {p.what} installs into {p.venv}, exactly and hash-checked.",
        f"# Refresh, after editing what it is resolved from (then review and commit the diff): {REFRESH}",
        f"# Resolved by uv pip compile for CPython {PYTHON} on {PLATFORM} from {' + '.join(sources)}"
        + (f", at locks/{p.constrained_by}.txt's versions" if p.constrained_by else ""),
        f"# inputs-sha256: {digest(p)}",
    ]
    return "\n".join(lines) + "\n"


def uv() -> str:
    here = ROOT / ".venv" / "bin" / "uv"
    if here.is_file():
        return str(here)
    from shutil import which

    found = which("uv")
    if not found:
        sys.exit("lock.py: no uv: run `bash scripts/install.sh` first (it installs the locked uv)")
    return found


def compile_lock(p: Profile, passthrough: list[str]) -> None:
    command = [uv(), "pip", "compile", "--quiet", "--generate-hashes", "--no-header"]
    command += ["--python-version", PYTHON, "--python-platform", PLATFORM, "-o", f"locks/{p.name}.txt"]
    if p.extras is not None:
        command.append("pyproject.toml")
        for extra in p.extras:
            command += ["--extra", extra]
    command += list(p.files)
    if p.constrained_by:
        command += ["--constraint", f"locks/{p.constrained_by}.txt"]  # its versions (and hashes)
    command += passthrough
    # uv ignores pip's config (this machine's local indexes): the hashes are the index's own
    subprocess.run(command, cwd=ROOT, check=True, env=dict(os.environ, NO_COLOR="1"))
    body = p.lock.read_text()
    p.lock.write_text(header(p) + body)


def main(argv: list[str]) -> int:
    for p in PROFILES:
        compile_lock(p, argv)
        pins = len(re.findall(r"^[A-Za-z0-9][^\s]*==", p.lock.read_text(), re.M))
        print(f"lock.sh: locks/{p.name}.txt: {pins} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

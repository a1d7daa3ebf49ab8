"""The code's imports against the run's lock, before anything starts: a module the code imports that
no locked package provides would fail on every node, minutes in (`No module named 'sklearn'` 27 s
into a run, issue 56). It is refused at `validate`, `plan` and `deploy`, naming the import, its
file:line and the requirement to add.

deptry scans the code (a Rust parser of every file; stdlib and the code's own modules are known to
it) against a requirements list written here: every package the lock pins. A package's modules come
from its metadata where this interpreter has it installed, else from MODULES (the common names that
differ from their distribution's), else from its name. Nothing here needs the network.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dlinfra.environment.lock import Lock
from dlinfra.errors import DlinfraError, SpecError

FIELD = "training.requirements"
# distribution → the top-level modules it provides, where they are not its own name
MODULES: dict[str, tuple[str, ...]] = {
    "scikit-learn": ("sklearn",),
    "scikit-image": ("skimage",),
    "opencv-python": ("cv2",),
    "opencv-python-headless": ("cv2",),
    "opencv-contrib-python": ("cv2",),
    "pillow": ("PIL",),
    "pyyaml": ("yaml",),
    "beautifulsoup4": ("bs4",),
    "python-dateutil": ("dateutil",),
    "attrs": ("attr", "attrs"),
    "absl-py": ("absl",),
    "protobuf": ("google",),
    "grpcio": ("grpc",),
    "tensorflow-cpu": ("tensorflow",),
    "tensorflow-intel": ("tensorflow",),
    "tf-nightly": ("tensorflow",),
    "tensorflow-estimator": ("tensorflow_estimator",),
    "tf-keras": ("tf_keras",),
    "pyjwt": ("jwt",),
    "pycryptodome": ("Crypto",),
    "python-dotenv": ("dotenv",),
    "pyserial": ("serial",),
    "msgpack-python": ("msgpack",),
    "py-spy": (),
}
# the requirement to add for an import: MODULES read backwards, else the import's own name
# (the first distribution listed for a module: opencv-python for cv2, not its variants)
REQUIREMENT = {module: name for name, modules in reversed(MODULES.items()) for module in modules} | {
    "tensorflow": "tensorflow",
    "google": "protobuf (or the google-* package you use)",
}
GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
TIMEOUT = 60.0


@dataclass(frozen=True, order=True)
class Missing:
    file: str  # relative to the code's root
    line: int
    module: str

    def problem(self) -> str:
        want = REQUIREMENT.get(self.module, self.module.replace("_", "-"))
        return (
            f"{self.file}:{self.line}: imports {self.module}, which the run's environment lacks. "
            f"Fix: add {want!r} to {FIELD}"
        )


def check(root: Path, locks: Iterable[Lock], files: Iterable[Path] | None = None) -> None:
    """Refuse (SpecError, exit 2) code under `root` that imports what a lock lacks."""
    if missing := scan(root, locks, files):
        raise SpecError([m.problem() for m in missing])


def scan(root: Path, locks: Iterable[Lock], files: Iterable[Path] | None = None) -> list[Missing]:
    """The imports under `root` that no package of every lock provides, outside an ImportError guard.
    `files`: the ones the run packs (a copy of them is scanned, laid out as under `root`, so what
    the bundle leaves out, DLINFRA_HOME or .dlinfraignore's, is not judged); None: all of `root`."""
    pinned = [set(lock.pins()) for lock in locks]
    packages = sorted(set.intersection(*pinned) | {"dlinfra"}) if pinned else ["dlinfra"]
    root = root.resolve()
    with tempfile.TemporaryDirectory(prefix="dlinfra-imports-") as tmp:
        scratch = Path(tmp)
        scanned = root
        if files is not None:
            scanned = scratch / "code"
            for path in files:
                copy = scanned / path.resolve().relative_to(root)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, copy)
            scanned.mkdir(exist_ok=True)
        (scratch / "requirements.txt").write_text("\n".join(packages) + "\n", encoding="utf-8")
        (scratch / "pyproject.toml").write_text("", encoding="utf-8")  # not the user's [tool.deptry]
        mapping = [f"{name}={'|'.join(MODULES[name])}" for name in packages if MODULES.get(name)]
        command = [
            sys.executable, "-m", "deptry", str(scanned), "--no-ansi", "--ignore-notebooks",
            "--config", str(scratch / "pyproject.toml"),
            "--requirements-files", str(scratch / "requirements.txt"),
            "--ignore", "DEP002,DEP004,DEP005",
            "--json-output", str(scratch / "found.json"),
            *(["--package-module-name-map", ",".join(mapping)] if mapping else []),
            *(f"--known-first-party={name}" for name in _own_modules(scanned)),
        ]  # fmt: skip
        try:
            result = subprocess.run(command, cwd=scratch, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise DlinfraError(f"scanning {root}'s imports took over {TIMEOUT:.0f}s") from None
        found = scratch / "found.json"
        if result.returncode not in (0, 1) or not found.is_file():
            raise DlinfraError(f"could not scan {root}'s imports (deptry): {result.stderr.strip()[-800:]}")
        issues = json.loads(found.read_text(encoding="utf-8"))
    out, guards = set(), dict[Path, tuple[tuple[int, int], ...]]()
    for issue in issues:
        # DEP001: provided by nothing installed here; DEP003: installed here (the CLI's environment)
        # but not declared. The list declared is the whole lock, so both are missing from it.
        if issue["error"]["code"] not in ("DEP001", "DEP003"):
            continue
        where = Path(issue["location"]["file"])
        relative = (where if where.is_absolute() else scanned / where).relative_to(scanned)
        line = int(issue["location"]["line"])
        if relative not in guards:
            guards[relative] = _guarded_lines(root / relative)
        spans = guards[relative]
        if not any(first <= line <= last for first, last in spans):
            out.add(Missing(relative.as_posix(), line, issue["module"]))
    return sorted(out)


def _own_modules(root: Path) -> list[str]:
    """Every module name the code itself holds, at any depth: a script that puts a directory of its
    own on sys.path imports `helpers` from lib/helpers.py, which no package provides."""
    names = {p.stem for p in root.rglob("*.py")} | {p.parent.name for p in root.rglob("__init__.py")}
    return sorted(n for n in names if n.isidentifier() and n != "__init__")


def _guarded_lines(path: Path) -> tuple[tuple[int, int], ...]:
    """The lines of `path` in the body of a `try` that catches ImportError: optional imports, which
    the code runs without."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return ()
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try | ast.TryStar) and any(_catches(h.type) for h in node.handlers):
            spans.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
    return tuple(spans)


def _catches(kind: ast.expr | None) -> bool:
    if kind is None:  # a bare except
        return True
    if isinstance(kind, ast.Tuple):
        return any(_catches(k) for k in kind.elts)
    name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", "")
    return name in GUARDS

"""A run's environment takes the CLI environment's bytecode of the very files both hold (one inode,
as uv's cache hard-links them into both) and compiles only the rest (environment/venvs.py)."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import shutil
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

from dlinfra.environment import venvs


class ReadsRecorded(SourceFileLoader):
    read: list[str] = []

    def get_data(self, path: str) -> bytes:
        ReadsRecorded.read.append(path)
        return super().get_data(path)


def loads_from_bytecode(source: Path) -> bool:
    """Whether the interpreter would load `source` from its bytecode, never reading the source."""
    ReadsRecorded.read = []
    ReadsRecorded(source.stem, str(source)).get_code(source.stem)
    return str(source) not in ReadsRecorded.read


def test_the_donors_bytecode_of_the_same_file_is_linked_and_the_rest_compiled(tmp_path: Path) -> None:
    donor, site = tmp_path / "donor", tmp_path / "site"
    (donor / "pkg").mkdir(parents=True)
    (site / "pkg").mkdir(parents=True)
    for name in ("same", "copied", "stale", "uncompiled"):
        (donor / "pkg" / f"{name}.py").write_text(f"NAME = {name!r}\n")
    for name in ("same", "copied", "stale"):
        py_compile.compile(str(donor / "pkg" / f"{name}.py"))
    os.link(donor / "pkg" / "same.py", site / "pkg" / "same.py")
    # another file of the same size and time: its header would pass for the donor's bytecode
    (site / "pkg" / "copied.py").write_text("NAME = 'copieD'\n")
    shutil.copystat(donor / "pkg" / "copied.py", site / "pkg" / "copied.py")
    os.link(donor / "pkg" / "stale.py", site / "pkg" / "stale.py")
    with open(site / "pkg" / "stale.py", "a") as edited:  # after the donor compiled it
        edited.write("EDITED = True  # a longer file\n")
    os.link(donor / "pkg" / "uncompiled.py", site / "pkg" / "uncompiled.py")
    (site / "pkg" / "tests").mkdir()  # the package's own test suite: neither linked nor compiled
    (site / "pkg" / "tests" / "test_pkg.py").write_text("NAME = 'test'\n")

    left = list(venvs._seed_bytecode(site, donor))

    assert sorted(Path(p).name for p in left) == ["copied.py", "stale.py", "uncompiled.py"]
    assert not (site / "pkg" / "tests" / "__pycache__").exists()
    taken = Path(importlib.util.cache_from_source(str(site / "pkg" / "same.py")))
    assert taken.samefile(importlib.util.cache_from_source(str(donor / "pkg" / "same.py")))
    assert loads_from_bytecode(site / "pkg" / "same.py")
    assert not loads_from_bytecode(site / "pkg" / "stale.py")  # its donor bytecode was not taken
    venvs._compile(Path(sys.executable), left, few=True)
    for name in ("same", "copied", "stale", "uncompiled"):
        assert loads_from_bytecode(site / "pkg" / f"{name}.py"), name
    compiled: dict[str, object] = {}
    exec(ReadsRecorded("copied", str(site / "pkg" / "copied.py")).get_code("copied"), compiled)
    assert compiled["NAME"] == "copieD"  # its own source's, not the donor's file's


def test_files_handed_over_one_by_one_are_compiled_by_the_pool(tmp_path: Path) -> None:
    """The environment's path: the walk's files streamed to a compiler pool as they are found."""
    sources = []
    for i in range(40):
        (source := tmp_path / f"m{i}.py").write_text(f"N = {i}\n")
        sources.append(source)
    venvs._compile(Path(sys.executable), (str(s) for s in sources), few=False)
    assert all(loads_from_bytecode(s) for s in sources)

"""Paths the user names for a command to write (`render --out`, `compare --plot`, `plan --markdown`,
`init PATH`), through the real CLI: a path that cannot be written is one message naming the option,
the path and a fix, exit 2, and nothing is left half-written (no partial node files, no stray
staging files)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dlinfra.runs.run import Run
from dlinfra.spec.model import Spec
from support import Cli


@pytest.fixture
def recorded(home: Path) -> Run:
    run = Run.create(Spec())
    run.update_manifest(nodes=["chief-0", "worker-0", "ps-0"])
    return run


@pytest.fixture
def places(tmp_path: Path) -> Path:
    """A directory holding one file and one directory, to point options at."""
    root = tmp_path / "places"
    root.mkdir()
    (root / "a-file").write_text("keep me\n")
    (root / "a-dir").mkdir()
    return root


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` (hidden ones included) and what each file holds."""
    return {str(p.relative_to(root)): p.read_text() if p.is_file() else "<dir>" for p in root.rglob("*")}


def _refused(result: subprocess.CompletedProcess[str], option: str, path: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{option} {path}: " in result.stderr and "Fix: " in result.stderr, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# (command before the path, option, a path relative to `places` or an absolute one, what it is)
BAD = [
    (["render", "--out"], "--out", "a-file", "an existing file where a directory is wanted"),
    (["render", "--out"], "--out", "a-file/nodes", "a directory under a file"),
    (["render", "--out"], "--out", "/proc/x", "an unwritable place"),
    (["render", "--out"], "--out", "/sys/x", "an unwritable place (EACCES for root)"),
    (["plan", "--markdown"], "--markdown", "a-dir", "an existing directory where a file is wanted"),
    (["plan", "--markdown"], "--markdown", "missing/plan.md", "a parent that does not exist"),
    (["plan", "--markdown"], "--markdown", "a-file/plan.md", "a parent that is a file"),
    (["plan", "--markdown"], "--markdown", "/proc/x.md", "an unwritable place"),
    (["compare", "@last", "--plot"], "--plot", "a-dir", "an existing directory where a file is wanted"),
    (["compare", "@last", "--plot"], "--plot", "missing/t.png", "a parent that does not exist"),
    (["compare", "@last", "--plot"], "--plot", "/proc/x.png", "an unwritable place"),
    (["compare", "@last", "--plot"], "--plot", "/sys/x.png", "an unwritable place (EACCES for root)"),
    (["compare", "@last", "--plot"], "--plot", "t.txt", "not a PNG name (matplotlib would fail late)"),
    (["init"], "init", "missing/experiment.yaml", "a parent that does not exist"),
    (["init"], "init", "a-file/experiment.yaml", "a parent that is a file"),
    (["init"], "init", "/proc/x.yaml", "an unwritable place"),
]


@pytest.mark.parametrize(("command", "option", "path", "what"), BAD, ids=[f"{b[1]} {b[2]}" for b in BAD])
def test_an_output_path_that_cannot_be_written_is_refused_and_nothing_is_written(
    cli: Cli, recorded: Run, places: Path, command: list[str], option: str, path: str, what: str
) -> None:
    before = _snapshot(places)
    result = cli(*command, path, cwd=places)
    _refused(result, option, path)
    assert _snapshot(places) == before, what


def test_render_makes_missing_parents_and_the_directory_appears_whole(cli: Cli, places: Path) -> None:
    result = cli("render", "--out", "new/rendered", cwd=places)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (places / "new").iterdir()) == ["rendered"]  # no staging dir left
    written = sorted(p.name for p in (places / "new" / "rendered").iterdir())
    assert "chief-0.json" in written and "worker-0.user-data.yaml" in written
    assert oct((places / "new").stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def test_render_into_an_existing_directory_writes_all_of_its_files_or_none(cli: Cli, places: Path) -> None:
    out = places / "a-dir"
    (out / "old.txt").write_text("mine\n")
    (out / "worker-0.json").mkdir()  # where a node file must go: the whole render is refused
    before = _snapshot(places)
    result = cli("render", "--out", "a-dir", cwd=places)
    _refused(result, "--out", "a-dir")
    assert "worker-0.json is a directory" in result.stderr
    assert _snapshot(places) == before, "no node file may land when one cannot"

    (out / "worker-0.json").rmdir()
    result = cli("render", "--out", "a-dir", cwd=places)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert (out / "old.txt").read_text() == "mine\n" and (out / "ps-0.user-data.yaml").is_file()


def test_plot_lands_whole_at_the_named_path(cli: Cli, recorded: Run, places: Path) -> None:
    pytest.importorskip("matplotlib")
    result = cli("compare", "@last", "--plot", "a-dir/t.png", cwd=places)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (places / "a-dir").iterdir()] == ["t.png"]  # not t.png.png, no staging file
    assert (places / "a-dir" / "t.png").read_bytes().startswith(b"\x89PNG")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    ("cwd", "shown"),
    [
        ("repo", "repo/.github is not a directory"),  # set up below: .github is a file there
        ("/proc", "cannot write in /proc"),
    ],
)
def test_init_github_in_a_place_it_cannot_write_is_refused_and_writes_no_workflow(
    cli: Cli, places: Path, cwd: str, shown: str
) -> None:
    where = Path(cwd) if cwd.startswith("/") else places / "repo"
    if not cwd.startswith("/"):
        where.mkdir()
        (where / ".github").write_text("a file where the workflows' folder goes\n")
    before = _snapshot(places)
    pin = "dlinfra[aws,emulator] @ git+https://github.com/octo/dlinfra@" + "a" * 40
    result = cli("init", "--github", "--aws", "--install", pin, cwd=where)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--github " in result.stderr and "Fix: " in result.stderr and "internal error" not in result.stderr
    assert shown in result.stderr, result.stderr
    assert _snapshot(places) == before

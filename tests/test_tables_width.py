"""What a user copies out of the CLI's tables (a model URI, run ids, node names, instance types) stays
whole on one line at 80 columns, on a terminal and piped; the less useful columns give way first and
the table says which were left out."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from dlinfra.cli.console import set_color
from dlinfra.runs.records import MeanSd, Metrics, NodeState
from dlinfra.runs.run import Run
from dlinfra.spec.model import Spec
from dlinfra.watching import Outcome
from support import run_cli

RUN_DIR = "file:///home/someone/projects/my-experiments/.dlinfra/runs/digits-cnn-20261124-123051-4a20"
MODEL_URI = f"{RUN_DIR}/model"  # 96 characters: longer than a screen line
WORKERS = [f"worker-{i}" for i in range(13)]  # up to worker-12


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    return env | {"DLINFRA_HOME": str(home), "TERM": "xterm-256color"} | extra


def _on_a_terminal(args: list[str], env: dict[str, str], columns: int = 80) -> str:
    """The real CLI on a pseudo-terminal `columns` wide; its output without colour codes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    command = [sys.executable, "-m", "dlinfra", *args]
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    os.close(master)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def _whole_on_one_line(output: str, *values: str) -> str:
    """The one line that holds every value whole (a value is cut or wrapped if none does)."""
    lines = [
        line
        for line in output.splitlines()
        if all(re.search(rf"(?<![\w-]){re.escape(v)}(?![\w/-])", line) for v in values)
    ]
    assert len(lines) == 1, f"{values} not whole on one line of:\n{output}"
    return lines[0]


# ---------------------------------------------------------------- dlinfra status


@pytest.fixture
def training_run(home: Path) -> Run:
    """A run of 13 workers as a status check sees it mid-training (no training: records only)."""
    run = Run.create(Spec.model_validate({"cluster": {"workers": {"count": 13}}}))
    run.update_manifest(nodes=["chief-0", *WORKERS, "ps-0"], status="RUNNING")
    now = time.time()
    for index, node in enumerate(WORKERS):
        run.store().put_status(
            NodeState(
                node=node,
                role="worker",
                index=index,
                state="training",
                step=630,
                total_steps=3000,
                loss=0.4123,
                examples_per_sec=8514.0,
                started=now - 60,
                first_started=now - 60,
                heartbeat=now - 2,
                devices=["GPU:0 Tesla T4 15 GiB", "CPU:0"],
            )
        )
    return run


def _status_is_whole(output: str, run: Run) -> None:
    _whole_on_one_line(output, f"run {run.id}: RUNNING")
    for node in WORKERS:
        row = _whole_on_one_line(output, node)
        assert "training" in row.split() and "630/3000" in row.split(), row
    _whole_on_one_line(output, "chief-0", "booting")
    assert "not shown at 80 columns: devices" in output
    assert max(len(line) for line in output.splitlines()) <= 80, output


def test_status_piped_keeps_node_state_and_step_whole(home: Path, training_run: Run) -> None:
    result = run_cli("status", training_run.id, env=_env(home), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "+---" in result.stdout  # piped: plain ASCII
    _status_is_whole(result.stdout, training_run)


def test_status_on_an_80_column_terminal_keeps_node_state_and_step_whole(
    home: Path, training_run: Run
) -> None:
    output = _on_a_terminal(["status", training_run.id], _env(home))
    assert "━" in output  # a terminal: box drawing
    _status_is_whole(output, training_run)


# ---------------------------------------------------------------- deploy's result


@pytest.fixture
def at_80_columns(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """The CLI's consoles set up again at 80 columns, as on a terminal ("always") or piped ("auto"
    under pytest's capture); as they were afterwards."""

    def use(mode: str) -> None:
        monkeypatch.setenv("COLUMNS", "80")
        set_color(mode)  # type: ignore[arg-type]

    yield use
    monkeypatch.undo()
    set_color("auto")


@pytest.mark.parametrize("mode", ["auto", "always"], ids=["piped", "terminal"])
def test_deploy_result_puts_the_model_uri_whole_on_a_line_of_its_own(
    home: Path, at_80_columns: Callable[[str], None], capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    from dlinfra.cli.running import finish as _finish

    run = Run.create(Spec())
    metrics = Metrics(
        eval_accuracy=0.9833,
        steps=3000,
        total_steps=3000,
        strategy="parameter_server",
        workers=12,
        ps=2,
        batch_size=64,
        replicas=12,
        global_batch=768,
        learning_rate=0.01,
        lr_scaling="linear",
        train_seconds=11.3,
        finished_at=time.time(),
        global_steps_per_sec=MeanSd(mean=133.0, sd=26.6),
        examples_per_sec=MeanSd(mean=8514.0, sd=1702.0),
        model_uri=MODEL_URI,
    )
    startup = [("spawned", 0.6), ("up", 1.3), ("tensorflow", 4.4), ("peers", 4.4), ("first step", 5.8)]
    outcome = Outcome(run, "DONE", metrics, wall_seconds=11.3, seconds_to_first_step=5.8, startup=startup)
    at_80_columns(mode)
    _finish(outcome)
    output = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().out)
    assert _whole_on_one_line(output, MODEL_URI) == f"model: {MODEL_URI}"
    _whole_on_one_line(output, f"run {run.id}: DONE")
    assert "eval accuracy" in output and "0.9833" in output
    table = [line for line in output.splitlines() if not line.startswith("model: ")]
    assert max(len(line) for line in table) <= 80, output


# ---------------------------------------------------------------- the other tables


def test_runs_keeps_a_run_id_whole_even_narrower_than_it() -> None:
    from dlinfra.cli.tables import runs_table

    run_id = "digits-cnn-20261124-123051-4a20"
    row = {
        "run_id": run_id,
        "status": "DONE",
        "age": "3m",
        "target": "local",
        "strategy": "parameter_server",
        "eval_accuracy": 0.98,
        "resources_up": False,
        "usd_per_hour": None,
    }
    printed = io.StringIO()
    Console(width=24, file=printed, soft_wrap=True).print(runs_table([row], 24))
    _whole_on_one_line(printed.getvalue(), run_id)


@pytest.mark.parametrize("columns", [60, 70, 80])
def test_runs_says_what_it_left_out_within_the_screen(columns: int) -> None:
    """The note naming the columns left out wraps too: our consoles soft-wrap, so rich never does."""
    from dlinfra.cli.tables import runs_table

    row = {
        "run_id": "digits-cnn-20261124-123051-4a20",
        "status": "RUNNING",
        "age": "3m",
        "target": "aws",
        "strategy": "parameter_server",
        "eval_accuracy": None,
        "resources_up": True,
        "usd_per_hour": 1.25,
        "owner": "controller i-0abc",
    }
    printed = io.StringIO()
    Console(width=columns, file=printed, soft_wrap=True).print(runs_table([row], columns))
    text = printed.getvalue()
    assert max(len(line) for line in text.splitlines()) <= columns, text
    note = " ".join(text.split("not shown at", 1)[1].split())
    named, _, rest = note.partition(" (")
    assert named.startswith(f"{columns} columns: ") and rest == "`dlinfra runs --json` has all)", text
    assert {"owner", "resources", "strategy"} <= set(named.split(": ")[1].split(", ")), text
    assert any("`dlinfra runs --json`" in line for line in text.splitlines()), "the command is whole"


def test_instances_keeps_every_instance_type_whole(home: Path) -> None:
    from dlinfra.spec.catalog import catalog

    result = run_cli("instances", "--gpu", env=_env(home, COLUMNS="60"), timeout=120)
    assert result.returncode == 0, result.stderr
    for kind in catalog().types:
        if kind.gpus:
            _whole_on_one_line(result.stdout, kind.name)


def test_show_prints_paths_exactly_even_with_brackets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "[red]home"  # rich markup, unless escaped: the paths would lose "[red]"
    monkeypatch.setenv("DLINFRA_HOME", str(home))
    run = Run.create(Spec())
    result = run_cli("show", run.id, env=_env(home), timeout=120)
    assert result.returncode == 0, result.stderr
    assert _whole_on_one_line(result.stdout, str(run.dir)) == f"run_dir: {run.dir}"


def test_the_note_never_cuts_the_command_it_names_at_any_width() -> None:
    from dlinfra.cli.tables import _dropped_caption

    dropped = ["age", "target", "strategy", "cost", "resources", "owner"]
    for columns in range(30, 120):
        note = _dropped_caption(dropped, columns, "dlinfra runs --json")
        assert note is not None and any("`dlinfra runs --json`" in line for line in note.splitlines()), (
            columns,
            note,
        )


def test_the_preflight_table_keeps_every_node_name_whole_on_a_narrow_screen() -> None:
    from rich.console import Console

    from dlinfra.cli.preflight_view import drawn

    header = ["node", "gemm GFLOP/s", "conv GFLOP/s", "all-reduce GB/s bus", "reduced MB", "quota", "flag"]
    rows = [header] + [[f"worker-{i}", "119", "105", "0.022", "0.6", "-", "gemm, conv"] for i in range(12)]
    console = Console(width=60, record=True, color_system=None)
    console.print(drawn(rows, "preflight, round 1"))
    shown = console.export_text()
    assert all(f"worker-{i} " in shown for i in range(12)), shown
    assert max(map(len, shown.splitlines())) <= 60

"""`dlinfra compare`, `runs` and short run ids over three real runs: every column, JSON equal to the
runs' metrics, markdown, a real PNG plot; output that fits 80 and 200 columns, piped and on a terminal
(a real pty); git-like short ids."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from dlinfra.runs.compare import COLUMNS
from support import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SHAPES = {
    "ps-1w": ("--workers", "1"),
    "ps-2w": ("--workers", "2"),
    "mwms-2w": ("--strategy", "multi_worker_mirrored", "--workers", "2"),
}


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str], Path]:
    tmp = tmp_path_factory.mktemp("compare")
    env = dict(os.environ, DLINFRA_HOME=str(tmp / "home"))
    ids = {}
    for label, args in SHAPES.items():
        result = run_cli("deploy", *args, "--steps", "100", env=env, cwd=tmp, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        ids[label] = max((tmp / "home" / "runs").iterdir(), key=lambda p: p.stat().st_mtime).name
    return ids, env, tmp


def test_table_shows_every_column_for_every_run(three_runs) -> None:
    ids, env, tmp = three_runs
    result = run_cli("compare", *ids.values(), env=dict(env, COLUMNS="400"), cwd=tmp)
    assert result.returncode == 0, result.stderr
    for column in COLUMNS:
        assert column in result.stdout
    for run_id in ids.values():
        assert run_id in result.stdout
    assert "1xchief, 2xworker, 1xps" in result.stdout  # local: no instance types to name
    assert "±" in result.stdout and "cost $: instance-hours" in result.stdout


def test_json_carries_the_runs_own_metrics(three_runs) -> None:
    ids, env, tmp = three_runs
    result = run_cli("compare", *ids.values(), "--json", env=env, cwd=tmp)
    assert result.returncode == 0, result.stderr
    rows = {r["run"]: r for r in json.loads(result.stdout)}
    for label, run_id in ids.items():
        metrics = json.loads((tmp / "home" / "runs" / run_id / "store" / "metrics.json").read_text())
        row = rows[run_id]
        assert row["examples_per_sec"] == metrics["examples_per_sec"]
        assert row["global_steps_per_sec"] == metrics["global_steps_per_sec"]
        assert (
            row["eval_accuracy"] == metrics["eval_accuracy"]
            and row["train_seconds"] == metrics["train_seconds"]
        )
        assert row["cost_usd"] == 0.0 and row["wall_seconds"] > row["train_seconds"] > 0
        assert row["strategy"] == (
            "multi_worker_mirrored" if label.startswith("mwms") else "parameter_server"
        )


def test_markdown_and_plot(three_runs, tmp_path: Path) -> None:
    ids, env, tmp = three_runs
    png = tmp_path / "throughput.png"
    result = run_cli("compare", *ids.values(), "--markdown", "--plot", str(png), env=env, cwd=tmp)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |" and lines[1].startswith("|---|")
    assert sum(line.startswith("| ") for line in lines) == 1 + len(ids)
    assert png.stat().st_size > 10_000
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 400 and image.shape[1] >= 700
    assert len({tuple(px) for px in image.reshape(-1, image.shape[-1])[::97]}) > 3, "more than a blank canvas"


def test_unknown_run_exits_2(three_runs) -> None:
    ids, env, tmp = three_runs
    result = run_cli("compare", ids["ps-1w"], "no-such-run", env=env, cwd=tmp)
    assert result.returncode == 2 and "no-such-run" in result.stderr and "Traceback" not in result.stderr


BOX_DRAWING = re.compile("[\u2500-\u257f]")
ESCAPE = "\x1b["
# SGR colour parameters (foreground, background, 256/true colour); bold and dim are not colour
COLOUR = re.compile(r"\x1b\[(?:[0-9]*;)*(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")


def _piped(env: dict[str, str], tmp: Path, columns: int, *args: str) -> str:
    result = run_cli(*args, env=dict(env, COLUMNS=str(columns)), cwd=tmp)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _on_a_terminal(env: dict[str, str], tmp: Path, columns: int, *args: str) -> str:
    """The command's output on a real pseudo-terminal `columns` wide, as a person's shell runs it."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    term_env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlinfra", *args],
        stdin=child,
        stdout=child,
        stderr=child,
        env=term_env,
        cwd=tmp,
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: every holder of the terminal's other end is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def _values(rows: list[dict]) -> list[str]:
    """Every metric of every run as the table writes it: each must appear whole."""
    found = []
    for r in rows:
        found += [f"{r['eval_accuracy']:.4f}", f"{r['train_seconds']:.1f}", f"{r['wall_seconds']:.0f}"]
        found += [f"{r['examples_per_sec']['mean']:.0f} ± {r['examples_per_sec']['sd']:.0f}"]
        found += [f"{r['global_steps_per_sec']['mean']:.1f} ± {r['global_steps_per_sec']['sd']:.1f}"]
    return found


def test_compare_at_80_columns_piped_fits_and_keeps_every_value_whole(three_runs) -> None:
    ids, env, tmp = three_runs
    text = _piped(env, tmp, 80, "compare", *ids.values())
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert ESCAPE not in text and not BOX_DRAWING.search(text), text
    rows = json.loads(_piped(env, tmp, 80, "compare", *ids.values(), "--json"))
    for value in _values(rows):
        assert value in text, f"{value!r} is not whole in:\n{text}"
    for run_id in ids.values():  # short labels, and a legend with every whole id
        assert f"digits-cnn:{run_id[-4:]} = {run_id}" in lines, text
    wide = _piped(env, tmp, 200, "compare", *ids.values())
    assert all(run_id in wide for run_id in ids.values()) and max(map(len, wide.splitlines())) <= 200
    assert "digits-cnn:" not in wide, "runs as rows when the screen is wide enough"


def test_runs_never_cuts_a_run_id_and_says_what_it_dropped(three_runs) -> None:
    ids, env, tmp = three_runs
    narrow = _piped(env, tmp, 80, "runs")
    assert all(run_id in narrow for run_id in ids.values()), narrow
    assert (
        max(map(len, narrow.splitlines())) <= 80 and ESCAPE not in narrow and not BOX_DRAWING.search(narrow)
    )
    assert "not shown at 80 columns: strategy" in narrow, narrow
    wide = _piped(env, tmp, 200, "runs")
    assert all(run_id in wide for run_id in ids.values()) and "not shown" not in wide
    assert "multi_worker_mirrored" in wide


@pytest.mark.parametrize("columns", [80, 200])
def test_a_terminal_gets_colour_and_boxes_a_pipe_neither_unless_asked(three_runs, columns: int) -> None:
    ids, env, tmp = three_runs
    shown = _on_a_terminal(env, tmp, columns, "compare", *ids.values())
    assert ESCAPE in shown and BOX_DRAWING.search(shown), shown
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", shown).replace("\r", "")
    assert all(run_id[-4:] in plain for run_id in ids.values())
    assert max(len(line) for line in plain.splitlines()) <= columns, plain
    runs = _on_a_terminal(env, tmp, columns, "runs")
    assert COLOUR.search(runs), "DONE in green"
    no_colour = _on_a_terminal(dict(env, NO_COLOR="1"), tmp, columns, "runs")
    assert ESCAPE in no_colour and not COLOUR.search(no_colour), repr(no_colour[:2000])
    forced = _piped(env, tmp, columns, "--color", "always", "runs")
    assert ESCAPE in forced and BOX_DRAWING.search(forced)
    never = _on_a_terminal(env, tmp, columns, "--color", "never", "runs")
    assert ESCAPE not in never and not BOX_DRAWING.search(never), repr(never[:2000])


def test_short_ids_name_a_run_like_git(three_runs) -> None:
    ids, env, tmp = three_runs
    newest = ids["mwms-2w"]
    by = {
        ids["ps-1w"][-4:]: ids["ps-1w"],  # the 4-hex suffix
        ids["ps-2w"][:-3]: ids["ps-2w"],  # a unique prefix
        "@last": newest,
        "@last~2": ids["ps-1w"],
    }
    for ref, run_id in by.items():
        shown = json.loads(_piped(env, tmp, 200, "show", ref, "--json"))
        assert shown["run_id"] == run_id, ref
    assert "first life" in _piped(env, tmp, 200, "logs", "@last", "--node", "worker-0")
    rows = json.loads(_piped(env, tmp, 200, "compare", "--last", "2", "--json"))
    assert [r["run"] for r in rows] == [ids["ps-2w"], newest]
    ambiguous = run_cli("status", "digits-cnn", env=env, cwd=tmp)
    assert ambiguous.returncode == 2 and "Traceback" not in ambiguous.stderr
    assert "ambiguous" in ambiguous.stderr and all(run_id in ambiguous.stderr for run_id in ids.values())
    unused = next(h for h in ("ffff", "fffe", "fffd", "fffc") if all(not i.endswith(h) for i in ids.values()))
    for bad in ("@last~3", unused, "../x", "@first"):
        result = run_cli("show", bad, env=env, cwd=tmp)
        assert (
            result.returncode == 2 and "Traceback" not in result.stderr and result.stderr.count("\n") == 1
        ), bad

"""The README's one-minute tour, run as written: its commands are read from README.md's own bash
blocks, so an edit of the README that breaks a command (a renamed option, a placeholder the CLI does
not take) fails here. They run in a fresh project directory, with DLINFRA_HOME at `./.dlinfra` (the
default, so the README's paths hold) in a temporary directory; the only substitutions are the
placeholders the README writes in capitals (RUN, N).

A line such as `dlinfra status [RUN] [--json]` is a synopsis: it runs bare, then once with each
optional part (each choice of `[a|b]`), and each alternative after ` | ` the same way. A command that
cannot run here is in SKIPPED with the reason; one the README gains is run, and fails until a check
of its output is written below (or it is skipped, saying why). `tensorboard`, a server that never
exits, is not run: the --logdir the README gives is checked to hold the run's event files.

Run as written, the deploy takes about 50 s of this loaded 2-core machine (most of it the nodes'
start); the whole test about a minute."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import REPO, run_cli

README = REPO / "README.md"

SKIPPED = {
    "dlinfra deploy --detach": "a second run of the built-in example, left to train alone: "
    "tests/e2e/test_detach.py deploys detached and re-attaches; `watch` and `watch RUN` run here",
    "dlinfra debug": "needs a live run (py-spy on its trainers): the tour's run has ended by then, "
    "and `debug` then exits 2 pointing at `logs RUN --stacks`",
    "dlinfra debug RUN": "as `dlinfra debug`",
    "dlinfra rerun RUN": "tests/e2e/test_rerun.py reruns as is; here `rerun RUN --workers N` runs the "
    "same path with one worker, the cheapest rerun",
    "dlinfra rerun RUN --target aws": "needs an AWS account (the emulated aws target is "
    "tests/e2e/test_aws_emulated.py's)",
}
# RUN…: the tour has one run by then (compare shows it once); --last 1: that run; --workers 1: the
# lightest rerun
PLACEHOLDERS = {"RUN…": "{run}", "RUN": "{run}", "N": "1"}


def fenced(readme: str) -> list[tuple[str, str]]:
    """The (language, text) of each fenced block of the README's "One-minute tour" section."""
    section = readme[readme.index("## One-minute tour") :]
    section = section[: section.index("\n## ")]
    return re.findall(r"^```(\w*)\n(.*?)^```$", section, flags=re.M | re.S)


def tour_blocks(readme: str) -> list[str]:
    return [text for language, text in fenced(readme) if language == "bash"]


def result_block(readme: str) -> str:
    """The sample output after the tour's first bash block: `run …: DONE`, the table, `model: …`."""
    return next(text for language, text in fenced(readme) if not language)


def synopses(block: str) -> list[str]:
    """A block's commands: comments cut, `a; b` two commands."""
    lines = (re.split(r"\s+#", line)[0] for line in block.splitlines())
    return [part.strip() for line in lines for part in line.split(";") if part.strip()]


def invocations(synopsis: str) -> list[str]:
    """What a synopsis says one can type: bare, and with each optional part alone, for the synopsis and
    each of its ` | ` alternatives (which continue the same command)."""
    head, *alternatives = re.split(r"\s+\|\s+", synopsis)
    words = head.split()
    command = " ".join(words[:2] if words[0] == "dlinfra" else words[:1])
    out: list[str] = []
    for form in [head, *(f"{command} {alternative}" for alternative in alternatives)]:
        parts = re.split(r"\s*\[([^\]]+)\]", form)  # text, optional, text, optional, …, text
        texts, optional = parts[::2], parts[1::2]
        out.append(" ".join(" ".join(texts).split()))
        for k, group in enumerate(optional):
            for choice in group.split("|"):
                kept = [*texts[: k + 1], choice, *texts[k + 1 :]]
                out.append(" ".join(" ".join(kept).split()))
    return list(dict.fromkeys(out))


def tour(readme: str) -> list[str]:
    return [i for block in tour_blocks(readme) for s in synopses(block) for i in invocations(s)]


def substituted(invocation: str, run: str) -> list[str]:
    words = [PLACEHOLDERS.get(word, word).format(run=run) for word in shlex.split(invocation)]
    return [re.sub(r"(?<=/)RUN(?=/)", run, word) for word in words]


def first_column(output: str) -> list[tuple[str, str]]:
    """A result table's rows as (label, value) cells, one per printed line (a wrapped label spans two)."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[|│]", line)]
        if len(cells) == 4 and (cells[1] or cells[2]):
            rows.append((cells[1], cells[2]))
    return rows


@dataclass
class Tour:
    project: Path
    readme: str
    run: str = ""  # what the deploy printed
    runs: list[str] = field(default_factory=list)


def _deploy(tour: Tour, args: list[str], out: str) -> None:
    """`run ID: DONE`, the README's table rows (labels; values that do not depend on the machine), and
    the model where the README says it is."""
    done = re.search(r"^run (\S+): DONE$", out, flags=re.M)
    assert done, out
    tour.run = done[1]
    sample = result_block(tour.readme)
    shown = first_column(sample)
    labels = " ".join(label for label, _ in first_column(out) if label)
    assert all(label in labels for label, _ in shown if label), (shown, labels)
    values = dict(first_column(out))
    for label in ("strategy", "workers / ps"):
        assert values[label] == dict(shown)[label], (label, values[label])
    assert float(values["eval accuracy"]) > 0.9, values["eval accuracy"]
    sample_run = re.search(r"^run (\S+): DONE$", sample, flags=re.M)[1]  # type: ignore[index]
    model = re.search(r"^model: (\S+)$", sample, flags=re.M)[1]  # type: ignore[index]
    expected = model.replace("/home/you/project", str(tour.project)).replace(sample_run, tour.run)
    assert f"model: {expected}\n" in out, out
    assert (Path(expected.removeprefix("file://")) / "model.keras").is_file(), expected


def _compare(tour: Tour, args: list[str], out: str) -> None:
    if "--json" in args:
        assert [r["run"] for r in json.loads(out)] == [tour.run]
        return
    if "--plot" in args:
        assert (tour.project / args[args.index("--plot") + 1]).read_bytes().startswith(b"\x89PNG")
    # a narrow table names a run by its experiment and its 4 hex
    name, hex4 = re.fullmatch(r"(.+)-\d{8}-\d{6}-([0-9a-f]{4})", tour.run).groups()  # type: ignore[union-attr]
    assert tour.run in out or f"{name}:{hex4}" in out, out


def _rerun(tour: Tour, args: list[str], out: str) -> None:
    assert out.startswith(f"rerun of {tour.run}"), out
    again = re.search(r"^run (\S+): DONE$", out, flags=re.M)
    assert again and again[1] != tour.run, out
    if "--workers" in args:
        workers = args[args.index("--workers") + 1]
        assert dict(first_column(out))["workers / ps"] == f"{workers} / 1", out


def _tensorboard(tour: Tour, args: list[str]) -> None:
    """Not run: a server that never exits. Its --logdir, relative to the project, holds the events."""
    logdir = tour.project / args[args.index("--logdir") + 1]
    assert list(logdir.glob("events.out.tfevents.*")), logdir


def _init(tour: Tour, args: list[str], out: str) -> None:
    assert out.startswith(f"wrote {args[1]}") and (tour.project / args[1]).is_file(), out


def _validate(tour: Tour, args: list[str], out: str) -> None:
    assert out.startswith(f"{args[1]}: valid"), out


def _runs(tour: Tour, args: list[str], out: str) -> None:
    assert re.search(rf"{tour.run} +\| DONE", out), out


def _status(tour: Tour, args: list[str], out: str) -> None:
    if "--json" in args:
        status = json.loads(out)
        assert status["run_id"] == tour.run and status["status"] == "DONE", status["status"]
        chief = status["nodes"]["chief-0"]
        assert chief["step"] == chief["total_steps"], chief
    else:
        assert f"run {tour.run}: DONE" in out and re.search(r"chief-0 +\| done", out), out


def _logs(tour: Tour, args: list[str], out: str) -> None:
    node = args[args.index("--node") + 1]
    assert out.startswith(f"dlinfra node {node} of run {tour.run}"), out


def _watch(tour: Tour, args: list[str], out: str) -> None:
    assert f"run {tour.run}: DONE" in out, out


def _show(tour: Tour, args: list[str], out: str) -> None:
    if "--json" in args:
        assert json.loads(out)["run_id"] == tour.run
    else:
        assert f"run_id: {tour.run}\n" in out and "model: file://" in out, out


def _report(tour: Tour, args: list[str], out: str) -> None:
    """The page where it says, of this run, a lane per node (tests/test_report.py opens pages in
    Chromium; here only what the tour's command wrote)."""
    path = args[args.index("-o") + 1] if "-o" in args else f"report-{tour.run}.html"
    assert out == f"report: {path}\n", out
    page = (tour.project / path).read_text()
    assert f"<h1>run {tour.run} " in page and page.count('<g class="lane"') == 5, page[:500]


CHECKS: dict[str, Callable[[Tour, list[str], str], None]] = {
    "init": _init,
    "validate": _validate,
    "deploy": _deploy,
    "runs": _runs,
    "status": _status,
    "logs": _logs,
    "watch": _watch,
    "show": _show,
    "compare": _compare,
    "report": _report,
    "rerun": _rerun,
}


def test_every_command_of_the_tour_is_run_or_skipped_with_a_reason() -> None:
    """What the README shows is what the tour test below runs (no deploy here: a quick check of the
    lists)."""
    invocations_ = tour(README.read_text())
    assert invocations_[:3] == [
        "dlinfra init experiment.yaml",
        "dlinfra validate experiment.yaml",
        "dlinfra deploy experiment.yaml --workers 3 --set training.steps=1000",
    ], invocations_
    assert set(SKIPPED) <= set(invocations_), "SKIPPED names what the README no longer shows"
    unchecked = [
        i
        for i in invocations_
        if i not in SKIPPED and i.split()[0] == "dlinfra" and i.split()[1] not in CHECKS
    ]
    assert unchecked == [], "the README's tour shows these: check their output here, or skip them saying why"


@pytest.mark.e2e
@pytest.mark.slow
def test_the_readme_tour_runs_as_written_and_each_command_shows_the_run(tmp_path: Path) -> None:
    """One real deploy as the README writes it (1 chief, 3 workers, 1 ps, 1000 steps), then every
    command of the tour on it, in the README's order; and one rerun with one worker."""
    project = tmp_path / "project"
    project.mkdir()
    tour_ = Tour(project, README.read_text())
    env = {**os.environ, "DLINFRA_HOME": str(project / ".dlinfra")}
    ran = []
    for invocation in tour(tour_.readme):
        if invocation in SKIPPED:
            continue
        args = substituted(invocation, tour_.run)
        if args[0] == "tensorboard":
            _tensorboard(tour_, args)
            ran.append(invocation)
            continue
        assert args[0] == "dlinfra", f"{invocation}: not a dlinfra command; check it here or skip it"
        result = run_cli(*args[1:], env=env, cwd=project, timeout=600)
        assert result.returncode == 0, (
            f"{invocation}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
        CHECKS[args[1]](tour_, args[1:], result.stdout)
        ran.append(invocation)
    assert (
        "dlinfra compare --last N --plot throughput.png" in ran and "dlinfra rerun RUN --workers N" in ran
    ), ran

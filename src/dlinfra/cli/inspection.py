"""Commands that look at recorded runs (and tear them down): thin views over dlinfra.reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from dlinfra.cli.console import out
from dlinfra.cli.options import JsonOpt, RunArg
from dlinfra.errors import DlinfraError

inspection_app = typer.Typer()


@inspection_app.command()
def status(run_id: RunArg = None, as_json: JsonOpt = False) -> None:
    """Per-node state, step, heartbeat age and restarts of a run."""
    from dlinfra.cli.views import nodes_table
    from dlinfra.runs.reports import run_status
    from dlinfra.runs.results import cost_line

    report = run_status(run_id)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    for role, hw in report["roles"].items():
        out.print(f"{role:<7} {hw['count']:>3} x {hw['hardware']}", markup=False)
    if (line := cost_line(report["cost"])) is not None:
        out.print(line, markup=False)
    out.print(nodes_table(report["nodes"], out.width, title=f"run {report['run_id']}: {report['status']}"))
    for said in report["stragglers"].values():
        out.print(said, markup=False)


@inspection_app.command()
def logs(
    run_id: Annotated[str, typer.Argument(help="Run id, or a short id (prefix, 4-hex suffix, @last).")],
    node: Annotated[
        str | None, typer.Option("--node", help="Node name, e.g. worker-0 (default: all).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")
    ] = False,
    stacks: Annotated[
        bool, typer.Option("--stacks", help="The stack dumps kept for a frozen or stalled run instead.")
    ] = False,
    console: Annotated[
        bool,
        typer.Option(
            "--console", help="The VMs' serial consoles (--emulate-instances=vm): boot, cloud-init."
        ),
    ] = False,
) -> None:
    """Print node logs of a run."""
    from dlinfra.runs.reports import consoles, follow_logs, stored_stacks

    if console:
        lines = consoles(run_id, node)
    else:
        lines = stored_stacks(run_id, node) if stacks else follow_logs(run_id, node, follow)
    for line in lines:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


@inspection_app.command()
def debug(
    run_id: RunArg = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node (default: all).")] = None,
) -> None:
    """Dump the Python stacks of a live run's trainers (py-spy, through each node's beacon)."""
    from dlinfra.runs.reports import live_stacks

    for line in live_stacks(run_id, node):
        sys.stdout.write(line + "\n")


@inspection_app.command()
def runs(as_json: JsonOpt = False) -> None:
    """List runs, newest first: status, age, target, accuracy."""
    from dlinfra.cli.tables import runs_table
    from dlinfra.runs.reports import list_run_rows

    rows = list_run_rows()
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    out.print(runs_table(rows, out.width))


@inspection_app.command()
def compare(
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(
            help="Runs to compare: ids, unique prefixes, 4-hex suffixes, @last~N.", show_default=False
        ),
    ] = None,
    last: Annotated[int | None, typer.Option("--last", help="Compare the N newest runs.")] = None,
    as_json: JsonOpt = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="A markdown table (for PRs, reports).")
    ] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also draw examples/s over time per run into this PNG.")
    ] = None,
    scaling: Annotated[
        Path | None,
        typer.Option(
            "--scaling",
            help="Also draw examples/s against workers into this PNG: measured, and the sizing advisor's "
            "prediction, a line per strategy and ps count.",
        ),
    ] = None,
) -> None:
    """Runs side by side: roles, strategy, steps/s, examples/s against the predicted, time, accuracy, cost."""
    from dlinfra.cli.outputs import check_file, new_file
    from dlinfra.runs import compare as comparison

    if run_ids and last is not None:
        raise DlinfraError("compare: name the runs or give --last N, not both. Fix: drop one of them")
    if not run_ids and last is None:
        raise DlinfraError("compare: which runs? Fix: name them (dlinfra compare 39a1 8a06) or --last 2")
    drawn = [(path, flag, draw) for path, flag, draw in _plots(plot, scaling) if path is not None]
    for path, flag, _ in drawn:
        check_file(path, flag, "throughput.png", suffix=".png")
    rows = comparison.compare(run_ids or comparison.last_runs(last or 0))
    for path, flag, draw in drawn:
        with new_file(path, flag) as staged:
            draw(rows, staged)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif markdown:
        from dlinfra.cli.compare_view import compare_markdown

        sys.stdout.write(compare_markdown(rows))
    else:
        from dlinfra.cli.compare_view import compare_view

        for part in compare_view(rows, out.width):
            out.print(part)
    if not as_json:
        for path, _, _ in drawn:
            out.print(f"plot: {path}", markup=False)


def _plots(plot: Path | None, scaling: Path | None) -> list[tuple[Path | None, str, Any]]:
    from dlinfra.runs import compare as comparison

    return [(plot, "--plot", comparison.plot), (scaling, "--scaling", comparison.scaling_plot)]


@inspection_app.command()
def show(run_id: RunArg = None, as_json: JsonOpt = False) -> None:
    """A run's manifest, metrics and where its model and TensorBoard logs are."""
    from dlinfra.runs.reports import run_details

    details = run_details(run_id)
    if as_json:
        sys.stdout.write(json.dumps(details, indent=2) + "\n")
        return
    for key, value in details.items():
        if key == "preflight":
            continue
        if isinstance(value, dict):
            value = json.dumps(value)
        elif isinstance(value, list):  # lines (each restart): one a line
            value = "".join(f"\n  {line}" for line in value)
        out.print(f"[bold]{key}[/]: {escape(str(value))}")  # a path may hold [x]
    if details.get("preflight"):
        from dlinfra.cli.preflight_view import preflight_view
        from dlinfra.runs.run import Run

        out.print(preflight_view(Run.open(details["run_id"]).store()))


@inspection_app.command()
def report(
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(
            help="The run (default: the newest); with --compare, the runs: ids, prefixes, 4-hex "
            "suffixes, @last~N.",
            show_default=False,
        ),
    ] = None,
    side_by_side: Annotated[
        bool, typer.Option("--compare", help="Several runs side by side on one page.")
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="The HTML file to write (default: report-<run id>.html here)."),
    ] = None,
) -> None:
    """One self-contained HTML page of a run: result, timeline of each node, throughput, loss, preflight,
    stragglers, cost, environment; it opens offline."""
    from dlinfra.cli.outputs import check_file, write_file
    from dlinfra.runs import report_page
    from dlinfra.runs.run import Run

    refs = run_ids or []
    if side_by_side and len(refs) < 2:
        raise DlinfraError("report --compare: name two runs or more. Fix: dlinfra report --compare 39a1 8a06")
    if not side_by_side and len(refs) > 1:
        raise DlinfraError("report: one run per page. Fix: --compare to put several side by side")
    first = Run.open(refs[0] if refs else None)  # an unknown run is refused before anything is written
    path = output or Path(f"report-{first.id}{'-compared' if side_by_side else ''}.html")
    check_file(path, "--output", "report.html", suffix=".html")
    page = report_page.compare_page(refs) if side_by_side else report_page.run_page(first.id)
    write_file(path, "--output", page)
    out.print(f"report: {path}", markup=False)


@inspection_app.command()
def destroy(
    run_id: Annotated[
        str | None, typer.Argument(help="Run id, or a short id (prefix, 4-hex suffix, @last).")
    ] = None,
    ended: Annotated[
        bool, typer.Option("--ended", help="Every run that has ended but whose cloud resources are still up.")
    ] = False,
) -> None:
    """Tear down whatever a run left running (aws: terraform destroy of its stack)."""
    from dlinfra.runs.reports import destroy_ended, destroy_run

    if (run_id is None) == (not ended):
        raise DlinfraError("destroy: name a run, or pass --ended (not both). Fix: `dlinfra runs` lists them")
    for line in destroy_ended() if ended else [destroy_run(run_id)]:  # type: ignore[arg-type]
        out.print(line, markup=False)

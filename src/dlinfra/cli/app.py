"""`dlinfra`: parse arguments → call one domain function → print. Errors: one boundary in `main`."""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dlinfra import __version__
from dlinfra.errors import DlinfraError, SpecError
from dlinfra.spec import Overrides, Spec, load_spec

app = typer.Typer(
    help="Experiment files in, transient distributed TensorFlow clusters out (local processes or AWS).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
node_app = typer.Typer(help="Commands that run on a cluster node.", no_args_is_help=True)
app.add_typer(node_app, name="node")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# Options shared by every command that takes a spec.
SpecArg = Annotated[
    Path | None, typer.Argument(help="Experiment YAML (default: the built-in digits example).")
]
WorkersOpt = Annotated[int | None, typer.Option("--workers", help="cluster.workers.count")]
PsOpt = Annotated[int | None, typer.Option("--ps", help="cluster.ps.count")]
StrategyOpt = Annotated[
    str | None, typer.Option("--strategy", help="parameter_server | multi_worker_mirrored")
]
StepsOpt = Annotated[int | None, typer.Option("--steps", help="training.steps")]
TargetOpt = Annotated[str | None, typer.Option("--target", help="local | aws")]
EndpointOpt = Annotated[
    str | None, typer.Option("--endpoint-url", help="aws.endpoint_url (moto, LocalStack)")
]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Any field: --set training.batch_size=256")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="aws: apply without asking.")]
KeepOpt = Annotated[bool, typer.Option("--keep", help="aws: keep the stack after the run.")]
EmulateOpt = Annotated[
    bool,
    typer.Option("--emulate-instances", help="aws + endpoint: boot instances' user-data as local processes."),
]
RunArg = Annotated[str | None, typer.Argument(help="Run id (default: the newest run).")]


def _spec(
    spec: Path | None,
    workers: int | None = None,
    ps: int | None = None,
    strategy: str | None = None,
    steps: int | None = None,
    target: str | None = None,
    endpoint_url: str | None = None,
    sets: list[str] | None = None,
) -> Spec:
    overrides = Overrides(
        workers=workers,
        ps=ps,
        strategy=strategy,
        steps=steps,
        target=target,
        endpoint_url=endpoint_url,
        sets=sets or [],
    )
    return load_spec(spec, overrides)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of unexpected errors.")] = False,
) -> None:
    _state["debug"] = debug


_state: dict[str, Any] = {"debug": False}


# ---------------------------------------------------------------- spec commands


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example.")] = Path("experiment.yaml"),
) -> None:
    """Write a commented example experiment file."""
    from dlinfra.spec import example_text

    if path.exists():
        raise DlinfraError(f"{path} already exists. Fix: choose another path or remove it")
    path.write_text(example_text(), encoding="utf-8")
    out.print(f"wrote {path}; next: dlinfra validate {path} && dlinfra deploy {path}")


@app.command()
def validate(
    spec: SpecArg = None,
    workers: WorkersOpt = None,
    ps: PsOpt = None,
    strategy: StrategyOpt = None,
    steps: StepsOpt = None,
    target: TargetOpt = None,
    endpoint_url: EndpointOpt = None,
    sets: SetOpt = None,
) -> None:
    """Check an experiment file (and overrides) without running anything."""
    from dlinfra.render import plan_addresses

    resolved = _spec(spec, workers, ps, strategy, steps, target, endpoint_url, sets)
    plan = plan_addresses(resolved)
    out.print(
        f"{spec or '<built-in default>'}: valid · {resolved.target} · {resolved.strategy} · "
        f"{len(plan.nodes)} nodes ({', '.join(f'{k} {len(v)}' for k, v in plan.cluster().items())})"
    )


@app.command()
def schema() -> None:
    """Print the JSON Schema of experiment files (for editor completion)."""
    from dlinfra.spec import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command()
def render(
    spec: SpecArg = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory for <node>.user-data.yaml and <node>.json")
    ] = Path("rendered"),
    workers: WorkersOpt = None,
    ps: PsOpt = None,
    strategy: StrategyOpt = None,
    steps: StepsOpt = None,
    target: TargetOpt = None,
    endpoint_url: EndpointOpt = None,
    sets: SetOpt = None,
) -> None:
    """Render every node's cloud-init user-data and node.json, without running anything."""
    from dlinfra.render import build_node_configs, plan_addresses, render_cluster
    from dlinfra.targets.aws import install_requirement

    resolved = _spec(spec, workers, ps, strategy, steps, target, endpoint_url, sets)
    plan = plan_addresses(resolved)
    store_url = f"{resolved.storage.url or 'file:///var/lib/dlinfra/store'}/RUN_ID"
    configs = build_node_configs(resolved, "RUN_ID", store_url, plan)
    install = install_requirement() if resolved.target == "aws" else None
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in render_cluster(configs, install).items():
        (out_dir / f"{name}.user-data.yaml").write_text(text, encoding="utf-8")
        (out_dir / f"{name}.json").write_text(
            configs[name].model_dump_json(indent=2) + "\n", encoding="utf-8"
        )
    out.print(f"rendered {len(configs)} nodes into {out_dir}/")


# ---------------------------------------------------------------- running


@app.command()
def deploy(
    spec: SpecArg = None,
    workers: WorkersOpt = None,
    ps: PsOpt = None,
    strategy: StrategyOpt = None,
    steps: StepsOpt = None,
    target: TargetOpt = None,
    endpoint_url: EndpointOpt = None,
    sets: SetOpt = None,
    yes: YesOpt = False,
    keep: KeepOpt = False,
    emulate_instances: EmulateOpt = False,
) -> None:
    """Provision a cluster for the experiment, train, collect results, tear down."""
    started = time.time()
    resolved = _spec(spec, workers, ps, strategy, steps, target, endpoint_url, sets)
    _run_and_report(resolved, spec, started, yes, keep, emulate_instances)


def _run_and_report(
    resolved: Spec,
    spec: Path | None,
    started: float,
    yes: bool,
    keep: bool,
    emulate: bool,
    origin: Any = None,
) -> None:
    import signal

    signal.signal(signal.SIGTERM, _interrupt)  # `kill` and CI timeouts tear the cluster down too
    progress = _LiveTable() if out.is_terminal else _ProgressLines()
    try:
        outcome = _deploy(resolved, spec, started, yes, keep, emulate, progress, origin)
    except KeyboardInterrupt:
        progress.close()
        err.print("interrupted: the run is marked STOPPED and its nodes were torn down")
        raise typer.Exit(130) from None
    progress.close()
    _finish(outcome)


@app.command()
def rerun(
    run_id: Annotated[str, typer.Argument(help="The run to repeat.")],
    target: TargetOpt = None,
    workers: WorkersOpt = None,
    endpoint_url: EndpointOpt = None,
    allow_unpinned: Annotated[
        bool,
        typer.Option("--allow-unpinned", help="Rerun even what the manifest could not pin (dirty tree…)."),
    ] = False,
    yes: YesOpt = False,
    keep: KeepOpt = False,
    emulate_instances: EmulateOpt = False,
) -> None:
    """Deploy a recorded run again: its locked spec and its code bundle from the store."""
    from dlinfra.rerun import load_origin

    started = time.time()
    overrides = Overrides(workers=workers, target=target, endpoint_url=endpoint_url)
    origin = load_origin(run_id, overrides, allow_unpinned)
    for problem in origin.pins["unpinned"]:
        err.print(f"warning (--allow-unpinned): {problem}")
    out.print(f"rerun of {run_id}" + (f", code bundle {origin.code.sha256[:12]}" if origin.code else ""))
    _run_and_report(origin.spec, None, started, yes, keep, emulate_instances, origin)


def _deploy(
    resolved: Spec,
    spec: Path | None,
    started: float,
    yes: bool,
    keep: bool,
    emulate: bool,
    progress: Any,
    origin: Any = None,
) -> Any:
    """`origin`: a rerun's pinned code bundle and manifest fields (dlinfra.rerun.Origin)."""
    code, pins, wheel = (origin.code, origin.pins, origin.wheel) if origin else (None, None, None)
    if resolved.target == "aws":
        from dlinfra.targets import aws

        return aws.deploy(
            resolved,
            spec,
            sys.argv,
            approve=_approver(yes),
            keep=keep,
            emulate=emulate,
            on_update=progress,
            started=started,
            log=out.print,
            code=code,
            pins=pins,
            wheel=wheel,
        )
    else:
        from dlinfra.deploy import prepare, watch
        from dlinfra.targets.local import LocalCluster

        prepared = prepare(resolved, spec, sys.argv, code=code, pins=pins)
        out.print(
            f"run {prepared.run.id}: {len(prepared.user_data)} local nodes, "
            f"store {prepared.run.manifest()['store_url']}"
        )
        mirrored = resolved.strategy == "multi_worker_mirrored"
        cluster = LocalCluster(prepared.run.dir, restart_together=mirrored)
        try:
            cluster.start(prepared.user_data)
        except BaseException:
            cluster.stop()
            raise
        prepared.run.update_manifest(pids=cluster.pids())
        return watch(prepared, cluster, progress, resolved.cluster.heartbeat_timeout, started=started)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _approver(yes: bool) -> Any:
    def approve(summary: str) -> bool:
        out.print(summary)
        if yes:
            return True
        if not sys.stdin.isatty():
            raise DlinfraError(
                "no terminal to confirm the apply. Fix: review `dlinfra plan`, then pass --yes"
            )
        return typer.confirm("Apply this plan?", default=False)

    return approve


class _ProgressLines:
    """Logs and CI: a line when progress changes (or every 15 s), never a redraw."""

    def __init__(self) -> None:
        self.last, self.t = "", 0.0

    def __call__(self, snap: Any) -> None:
        from dlinfra.cli.views import progress_line

        line = progress_line(snap)
        core = line.split("]", 1)[1]
        if core != self.last or time.time() - self.t > 15:
            out.print(line, markup=False)
            self.last, self.t = core, time.time()

    def close(self) -> None:
        pass


class _LiveTable:
    """A terminal: one live table of nodes (state, step/total, loss, examples/s, heartbeat)."""

    def __init__(self) -> None:
        self.live: Any = None

    def __call__(self, snap: Any) -> None:
        from rich.live import Live

        from dlinfra.cli.views import nodes_table, progress_line

        if self.live is None:
            self.live = Live(console=out, refresh_per_second=4)
            self.live.start()
        self.live.update(nodes_table(snap.nodes, title=progress_line(snap)))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _finish(outcome: Any) -> None:
    from dlinfra.cli.views import print_failure, result_table

    if outcome.state == "DONE":
        out.print(result_table(outcome))
        return
    if outcome.state == "FAILED":
        print_failure(err, outcome)
        raise typer.Exit(1)
    err.print(f"run {outcome.run.id} STOPPED: {outcome.error}")
    raise typer.Exit(1)


@app.command()
def plan(
    spec: SpecArg = None,
    workers: WorkersOpt = None,
    ps: PsOpt = None,
    strategy: StrategyOpt = None,
    steps: StepsOpt = None,
    endpoint_url: EndpointOpt = None,
    sets: SetOpt = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the PR-comment summary here.")
    ] = None,
) -> None:
    """terraform plan of an experiment on AWS: resources, instances by role, estimated $/hour."""
    from dlinfra.targets import aws

    resolved = _spec(spec, workers, ps, strategy, steps, "aws", endpoint_url, sets)
    planned = aws.plan(resolved, spec, sys.argv, log=lambda line: err.print(line, markup=False))
    run = planned.prepared.run
    out.print(planned.summary.text(run.id), markup=False)
    if markdown:
        markdown.write_text(planned.markdown_path.read_text(encoding="utf-8"), encoding="utf-8")
    out.print(f"plan file {planned.plan_file}; markdown {markdown or planned.markdown_path}", markup=False)


@app.command()
def setup(
    bucket: Annotated[str, typer.Option("--bucket", help="Name of the results bucket to create.")],
    region: Annotated[str, typer.Option("--region", help="AWS region.")] = "us-east-1",
    endpoint_url: EndpointOpt = None,
) -> None:
    """Create the long-lived results bucket (once; its own Terraform state, never a run's)."""
    from dlinfra.targets import aws

    out.print(aws.setup_bucket(bucket, region, endpoint_url, log=lambda line: err.print(line, markup=False)))


# ---------------------------------------------------------------- inspecting runs


@app.command()
def status(run_id: RunArg = None, as_json: JsonOpt = False) -> None:
    """Per-node state, step, heartbeat age and restarts of a run."""
    from dlinfra.cli.views import nodes_table
    from dlinfra.reports import run_status

    report = run_status(run_id)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    out.print(nodes_table(report["nodes"], title=f"run {report['run_id']}: {report['status']}"))


@app.command()
def logs(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    node: Annotated[
        str | None, typer.Option("--node", help="Node name, e.g. worker-0 (default: all).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")
    ] = False,
) -> None:
    """Print node logs of a run."""
    from dlinfra.reports import follow_logs

    for line in follow_logs(run_id, node, follow):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


@app.command()
def runs(as_json: JsonOpt = False) -> None:
    """List runs, newest first: status, age, target, accuracy."""
    from rich.table import Table

    from dlinfra.reports import list_run_rows

    rows = list_run_rows()
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table()
    for column in ("run", "status", "age", "target", "strategy", "accuracy"):
        table.add_column(column)
    for r in rows:
        acc = "-" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.4f}"
        table.add_row(r["run_id"], r["status"], r["age"], r["target"], r["strategy"], acc)
    out.print(table)


@app.command()
def compare(
    run_ids: Annotated[list[str], typer.Argument(help="Runs to compare (ids from `dlinfra runs`).")],
    as_json: JsonOpt = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="A markdown table (for PRs, reports).")
    ] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also draw examples/s over time per run into this PNG.")
    ] = None,
) -> None:
    """Runs side by side: roles, strategy, steps/s, examples/s, time, accuracy and cost."""
    from dlinfra import compare as comparison

    rows = comparison.compare(run_ids)
    if plot is not None:
        comparison.plot(rows, plot)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif markdown:
        sys.stdout.write(comparison.markdown(rows))
    else:
        from dlinfra.cli.views import compare_table

        out.print(compare_table(rows))
    if plot is not None and not as_json:
        out.print(f"plot: {plot}")


@app.command()
def show(run_id: RunArg = None, as_json: JsonOpt = False) -> None:
    """A run's manifest, metrics and where its model and TensorBoard logs are."""
    from dlinfra.reports import run_details

    details = run_details(run_id)
    if as_json:
        sys.stdout.write(json.dumps(details, indent=2) + "\n")
        return
    for key, value in details.items():
        if isinstance(value, dict):
            value = json.dumps(value)
        out.print(f"[bold]{key}[/]: {value}")


@app.command()
def destroy(run_id: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """Tear down whatever a run left running (aws: terraform destroy of its stack)."""
    from dlinfra.reports import destroy_run

    out.print(destroy_run(run_id))


# ---------------------------------------------------------------- node agent


@node_app.command("run")
def node_run(
    node_json: Annotated[Path, typer.Argument(help="The NodeConfig, e.g. /etc/dlinfra/node.json.")],
    log_file: Annotated[
        Path | None, typer.Option("--log-file", help="Append this node's output here.")
    ] = None,
    work_dir: Annotated[
        Path | None, typer.Option("--work-dir", help="Local scratch (checkpoints, model).")
    ] = None,
) -> None:
    """Run this machine's part of the cluster (what cloud-init starts on every node)."""
    import os

    from dlinfra.node.agent import run

    code = run(node_json, log_file, work_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # TF server threads never join; leave without waiting for them


@app.command()
def version() -> None:
    """Print the dlinfra version."""
    out.print(__version__)


def _error(message: str) -> None:
    # Plain writes: one problem per line, never re-wrapped, greppable in CI logs.
    sys.stderr.write(f"error: {message}\n")


def main() -> None:
    try:
        app()  # usage errors (unknown option, bad type) exit 2 inside Typer
    except SpecError as exc:
        for problem in exc.problems:
            _error(problem)
        sys.exit(2)
    except DlinfraError as exc:
        _error(str(exc))
        sys.exit(exc.exit_code)
    except Exception as exc:
        if _state["debug"]:
            traceback.print_exc()
        else:
            _error(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
        sys.exit(1)

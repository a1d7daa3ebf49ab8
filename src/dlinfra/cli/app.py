"""`dlinfra`: parse arguments → call one domain function → print. Errors: one boundary in `main`."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dlinfra import __version__
from dlinfra.cli.advise import advise, profile, summary_lines
from dlinfra.cli.clock import command_started
from dlinfra.cli.console import ColorMode, err, out, set_color
from dlinfra.cli.console import error as _error
from dlinfra.cli.controller import controller_app, setup
from dlinfra.cli.data import data_app
from dlinfra.cli.images import image_app
from dlinfra.cli.inspection import inspection_app
from dlinfra.cli.loading import environment_line, load_checked, warn_hardware
from dlinfra.cli.node import node_app
from dlinfra.cli.options import (
    ALL_OVERRIDES,
    EmulateOpt,
    JsonOpt,
    KeepOpt,
    RefreshLockOpt,
    RunArg,
    SpecArg,
    YesOpt,
    with_emulation_default,
    with_overrides,
)
from dlinfra.cli.preflight import preflight
from dlinfra.cli.review import plan
from dlinfra.cli.running import approver, report
from dlinfra.errors import DlinfraError, SpecError

if TYPE_CHECKING:  # the spec models take pydantic most of `--help`'s time: loaded when a command runs
    from dlinfra.spec.loading import Overrides

app = typer.Typer(
    help="Experiment files in, transient distributed TensorFlow clusters out (local processes or AWS).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(inspection_app)  # status, logs, runs, compare, show, debug, destroy
app.add_typer(node_app, name="node")
app.add_typer(image_app, name="image")
app.add_typer(data_app, name="data")
app.add_typer(controller_app, name="controller")


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of unexpected errors.")] = False,
    color: Annotated[
        ColorMode,
        typer.Option(
            "--color",
            help="Colour and box-drawing: on a terminal only (auto; NO_COLOR: no colour), always, never.",
        ),
    ] = "auto",
) -> None:
    _state["debug"] = debug
    set_color(color)


_state: dict[str, Any] = {"debug": False}


# ---------------------------------------------------------------- spec commands


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example.")] = Path("experiment.yaml"),
    github: Annotated[
        bool,
        typer.Option(
            "--github",
            help="Instead, write GitHub workflows into ./.github/workflows: a plan review of the "
            "experiments each pull request changes, posted as one comment (no AWS credentials needed).",
        ),
    ] = False,
    experiments: Annotated[
        str, typer.Option("--experiments", help="--github: the directory holding the experiment files.")
    ] = "experiments",
    install: Annotated[
        str | None,
        typer.Option(
            "--install",
            help="--github: what pip installs (default: this dlinfra, at its commit or wheel sha256).",
        ),
    ] = None,
    aws: Annotated[
        bool, typer.Option("--aws", help="--github: also a plan on AWS with a read-only role (OIDC).")
    ] = False,
    apply: Annotated[
        bool, typer.Option("--apply", help="--github: also deploy auto_apply experiments on merge.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="--github: replace existing dlinfra workflows.")
    ] = False,
) -> None:
    """Write a commented example experiment file (or, with --github, the pull-request workflows)."""
    from dlinfra.spec.loading import example_text

    if github:
        from dlinfra.cli.outputs import new_dir
        from dlinfra.github import WorkflowSettings, default_install, to_write

        settings = WorkflowSettings(install or default_install(), experiments.rstrip("/"), aws, apply)
        folder, files = to_write(Path.cwd(), settings, force)
        with new_dir(folder, "--github") as staged:  # all the workflows land, or none
            for name, text in files.items():
                (staged / name).write_text(text, encoding="utf-8")
        for name in files:
            out.print(f"wrote {folder / name}", markup=False)
        out.print(
            "next: commit them; the manual's pull-request reviews (docs/pr-reviews.md) have the rest",
            markup=False,
        )
        return
    from dlinfra.cli.outputs import check_file, write_file

    if path.exists():
        raise DlinfraError(f"{path} already exists. Fix: choose another path or remove it")
    check_file(path, "init", "experiment.yaml")
    write_file(path, "init", example_text())
    out.print(f"wrote {path}; next: dlinfra validate {path} && dlinfra deploy {path}", markup=False)


@app.command()
@with_overrides(*ALL_OVERRIDES)
def validate(spec: SpecArg = None, *, overrides: Overrides) -> None:
    """Check an experiment file (and overrides) without running anything."""
    from dlinfra.deploy import preview
    from dlinfra.spec.hardware import cluster_hardware
    from dlinfra.targets import target_for

    resolved = load_checked(spec, overrides)
    target = target_for(resolved.target)
    for warning in target.capacity(resolved):  # what a deploy would refuse or warn about, word for word
        err.print(f"warning: {warning}", markup=False, highlight=False)
    # a results bucket's profiles: `advise` and `plan`; read before "valid", which a bad one would undo
    sizing = summary_lines(resolved, remote=False)
    plan = target.addresses(resolved)
    preview(resolved, target, spec)  # what only rendering shows: user-data over the target's limit
    out.print(
        f"{spec or '<built-in default>'}: valid · {resolved.target} · {resolved.strategy} · "
        f"{len(plan.nodes)} nodes ({', '.join(f'{k} {len(v)}' for k, v in plan.cluster().items())})",
        markup=False,
    )
    for role, hw in cluster_hardware(resolved, target.uses_instance_types).items():
        out.print(f"  {role:<7} {hw.count:>3} x {hw.describe(target.uses_instance_types)}", markup=False)
    for line in sizing:
        out.print(line, markup=False, highlight=False)
    out.print(environment_line(resolved), markup=False, highlight=False)


@app.command()
def schema() -> None:
    """Print the JSON Schema of experiment files (for editor completion)."""
    from dlinfra.spec.loading import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command()
@with_overrides(*ALL_OVERRIDES)
def render(
    spec: SpecArg = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory for <node>.user-data.yaml and <node>.json")
    ] = Path("rendered"),
    *,
    overrides: Overrides,
) -> None:
    """Render every node's cloud-init user-data and node.json, without running anything."""
    from dlinfra.cli.outputs import new_dir
    from dlinfra.deploy import preview
    from dlinfra.targets import target_for

    resolved = load_checked(spec, overrides)
    configs, user_data = preview(resolved, target_for(resolved.target), spec)
    with new_dir(out_dir, "--out") as staged:
        for name, text in user_data.items():
            (staged / f"{name}.user-data.yaml").write_text(text, encoding="utf-8")
            node_json = configs[name].model_dump_json(indent=2) + "\n"
            (staged / f"{name}.json").write_text(node_json, encoding="utf-8")
    out.print(f"rendered {len(configs)} nodes into {out_dir}/", markup=False)


# ---------------------------------------------------------------- running


@app.command()
@with_overrides(*ALL_OVERRIDES)
def deploy(
    spec: SpecArg = None,
    yes: YesOpt = False,
    keep: KeepOpt = False,
    emulate_instances: EmulateOpt = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Return once the nodes are up; follow with `dlinfra watch RUN`.")
    ] = False,
    refresh_lock: RefreshLockOpt = False,
    *,
    overrides: Overrides,
) -> None:
    """Provision a cluster for the experiment, train, collect results, tear down."""
    from dlinfra.deploy import Request
    from dlinfra.deploy import deploy as run_deploy

    started = command_started()
    if detach and emulate_instances == "vm":
        raise SpecError(["--detach: VMs live only while this deploy watches them. Fix: drop --detach"])
    request = Request(
        load_checked(spec, overrides), spec, sys.argv, keep, detach=detach, refresh_lock=refresh_lock
    )
    report(
        lambda options, progress: run_deploy(request, options, approver(yes), progress, started),
        emulate_instances,
    )


@app.command()
@with_overrides("target", "workers", "endpoint_url")
def rerun(
    run_id: Annotated[
        str, typer.Argument(help="The run to repeat (its id, or a short id: prefix, 4-hex suffix, @last).")
    ],
    allow_unpinned: Annotated[
        bool,
        typer.Option("--allow-unpinned", help="Rerun even what the manifest could not pin (dirty tree…)."),
    ] = False,
    refresh_lock: Annotated[
        bool,
        typer.Option(
            "--refresh-lock",
            help="Resolve the environment anew (newest versions the requirements allow) instead of "
            "installing the original's lock; the new run records what changed.",
        ),
    ] = False,
    yes: YesOpt = False,
    keep: KeepOpt = False,
    emulate_instances: EmulateOpt = None,
    *,
    overrides: Overrides,
) -> None:
    """Deploy a recorded run again: its locked spec, its code bundle and its environment's lock."""
    from dlinfra.deploy import Request
    from dlinfra.deploy import deploy as run_deploy
    from dlinfra.runs.rerun import load_origin

    started = command_started()
    origin = load_origin(run_id, overrides, allow_unpinned, refresh_lock)
    warn_hardware(origin.spec)
    for problem in origin.pins["unpinned"]:
        err.print(f"warning (--allow-unpinned): {problem}", markup=False)
    out.print(f"rerun of {run_id}" + (f", code bundle {origin.code.sha256[:12]}" if origin.code else ""))
    request = Request(origin.spec, None, sys.argv, keep, origin=origin, refresh_lock=refresh_lock)
    report(
        lambda options, progress: run_deploy(request, options, approver(yes), progress, started),
        emulate_instances,
    )


@app.command()
def watch(run_id: RunArg = None, keep: KeepOpt = False) -> None:
    """Follow a run to its end (one deployed with --detach, or from another terminal): live progress,
    healing, the result table, and the teardown."""
    from dlinfra.deploy import attach

    report(lambda options, progress: attach(run_id, options, keep, progress), emulate=None)


app.command()(preflight)  # cli/preflight.py
app.command()(advise)  # cli/advise.py: the sizing advisor, and `profile` its step time
app.command()(profile)
app.command()(plan)  # cli/review.py: also --base (a pull request's review) and --emulated
app.command()(setup)  # cli/controller.py: the results bucket, and with --controller the controller


@app.command()
def instances(
    gpu: Annotated[bool, typer.Option("--gpu", help="Only types with GPUs.")] = False,
    region: Annotated[str, typer.Option("--region", help="Region of the price column.")] = "us-east-1",
    as_json: JsonOpt = False,
) -> None:
    """The instance catalog: hardware and dated on-demand prices of every EC2 type dlinfra knows."""
    from dlinfra.spec.catalog import catalog

    table = catalog()
    kinds = [k for k in table.types if k.gpus or not gpu]
    if as_json:
        sys.stdout.write(table.model_copy(update={"types": kinds}).model_dump_json(indent=2) + "\n")
        return
    if region not in table.regions:
        raise DlinfraError(
            f"--region {region}: the catalog has no prices there. Fix: use one of {', '.join(table.regions)}"
        )
    from dlinfra.cli.tables import instances_table

    out.print(instances_table(kinds, region, table.price_note()))


@app.command()
def version() -> None:
    """Print the dlinfra version."""
    out.print(__version__)


def main() -> None:
    sys.argv[1:] = with_emulation_default(sys.argv[1:])
    try:
        app()  # usage errors (unknown option, bad type) exit 2 inside Typer
    except SpecError as exc:
        for problem in exc.problems:
            _error(problem)
        sys.exit(2)
    except DlinfraError as exc:
        _error(str(exc))
        for note in getattr(exc, "__notes__", []):  # e.g. a teardown that failed after this error
            _error(note)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if _state["debug"]:
            traceback.print_exc()
        else:
            _error(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
        sys.exit(1)

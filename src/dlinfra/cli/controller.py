"""`dlinfra controller run|status|logs`: the account's controller, which owns runs handed to it
(`deploy --detach` where one runs) until they end, with no laptop watching."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from dlinfra.cli.console import err, out
from dlinfra.cli.options import EmulateOpt, EndpointOpt

if TYPE_CHECKING:  # loaded when a command runs: `--help` stays fast
    from dlinfra.runs.layout.controller import ControllerStore

controller_app = typer.Typer(
    help="The account's controller: owns handed-over runs to their end, with no laptop watching.",
    no_args_is_help=True,
)

BucketOpt = Annotated[str, typer.Option("--bucket", help="The results bucket (storage.url's) it serves.")]
RegionOpt = Annotated[str, typer.Option("--region", help="AWS region of the bucket.")]
IdleOpt = Annotated[
    float,
    typer.Option("--idle-minutes", min=0, help="Stop (its instance too) after this long with no run."),
]


def setup(
    bucket: Annotated[str, typer.Option("--bucket", help="Name of the results bucket to create.")],
    region: Annotated[str, typer.Option("--region", help="AWS region.")] = "us-east-1",
    endpoint_url: EndpointOpt = None,
    controller: Annotated[
        bool,
        typer.Option(
            "--controller",
            help="Also the account's controller: a small instance that owns detached runs to their end.",
        ),
    ] = False,
    ami: Annotated[
        str | None,
        typer.Option(
            "--ami",
            help="With --controller: the image it boots (dlinfra, terraform, provider); default: the one "
            "`dlinfra image build --target aws --flavor controller` baked for this dlinfra in the region.",
        ),
    ] = None,
    idle_minutes: IdleOpt = 10.0,
    emulate_instances: EmulateOpt = None,
) -> None:
    """Create the long-lived results bucket (once; its own Terraform state, never a run's), and with
    --controller the account's controller beside it (its own stack and state)."""
    from dlinfra.targets.aws import controller as account_controller
    from dlinfra.targets.aws.stack import setup_bucket

    _finite(idle_minutes)
    if controller and not ami:
        ami = account_controller.baked_ami(region, endpoint_url)
    log = lambda line: err.print(line, markup=False)  # noqa: E731
    out.print(setup_bucket(bucket, region, endpoint_url, log=log), markup=False)
    if controller and ami:
        made = account_controller.setup(
            bucket, region, endpoint_url, ami, idle_minutes, log, emulate=_emulation(emulate_instances)
        )
        out.print(made, markup=False)


def _emulation(value: str | None) -> Literal["process", "vm"] | None:
    return "vm" if value == "vm" else "process" if value else None


def _store(bucket: str, region: str, endpoint_url: str | None) -> ControllerStore:
    from dlinfra.errors import SpecError
    from dlinfra.runs.layout.controller import ControllerStore
    from dlinfra.spec.grammar import bucket_problems, endpoint_problems

    if problems := bucket_problems(bucket, region) + endpoint_problems(endpoint_url):
        raise SpecError(problems)
    return ControllerStore.of_bucket(bucket, endpoint_url, region)


def _finite(idle_minutes: float) -> None:
    """`inf` or `nan` minutes would keep the controller's instance up (and billed) for ever."""
    from dlinfra.errors import SpecError

    if not math.isfinite(idle_minutes):
        raise SpecError(
            [f"--idle-minutes {idle_minutes}: not a number of minutes. Fix: e.g. --idle-minutes 10"]
        )


@controller_app.command()
def run(
    bucket: BucketOpt,
    region: RegionOpt = "us-east-1",
    endpoint_url: EndpointOpt = None,
    idle_minutes: Annotated[
        float,
        typer.Option(
            "--idle-minutes", min=0, help="Stop (and stop its instance) after this long with no run."
        ),
    ] = 10.0,
    instance_id: Annotated[
        str | None,
        typer.Option("--instance-id", help="Its own EC2 instance, stopped when idle (none: run by hand)."),
    ] = None,
) -> None:
    """Own every run handed over in the bucket until it ends; stop after `--idle-minutes` without."""
    from dlinfra.controller import Controller

    def stop_instance(instance: str) -> None:
        import boto3

        boto3.client("ec2", region_name=region, endpoint_url=endpoint_url).stop_instances(
            InstanceIds=[instance]
        )

    _finite(idle_minutes)
    controller = Controller(_store(bucket, region, endpoint_url), idle_minutes, instance_id, stop_instance)
    controller.run()


@controller_app.command()
def status(bucket: BucketOpt, region: RegionOpt = "us-east-1", endpoint_url: EndpointOpt = None) -> None:
    """Who the controller is, whether it runs, and the runs it owns or has yet to pick up."""
    from dlinfra.runs.handover import POLL_SECONDS, judge

    store = _store(bucket, region, endpoint_url)
    info = store.info()
    if info is None:
        out.print(f"no controller has run for s3://{bucket}: `dlinfra controller run --bucket {bucket}`")
        return
    ago = time.time() - info.beat
    state = "running" if info.running(time.time(), POLL_SECONDS) else f"{info.state} (silent)"
    if info.state == "stopped":
        state = "stopped"
    out.print(
        f"{info.holder}: {state}, last looked {ago:.0f}s ago; stops after {info.idle_minutes:g} idle min"
    )
    judged = judge(store, store.listed(), lambda: _key(store))
    pending = [h.run_id for h in judged.sealed if h.run_id not in info.runs]
    out.print(f"owns: {', '.join(info.runs) or 'nothing'}", markup=False)
    if pending:
        out.print(f"handed over, not picked up yet: {', '.join(pending)}", markup=False)
    if judged.refused:
        out.print(
            f"{len(judged.refused)} hand-over record(s) in {store.uri()} are unreadable or not sealed "
            "by this account's dlinfra: the controller moves them to quarantine/ and acts on none",
            markup=False,
        )
    if judged.unverified:
        out.print(
            f"{judged.unverified} hand-over(s) cannot be verified from here: no hand-over key is readable",
            markup=False,
        )


def _key(store: ControllerStore) -> bytes | None:
    from dlinfra.errors import StoreError
    from dlinfra.runs.sealing import read_key

    try:
        return read_key(store.bucket, store.region, store.endpoint_url, create=False)
    except StoreError:
        return None  # status still says what it can; the count of unverified ones says the rest


@controller_app.command()
def logs(bucket: BucketOpt, region: RegionOpt = "us-east-1", endpoint_url: EndpointOpt = None) -> None:
    """The controllers' own logs, as last synced to the bucket (every 30 s, and when one stops)."""
    store = _store(bucket, region, endpoint_url)
    names = store.logs()
    if not names:
        out.print(f"no controller log in {store.uri()}", markup=False)
    for name in names:
        out.print(f"==> {store.log_uri(name)}", markup=False)
        out.print(store.log(name) or "", markup=False, end="")


@controller_app.command()
def stop(bucket: BucketOpt, region: RegionOpt = "us-east-1", endpoint_url: EndpointOpt = None) -> None:
    """Stop the controller's instance now (a hand-over starts it again; idle, it stops by itself)."""
    from dlinfra.targets.aws import controller as account_controller

    out.print(
        account_controller.stop(_store(bucket, region, endpoint_url), region, endpoint_url), markup=False
    )


@controller_app.command()
def destroy(bucket: BucketOpt, region: RegionOpt = "us-east-1", endpoint_url: EndpointOpt = None) -> None:
    """Remove the controller's stack (refused while a run is handed to it); the bucket stays."""
    from dlinfra.targets.aws import controller as account_controller

    log = lambda line: err.print(line, markup=False)  # noqa: E731
    out.print(account_controller.destroy(bucket, _store(bucket, region, endpoint_url), log), markup=False)

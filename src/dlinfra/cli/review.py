"""`dlinfra plan`: what an experiment would create on AWS, for a person or a pull request's review
(`--base REF`: against the file at a git ref; `--emulated`: against a throwaway emulator, with no
AWS credentials at all)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dlinfra.cli.advise import print_summary
from dlinfra.cli.console import err, out
from dlinfra.cli.options import ALL_OVERRIDES, RefreshLockOpt, SpecArg, with_overrides
from dlinfra.errors import SpecError

if TYPE_CHECKING:
    from dlinfra.spec.loading import Overrides
    from dlinfra.spec.model import Spec
    from dlinfra.targets.aws.review_diff import Base

EMULATED = "--emulated"


@with_overrides(*(name for name in ALL_OVERRIDES if name != "target"))
def plan(
    spec: SpecArg = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the PR-comment summary here.")
    ] = None,
    no_upload: Annotated[
        bool,
        typer.Option(
            "--no-upload",
            help="Write nothing to the results bucket and take no state lock (a pull-request check "
            "with a read-only role); the plan stays in the run dir.",
        ),
    ] = False,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            metavar="REF",
            help="Review the change against the file at this git ref (branch, tag, commit): instances, "
            "GPUs and $/h base → head, the spec fields that changed, warnings.",
        ),
    ] = None,
    emulated: Annotated[
        bool,
        typer.Option(
            EMULATED,
            help="Plan against a throwaway emulator (moto) on loopback: no AWS credentials needed or "
            "used, nothing written to AWS (implies --no-upload; needs dlinfra[emulator]).",
        ),
    ] = False,
    refresh_lock: RefreshLockOpt = False,
    *,
    overrides: Overrides,
) -> None:
    """terraform plan of an experiment on AWS: resources, instances by role, estimated $/hour."""
    from dlinfra.cli.loading import environment_line, load_checked
    from dlinfra.cli.outputs import check_file, write_file
    from dlinfra.deploy import Request
    from dlinfra.deploy import plan as make_plan
    from dlinfra.targets import target_for
    from dlinfra.targets.base import TargetOptions

    overrides = overrides.model_copy(update={"target": "aws"})
    if markdown:  # before a plan that takes minutes, and before the emulator starts
        check_file(markdown, "--markdown", "plan.md")
    if emulated:
        raise typer.Exit(_plan_in_emulator(spec, base, overrides))
    resolved = load_checked(spec, overrides)
    before = _base(spec, base, overrides) if base else None  # a bad ref exits 2 before anything runs
    target = target_for("aws", TargetOptions(log=lambda line: err.print(line, markup=False)))
    request = Request(resolved, spec, sys.argv, upload=not no_upload, refresh_lock=refresh_lock)
    prepared, review = make_plan(request, target)
    text, summary, written = review.text, review.markdown, prepared.run.dir / "plan.md"
    if before is not None:
        from dlinfra.targets.aws.review_diff import ReviewDiff
        from dlinfra.targets.aws.stack import run_stack

        # terraform's own plan text, for the review's <details>: only here, as a deploy never shows
        # it and `terraform show` starts the provider once more
        assert review.plan_file is not None
        details = run_stack(prepared.run, lambda line: None).show_text(review.plan_file)
        diff = ReviewDiff(str(spec), before, resolved, dataclasses.replace(review, details=details))
        text, summary, written = diff.text(), diff.markdown(), prepared.run.dir / "review.md"
        written.write_text(summary, encoding="utf-8")
    out.print(text, markup=False)
    out.print(environment_line(resolved), markup=False, highlight=False)
    print_summary(resolved)
    if markdown:
        write_file(markdown, "--markdown", summary)
    out.print(f"plan file {review.plan_file}; markdown {markdown or written}", markup=False)


def _base(spec: Path | None, ref: str, overrides: Overrides) -> Base:
    """The experiment at `ref`, resolved like head (same loader, same overrides)."""
    from dlinfra.spec.loading import load_spec
    from dlinfra.targets import hardware_problems
    from dlinfra.targets.aws.review_diff import load_base

    def load(text: str, source: str) -> Spec:
        return load_spec(None, overrides, check=hardware_problems, text=text, source=source)

    return load_base(spec, ref, load)


def _plan_in_emulator(spec: Path | None, base: str | None, overrides: Overrides) -> int:
    """Start the emulator here, and plan in a child process that sees only the emulator's fake keys
    (this process keeps the caller's environment untouched). Returns the child's exit code."""
    from dlinfra.spec.loading import load_spec
    from dlinfra.targets import hardware_problems
    from dlinfra.targets.aws.emulator import throwaway

    if overrides.endpoint_url:
        raise SpecError([f"{EMULATED} starts its own emulator. Fix: drop --endpoint-url (or {EMULATED})"])
    resolved = load_spec(spec, overrides, check=hardware_problems)  # bad input: exit 2, nothing started
    if base:
        _base(spec, base, overrides)
    argv = [arg for arg in sys.argv[1:] if arg != EMULATED]
    with throwaway(resolved) as emulator:
        sets = [f"--set={item}" for item in emulator.overrides()]
        child = [sys.executable, "-m", "dlinfra", *argv, *sets, "--no-upload"]
        return subprocess.run(child, env=emulator.child_env(os.environ), stdin=subprocess.DEVNULL).returncode

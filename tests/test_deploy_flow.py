"""The deploy flow's cleanup promises, with a stand-in target whose start and teardown fail on
purpose (a real destroy that fails on cue cannot be arranged here; the flow is what is tested)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlinfra import watching
from dlinfra.deploy import _Follow
from dlinfra.errors import DlinfraError, RunFailed, TerraformError
from dlinfra.prepare import NodeInstall, prepare
from dlinfra.render import loopback_plan
from dlinfra.runs.ownership import Lease, claim
from dlinfra.spec.model import Spec
from dlinfra.targets.base import TargetOptions
from support import fixed_locks


class FailingTeardownTarget:
    """Stands in for a cloud target whose destroy fails (e.g. credentials expired mid-run)."""

    leaves_resources = True

    def __init__(self) -> None:
        self.teardowns = 0

    def teardown(self, run: object) -> str:
        self.teardowns += 1
        raise TerraformError("terraform destroy failed: ExpiredToken")

    def controller(self, spec: object) -> None:
        return None  # no account controller: a detached run waits for `dlinfra watch`


@pytest.fixture
def prepared(home: Path):
    spec = Spec()
    return prepare(spec, loopback_plan(spec), NodeInstall(), locks=fixed_locks(), typed=False)


def _failing_start() -> None:
    raise DlinfraError("apply failed: InsufficientInstanceCapacity")


def test_a_failed_teardown_rides_along_and_never_hides_the_original_error(prepared) -> None:
    target = FailingTeardownTarget()
    lines: list[str] = []
    with pytest.raises(DlinfraError, match="InsufficientInstanceCapacity") as caught:
        _owner(target, prepared, False, TargetOptions(log=lines.append))(_failing_start, lambda s: None, None)
    assert target.teardowns == 1
    [note] = caught.value.__notes__
    assert "teardown failed too" in note and "ExpiredToken" in note
    assert f"dlinfra destroy {prepared.run.id}" in note


class InterruptedTeardownTarget(FailingTeardownTarget):
    """Stands in for a teardown that a second Ctrl-C cuts short (a destroy against an endpoint that
    went away retries for minutes: the user leaves)."""

    def teardown(self, run: object) -> str:
        self.teardowns += 1
        raise KeyboardInterrupt


def _ctrl_c() -> None:
    raise KeyboardInterrupt


def test_a_second_ctrl_c_leaves_the_teardown_and_says_what_may_still_bill_and_the_fix(prepared) -> None:
    target = InterruptedTeardownTarget()
    with pytest.raises(KeyboardInterrupt) as caught:
        _owner(target, prepared, False)(_ctrl_c, lambda s: None, None)
    assert target.teardowns == 1
    [note] = caught.value.__notes__
    assert note.startswith("teardown interrupted: what it had not yet removed may still run and bill")
    assert f"Fix: `dlinfra destroy {prepared.run.id}` finishes it" in note
    owner, _ = prepared.store.owner()  # given up: `dlinfra destroy` may act at once
    assert owner is not None and owner.kind == "none"


def test_a_deploy_that_ends_before_its_nodes_are_up_ends_its_run_stopped_or_failed(prepared, home) -> None:
    """Ctrl-C while terraform applies, or an apply that fails: the run ends there (marker and
    manifest), torn down, not left CREATED or APPLIED in `dlinfra runs` for ever."""
    from dlinfra.runs.run import Run

    with pytest.raises(KeyboardInterrupt):
        _owner(FailingTeardownTarget(), prepared, False)(_ctrl_c, lambda s: None, None)
    marker = prepared.store.marker()
    assert marker is not None and marker.marker == "STOPPED", marker
    assert marker.reason == "interrupted (Ctrl-C) before the nodes were up"
    manifest = Run.open(prepared.run.id).manifest()
    assert manifest.status == "STOPPED" and manifest.finished

    failed = prepare(Spec(), loopback_plan(Spec()), NodeInstall(), locks=fixed_locks(), typed=False)
    with pytest.raises(DlinfraError):
        _owner(FailingTeardownTarget(), failed, False)(_failing_start, lambda s: None, None)
    marker = failed.store.marker()
    assert marker is not None and marker.marker == "FAILED", marker
    assert marker.error == "the cluster did not start: apply failed: InsufficientInstanceCapacity"
    assert Run.open(failed.run.id).manifest().status == "FAILED"


def test_a_watch_that_cannot_attach_leaves_the_run_as_it_was(prepared) -> None:
    """`dlinfra watch` (attached): its Ctrl-C, or its failure to reach the cluster, says nothing of
    the run, which goes on without it."""
    with pytest.raises(KeyboardInterrupt):
        _owner(FailingTeardownTarget(), prepared, True)(_ctrl_c, lambda s: None, None, attached=True)
    assert prepared.store.marker() is None
    assert prepared.run.manifest().status == "CREATED"


def test_an_interrupt_whose_teardown_did_not_finish_never_says_the_nodes_were_torn_down() -> None:
    code = (
        "import typer\n"
        "from dlinfra.cli.running import report\n"
        "def follow(options, progress):\n"
        "    exc = KeyboardInterrupt()\n"
        "    exc.add_note('teardown interrupted: what it had not yet removed may still run and bill.')\n"
        "    raise exc\n"
        "try:\n"
        "    report(follow, None)\n"
        "except typer.Exit as left:\n"  # as the typer app turns it into the exit code
        "    raise SystemExit(left.exit_code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == [
        "interrupted: the run is marked STOPPED",
        "error: teardown interrupted: what it had not yet removed may still run and bill.",
    ]


def test_keep_means_no_teardown_at_all(prepared) -> None:
    target = FailingTeardownTarget()
    with pytest.raises(DlinfraError) as caught:
        _owner(target, prepared, True)(_failing_start, lambda s: None, None)
    assert target.teardowns == 0 and not getattr(caught.value, "__notes__", [])


def test_a_detached_deploy_tears_nothing_down(prepared) -> None:
    target = FailingTeardownTarget()
    outcome = _owner(target, prepared, False)(lambda: None, lambda s: None, None, detach=True)
    assert outcome.state == "DETACHED" and target.teardowns == 0
    owner, _ = prepared.store.owner()  # released: whoever attaches next owns the run
    assert owner is not None and owner.kind == "none"


def _owner(target, prepared, keep: bool, options: TargetOptions | None = None) -> _Follow:
    lease = claim(prepared.store, "cli", "cli test")
    assert isinstance(lease, Lease)
    return _Follow(target, prepared, options or TargetOptions(), keep, lease)


def test_cli_prints_the_original_error_first_then_the_teardown_note() -> None:
    code = (
        "import sys\n"
        "from dlinfra.cli import app as cli\n"
        "from dlinfra.errors import RunFailed\n"
        "def boom():\n"
        "    exc = RunFailed('run r failed: could not replace worker-0')\n"
        "    exc.add_note('teardown failed too: ExpiredToken')\n"
        "    raise exc\n"
        "cli.app = boom\n"
        "cli.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == RunFailed.exit_code == 1
    assert done.stderr.splitlines() == [
        "error: run r failed: could not replace worker-0",
        "error: teardown failed too: ExpiredToken",
    ]


def test_a_follower_acts_on_nothing_and_may_take_the_run_once_its_owner_is_gone(
    prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    """follow_only under a live owner: progress only; once the owner's lease lapses (it died) it
    hands back, so `watch` can take the run over; once the run ended it returns its result."""
    monkeypatch.setattr(watching, "OWNER_CHECK_SECONDS", 0.0)
    other = claim(prepared.store, "cli", "cli elsewhere", lease_seconds=1.5)
    assert isinstance(other, Lease)
    seen: list[object] = []
    assert watching.follow_only(prepared, seen.append, time.time(), until_unowned=True) is None
    assert seen, "it showed progress while it followed"
    assert isinstance(claim(prepared.store, "cli", "cli here"), Lease)  # the follower's takeover
    prepared.store.write_marker("DONE")
    ended = watching.follow_only(prepared, lambda s: None, time.time())
    assert ended is not None and ended.state == "DONE"

"""One runner for every terraform call: streams progress, parses `-json` events, raises one error type.

Plain subprocess on purpose: python-terraform is unmaintained since 2019 and CDKTF was archived.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlinfra.errors import TerraformError

MIN_VERSION = (1, 5, 0)
INTERRUPT_GRACE = 60.0  # seconds an interrupted terraform gets to stop cleanly before it is killed
# No terraform command may hang a deploy for good (an endpoint that accepts and never answers, a
# provider stuck in a retry loop). apply and destroy wait on EC2 (NAT gateways take minutes).
TIMEOUTS = {"init": 600.0, "plan": 900.0, "show": 300.0, "output": 300.0, "apply": 3600.0, "destroy": 3600.0}
# Progress worth a line; the rest of terraform's event stream stays in the run's terraform.log.
_SHOWN = {"apply_complete", "apply_errored", "change_summary"}


def find_terraform() -> tuple[str, tuple[int, ...]]:
    binary = shutil.which("terraform")
    if binary is None:
        raise TerraformError(
            "terraform not found on PATH. Fix: install terraform >= 1.5 "
            "(https://developer.hashicorp.com/terraform/install) or use --target local"
        )
    out = subprocess.run([binary, "version", "-json"], capture_output=True, text=True, timeout=60)
    try:
        raw = json.loads(out.stdout)["terraform_version"]
    except (json.JSONDecodeError, KeyError):
        raise TerraformError(
            f"could not read `terraform version` from {binary}: {out.stderr.strip()}"
        ) from None
    version = tuple(int(p) for p in re.findall(r"\d+", raw)[:3])
    if version < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        raise TerraformError(f"terraform {raw} at {binary} is too old. Fix: install terraform >= {need}")
    return binary, version


@dataclass(frozen=True)
class PlannedChange:
    address: str
    action: str  # the machine-readable UI's: noop, create, read, update, replace, delete, move, ...


def events(output: str, kind: str) -> list[dict[str, Any]]:
    """The events of one `type` in a `-json` run's output (other lines, such as a crash's, skipped)."""
    found = []
    for line in output.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("type") == kind:
            found.append(event)
    return found


def planned_changes(output: str) -> list[PlannedChange]:
    """The `planned_change` events of a `plan -json` run."""
    return [
        PlannedChange(e["change"]["resource"]["addr"], e["change"]["action"])
        for e in events(output, "planned_change")
    ]


def applied_outputs(output: str) -> dict[str, Any]:
    """name → value from the last `outputs` event of an `apply -json` run; empty unless every output
    in it carries its value (a plan's event has none, a sensitive output's is withheld)."""
    found = (events(output, "outputs") or [{}])[-1].get("outputs") or {}
    if not found or any("value" not in item for item in found.values()):
        return {}
    return {name: item["value"] for name, item in found.items()}


@dataclass
class Terraform:
    """terraform in one working directory (a run's copy of the stack)."""

    workdir: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    log: Callable[[str], None] = lambda line: None
    binary: str = ""

    def __post_init__(self) -> None:
        if not self.binary:
            self.binary, _ = find_terraform()
        self.env.setdefault("TF_IN_AUTOMATION", "1")
        # The AWS provider spends a quarter of every start collecting the garbage of building its
        # schema (measured: `validate` 14.3 -> 10.7 CPU-s, an apply against moto 29.9 -> 22.4, for a
        # peak of 430 MB instead of 330). A user's own GOGC wins.
        self.env.setdefault("GOGC", "400")

    def init(self) -> None:
        self.run(["init", "-input=false", "-no-color"], json_events=False)

    def plan(
        self, var_file: Path, out: Path, targets: tuple[str, ...] = (), lock: bool = True
    ) -> list[PlannedChange]:
        """The changes come from the plan's own event stream: reading them back with `show -json`
        would start the provider once more (seconds a spot replacement does not have)."""
        args = ["plan", "-input=false", "-json", f"-var-file={var_file}", f"-out={out}"]
        if not lock:
            args.append("-lock=false")
        output = self.run([*args, *(f"-target={address}" for address in targets)])
        return planned_changes(output)

    def show_json(self, plan_file: Path) -> dict[str, Any]:
        return json.loads(self.run(["show", "-json", str(plan_file)], json_events=False, quiet=True))

    def show_text(self, plan_file: Path) -> str:
        """The plan as a person reads it (a pull request's review shows it collapsed)."""
        return self.run(["show", "-no-color", str(plan_file)], json_events=False, quiet=True)

    def apply(self, plan_file: Path, timeout: float | None = None) -> dict[str, Any]:
        """Apply, and return the root outputs its own event stream ends with: a `terraform output`
        afterwards would start the provider once more (3 CPU-seconds, seconds a heal does not
        have). A stream without them (a sensitive or unevaluated output) falls back to `output`."""
        return self.outputs_of(
            self.run(["apply", "-input=false", "-json", "-auto-approve", str(plan_file)], timeout=timeout)
        )

    def outputs_of(self, applied: str) -> dict[str, Any]:
        """The outputs an `apply -json` run's events end with, or else `terraform output`'s."""
        return applied_outputs(applied) or self.output()

    def output(self) -> dict[str, Any]:
        raw = json.loads(self.run(["output", "-json"], json_events=False, quiet=True))
        return {name: item["value"] for name, item in raw.items()}

    def destroy(self, var_file: Path) -> None:
        """Without a refresh: a delete needs only the ids the state holds, and the provider takes an
        object already gone (a reclaimed spot instance) as deleted. Reading back every resource first
        cost over a quarter of the destroy's plan (a one-worker run against moto: 17.6 -> 12.7 CPU-s),
        20-40x that in the controller's emulated VM."""
        args = ["destroy", "-input=false", "-json", "-auto-approve", "-refresh=false"]
        self.run([*args, f"-var-file={var_file}"])

    def run(
        self, args: list[str], json_events: bool = True, quiet: bool = False, timeout: float | None = None
    ) -> str:
        """Run one terraform command, streaming its lines to terraform.log (and `log`). Past
        `timeout` seconds terraform is interrupted (SIGINT: it stops cleanly and saves its state),
        and killed if it has not stopped a minute later. Each command has a default (TIMEOUTS)."""
        timeout = timeout if timeout is not None else TIMEOUTS.get(args[0], 900.0)
        errors: list[str] = []
        lines: list[str] = []
        timed_out = threading.Event()
        with open(self.workdir / "terraform.log", "a", encoding="utf-8") as logfile:
            logfile.write(f"$ terraform {' '.join(args)}\n")
            # A group of its own: a terminal's Ctrl-C reaches only the CLI, which hands terraform exactly
            # one (a second makes terraform exit at once, without saving its state).
            proc = subprocess.Popen(
                [self.binary, *args],
                cwd=self.workdir,
                env=self.env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,
            )
            assert proc.stdout is not None
            timers = [
                threading.Timer(timeout, _interrupt, (timed_out, proc)),
                threading.Timer(timeout + INTERRUPT_GRACE, proc.kill),
            ]
            for timer in timers:
                timer.daemon = True
                timer.start()
            try:
                for line in proc.stdout:
                    lines.append(line)
                    if not quiet:
                        logfile.write(line)
                    if json_events:
                        self._event(line, errors)
                code = proc.wait()
            except KeyboardInterrupt:
                self._stop(proc, args[0])
                raise
            finally:
                for timer in timers:
                    timer.cancel()
        if timed_out.is_set():
            raise TerraformError(
                f"terraform {args[0]} did not finish in {timeout:.0f}s (interrupted) in {self.workdir}. "
                "Fix: check that the AWS endpoint answers (terraform.log there shows the last step), "
                "then run the command again; `dlinfra destroy` removes what an interrupted apply made"
            )
        if code != 0:
            detail = "\n".join(errors) or "".join(lines[-20:]).strip()
            raise TerraformError(f"terraform {args[0]} failed in {self.workdir}:\n{detail}")
        return "".join(lines)

    def _stop(self, proc: subprocess.Popen[str], command: str) -> None:
        """The CLI was interrupted (Ctrl-C, SIGTERM): terraform stops as on its own Ctrl-C, finishing
        the calls in flight and saving its state, so that the teardown that follows finds the state
        whole and unlocked. Interrupted again meanwhile: killed at once."""
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        self.log(f"stopping terraform {command} (it saves its state); Ctrl-C again to kill it now")
        try:
            proc.wait(INTERRUPT_GRACE)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
            raise KeyboardInterrupt from None

    def _event(self, line: str, errors: list[str]) -> None:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return
        if event.get("type") == "diagnostic":
            diag = event.get("diagnostic", {})
            text = diag.get("summary", "")
            if diag.get("detail"):
                text += f": {diag['detail']}"
            if diag.get("address"):
                text = f"{diag['address']}: {text}"
            if diag.get("severity") == "error":
                errors.append(text)
            self.log(f"terraform {diag.get('severity', 'note')}: {text}")
        elif event.get("type") in _SHOWN:
            self.log(f"terraform: {event.get('@message', '')}")


def _interrupt(timed_out: threading.Event, proc: subprocess.Popen[str]) -> None:
    """Past the timeout: say so, then let terraform stop as on Ctrl-C (it releases its state lock)."""
    timed_out.set()
    proc.send_signal(signal.SIGINT)

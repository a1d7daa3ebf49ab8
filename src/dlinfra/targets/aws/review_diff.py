"""A pull request's review of one experiment file (`dlinfra plan FILE --base REF`): its version at
REF against the one in the working tree, both resolved by the same loader with the same overrides.

Resources come from head's terraform plan; instances, GPUs and $/h of both sides from the instance
catalog (review.py), so the two sides are priced alike; the spec fields that changed from the
resolved models, defaults included (a default that moved shows too). A file that REF lacks is new.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError, SpecError
from dlinfra.spec.catalog import catalog
from dlinfra.spec.hardware import cluster_hardware
from dlinfra.spec.hardware import warnings as hardware_warnings
from dlinfra.spec.input import shown
from dlinfra.spec.model import Spec
from dlinfra.spec.pricing import HourlyCost
from dlinfra.targets.aws import emulator
from dlinfra.targets.aws.review import hourly_cost, quota_warnings
from dlinfra.targets.base import Review

PLAN_SHOWN = 20_000  # characters of `terraform show`: a PR comment holds 65,536 in all
FIELD_SHOWN = 80  # characters of one changed value
FIELDS_SHOWN = 40


@dataclass(frozen=True)
class Base:
    """The experiment at the base ref: its commit, and its resolved spec (None: new at head)."""

    ref: str
    commit: str
    spec: Spec | None
    problem: str | None = None  # the base version exists but does not resolve with this dlinfra


# ---------------------------------------------------------------- the base version, from git


def _git(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError:
        raise DlinfraError("--base: git is not installed. Fix: install git, or drop --base") from None


def load_base(path: Path | None, ref: str, load: Callable[[str, str], Spec]) -> Base:
    """The experiment as it was at `ref`. `load(text, source)` resolves it like head's file."""
    if path is None:
        raise SpecError(
            ["--base: needs an experiment file. Fix: dlinfra plan experiments/x.yaml --base main"]
        )
    if ref.startswith("-") or not ref.strip():
        raise SpecError(
            [f"--base {shown(ref)}: not a git ref. Fix: name a branch, tag or commit, e.g. --base main"]
        )
    where = path.absolute().parent
    if not where.is_dir() or _git(where, "rev-parse", "--git-dir").returncode != 0:
        raise SpecError(
            [f"--base {ref}: {path} is not in a git repository. Fix: plan a file of a git checkout"]
        )
    found = _git(where, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    if found.returncode != 0:
        raise SpecError(
            [
                f"--base {ref}: no such branch, tag or commit in this repository. Fix: fetch it first "
                f"(git fetch origin {ref}), or name an existing one (git branch -a)"
            ]
        )
    commit = found.stdout.strip()
    at_base = _git(where, "show", f"{commit}:./{path.name}")
    if at_base.returncode != 0:  # the file is new in this change
        return Base(ref, commit, None)
    try:
        return Base(ref, commit, load(at_base.stdout, f"{ref}:{path}"))
    except SpecError as exc:  # e.g. written for an older dlinfra: review head as new, and say why
        return Base(ref, commit, None, "; ".join(exc.problems))


# ---------------------------------------------------------------- the diff


@dataclass(frozen=True)
class RoleRow:
    role: str
    count: tuple[int | None, int]  # (base, head); base None: new at head
    instance_type: tuple[str | None, str]
    gpus: tuple[int | None, int]  # all nodes of the role
    usd: tuple[float | None, float | None]


@dataclass(frozen=True)
class ReviewDiff:
    label: str  # the file, as the pull request names it
    base: Base
    head: Spec
    review: Review

    def rows(self) -> list[RoleRow]:
        head = cluster_hardware(self.head, typed=True)
        base = cluster_hardware(self.base.spec, typed=True) if self.base.spec else {}
        head_cost, base_cost = hourly_cost(self.head), _cost(self.base.spec)
        rows = []
        for role in [*head, *(r for r in base if r not in head)]:
            h, b = head.get(role), base.get(role)
            rows.append(
                RoleRow(
                    role,
                    (b.count if b else (0 if self.base.spec else None), h.count if h else 0),
                    (b.instance_type if b else None, h.instance_type if h else "-"),
                    (
                        b.count * b.gpus if b else (0 if self.base.spec else None),
                        h.count * h.gpus if h else 0,
                    ),
                    (
                        base_cost.per_role.get(role, 0.0) if base_cost else None,
                        head_cost.per_role.get(role, 0.0),
                    ),
                )
            )
        return rows

    def totals(self) -> RoleRow:
        rows, base_cost = self.rows(), _cost(self.base.spec)
        new = self.base.spec is None
        return RoleRow(
            "total",
            (None if new else sum(r.count[0] or 0 for r in rows), sum(r.count[1] for r in rows)),
            (None, ""),
            (None if new else sum(r.gpus[0] or 0 for r in rows), sum(r.gpus[1] for r in rows)),
            (base_cost.total if base_cost else None, hourly_cost(self.head).total),
        )

    def spec_changes(self) -> list[str]:
        if self.base.spec is None:
            return []
        old, new = (
            _flatten(self.base.spec.model_dump(mode="json")),
            _flatten(self.head.model_dump(mode="json")),
        )
        missing = object()
        return [
            f"`{key}`: {_value(old.get(key, missing))} → {_value(new.get(key, missing))}"
            for key in [*new, *(k for k in old if k not in new)]
            if old.get(key, missing) != new.get(key, missing)
        ]

    def warnings(self) -> list[str]:
        spec, found = self.head, [*hardware_warnings(self.head, typed=True), *quota_warnings(self.head)]
        if spec.cluster.workers.spot.enabled and spec.training.checkpoint_every >= spec.training.steps:
            found.append(
                f"cluster.workers.spot: spot workers can be reclaimed at two minutes' notice, and "
                f"training.checkpoint_every ({spec.training.checkpoint_every}) >= training.steps "
                f"({spec.training.steps}): no checkpoint before the end. Fix: checkpoint more often"
            )
        if self.base.problem:
            found.append(
                f"the base version does not resolve, so all of head is shown as new: {self.base.problem}"
            )
        return found

    def markdown(self) -> str:
        base = self.base
        is_sha = base.commit.startswith(base.ref)
        short = base.ref[:7] if is_sha else base.ref
        named = f"`{short}`" + ("" if is_sha else f" (`{base.commit[:7]}`)")
        since = f"new file (absent at `{short}`)" if base.spec is None else f"{named} → head"
        lines = [f"### `{self.label}`: {since}", ""]
        if self.review.counts:
            add, change, destroy = self.review.counts
            lines += [
                f"Resources (head's plan): **{add}** to add, **{change}** to change, "
                f"**{destroy}** to destroy.",
                "",
            ]
        lines += ["| role | instances | instance type | GPUs | $/h |", "|---|---|---|---|---|"]
        for row in [*self.rows(), self.totals()]:
            cells = [
                _delta(*row.count),
                " → ".join(f"`{t}`" for t in dict.fromkeys(x for x in row.instance_type if x)),
                _delta(*row.gpus),
                _usd(row),
            ]
            if row.role == "total":
                cells = [f"**{c}**" if c else c for c in cells]
            lines.append(
                f"| {'**total**' if row.role == 'total' else row.role} | " + " | ".join(cells) + " |"
            )
        lines += ["", f"On-demand prices: {catalog().price_note()}.", ""]
        if changes := self.spec_changes():
            shown = changes[:FIELDS_SHOWN] + (
                [f"… and {len(changes) - FIELDS_SHOWN} more"] if len(changes) > FIELDS_SHOWN else []
            )
            lines += ["**Spec changes** (resolved, base → head):", *(f"- {c}" for c in shown), ""]
        elif base.spec is not None:
            lines += ["**Spec changes**: none in the resolved spec.", ""]
        if warnings := self.warnings():
            lines += ["**Warnings:**", *(f"- ⚠️ {w}" for w in warnings), ""]
        if self.head.aws.endpoint_url:
            lines += [emulator.note_markdown(self.head)]
        if self.review.details:
            plan = self.review.details
            if len(plan) > PLAN_SHOWN:
                plan = plan[:PLAN_SHOWN].rsplit("\n", 1)[0] + f"\n… cut here: {len(plan)} characters in all"
            lines += [
                "<details><summary>terraform plan</summary>",
                "",
                _fence(plan),
                plan.rstrip(),
                _fence(plan),
                "",
                "</details>",
                "",
            ]
        return "\n".join(lines)

    def text(self) -> str:
        lines = [f"{self.label}: " + ("new file" if self.base.spec is None else f"{self.base.ref} → head")]
        if self.review.counts:
            lines.append("resources: {} to add, {} to change, {} to destroy".format(*self.review.counts))
        for row in [*self.rows(), self.totals()]:
            kinds = " → ".join(dict.fromkeys(x for x in row.instance_type if x))
            lines.append(
                f"  {row.role:<7} {_delta(*row.count):<14} {kinds:<28} "
                f"GPUs {_delta(*row.gpus):<10} {_usd(row)}"
            )
        lines += [f"  {c.replace('`', '')}" for c in self.spec_changes()]
        lines += [f"warning: {w}" for w in self.warnings()]
        if self.head.aws.endpoint_url:
            lines.append(emulator.note_text(self.head))
        return "\n".join(lines)


def _cost(spec: Spec | None) -> HourlyCost | None:
    return hourly_cost(spec) if spec is not None else None


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out |= _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    return out


def _value(value: Any) -> str:
    if not isinstance(value, str | int | float | bool | list | dict | None):
        return "(unset)"
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split()).replace("`", "'")
    return f"`{text[:FIELD_SHOWN]}{'…' if len(text) > FIELD_SHOWN else ''}`"


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`, which then cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _delta(base: int | None, head: int) -> str:
    if base is None:
        return f"{head} (new)"
    return str(head) if base == head else f"{base} → {head} ({head - base:+d})"


def _usd(row: RoleRow) -> str:
    """'$1.02/h → $2.04/h (+$1.02/h)'; one price when nothing changed or the file is new."""
    base, head = row.usd
    shown = "unknown" if head is None else f"${head:.2f}/h"
    if row.count[0] is None or base == head:
        return shown
    if base is None or head is None:
        return f"{'unknown' if base is None else f'${base:.2f}/h'} → {shown}"
    sign = "+" if head > base else "-"
    return f"${base:.2f}/h → ${head:.2f}/h ({sign}${abs(head - base):.2f}/h)"

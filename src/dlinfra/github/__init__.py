"""The GitHub workflows `dlinfra init --github` writes into an experiment repository: plan reviews
of the experiments a pull request changes, posted as one comment, and optionally a credentialed
plan and apply on merge.

Written into the user's repository rather than called from this one (`uses: org/dlinfra/...@v1`):
what varies per repository (where its experiments live, which dlinfra it pins, a private index or
fork) is known when `init` runs, the files are plain to review, and a private fork needs no access
to a workflow in another repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from dlinfra import __version__
from dlinfra.errors import DlinfraError, SpecError, mask
from dlinfra.github.install import default_install as default_install
from dlinfra.spec.input import shown

TEMPLATES = Path(__file__).with_name("templates")
WORKFLOWS = Path(".github") / "workflows"
PLAN, PLAN_AWS, COMMENT, APPLY = (
    "dlinfra-plan.yml",
    "dlinfra-plan-aws.yml",
    "dlinfra-plan-comment.yml",
    "dlinfra-apply.yml",
)
# A pip requirement or URL, and a repository directory: they land in YAML and shell, so nothing
# that could quote, expand or break a line.
INSTALL_RE = r"[A-Za-z0-9][A-Za-z0-9_.\-\[\],=<>!~@+:/#% ]{0,300}"
DIRECTORY_RE = r"\.|[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)*"
BRANCH_RE = r"[A-Za-z0-9_][A-Za-z0-9_./\-]{0,100}"


@dataclass(frozen=True)
class WorkflowSettings:
    install: str  # what `pip install` gets: git+https://…@<sha>, a wheel URL#sha256=…, or a version
    experiments: str = "experiments"  # the repository directory whose *.yaml files are experiments
    aws: bool = False  # also the credentialed plan behind the protected environment
    apply: bool = False  # also apply on merge, for experiments marked auto_apply
    branch: str = "main"  # the default branch (apply on merge)

    def problems(self) -> list[str]:
        found = []
        if not re.fullmatch(INSTALL_RE, self.install):
            found.append(
                f"--install {shown(self.install)}: not a pip requirement. Fix: e.g. "
                "'dlinfra[aws,emulator] @ git+https://github.com/ORG/dlinfra@SHA'"
            )
        elif mask(self.install) != self.install:
            # the workflow file is committed and shown to every reader of the repository
            found.append(
                f"--install {shown(self.install)}: carries a credential, which would be committed in "
                "the workflow file. Fix: a URL the runner reaches without one (a public repository "
                "or wheel), or a private index the job's own secrets configure"
            )
        if not re.fullmatch(DIRECTORY_RE, self.experiments) or ".." in self.experiments.split("/"):
            found.append(
                f"--experiments {shown(self.experiments)}: not a directory of this repository. "
                "Fix: a relative path like experiments or ml/experiments (. for the whole repository)"
            )
        if not re.fullmatch(BRANCH_RE, self.branch):
            found.append(f"--branch {shown(self.branch)}: not a branch name. Fix: e.g. --branch main")
        return found


def _environment() -> jinja2.Environment:
    """`${{ }}` is GitHub's: the templates mark their own fields with [[ ]] and [% %]."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        block_start_string="[%",
        block_end_string="%]",
        variable_start_string="[[",
        variable_end_string="]]",
        comment_start_string="[#",
        comment_end_string="#]",
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )


def render(settings: WorkflowSettings) -> dict[str, str]:
    """File name → its text, for every workflow the settings ask for."""
    if problems := settings.problems():
        raise SpecError(problems)
    prefix = "" if settings.experiments == "." else f"{settings.experiments}/"
    fields = {
        "version": __version__,
        "install": settings.install,
        "experiments": settings.experiments,
        "paths": [f"{prefix}**.yaml", f"{prefix}**.yml"],
        "branch": settings.branch,
        "plan_workflows": ["dlinfra plan", *(["dlinfra plan (aws)"] if settings.aws else [])],
    }
    env = _environment()
    files = {
        PLAN: env.get_template("dlinfra-plan.yml.j2").render(fields, aws=False),
        COMMENT: env.get_template("dlinfra-plan-comment.yml.j2").render(fields),
    }
    if settings.aws:
        files[PLAN_AWS] = env.get_template("dlinfra-plan.yml.j2").render(fields, aws=True)
    if settings.apply:
        files[APPLY] = env.get_template("dlinfra-apply.yml.j2").render(fields)
    return files


def to_write(root: Path, settings: WorkflowSettings, force: bool = False) -> tuple[Path, dict[str, str]]:
    """(root/.github/workflows, file name → text); refuses to replace a workflow unless `force`."""
    files = render(settings)
    folder = root / WORKFLOWS
    existing = [name for name in files if (folder / name).exists()]
    if existing and not force:
        raise DlinfraError(
            f"{folder / existing[0]} already exists. Fix: add --force to replace the dlinfra workflows"
        )
    return folder, files

"""Errors the CLI turns into one clear message and exit code 2 (bad input, missing tools)."""

from __future__ import annotations


class DlinfraError(Exception):
    """A problem the user can fix; ``str(err)`` is the whole message shown to them."""

    exit_code = 2


class SpecError(DlinfraError):
    """The experiment file or a CLI override is invalid."""

    SHOWN = 20  # a file with 300,000 bad items gets 20 lines, not 64 MB

    def __init__(self, problems: list[str]):
        if len(problems) > self.SHOWN:
            problems = [*problems[: self.SHOWN], f"... and {len(problems) - self.SHOWN} more problems"]
        self.problems = problems
        super().__init__("\n".join(problems))


class StoreError(DlinfraError):
    """The results store cannot be reached or holds something unexpected."""


class TerraformError(DlinfraError):
    """terraform is missing, too old, or reported diagnostics."""


class CredentialsError(DlinfraError):
    """No usable cloud credentials."""


class RunNotFound(DlinfraError):
    """A run id that has no run directory."""


class RunFailed(DlinfraError):
    """The run itself failed mid-way (e.g. a lost instance could not be replaced): not bad input."""

    exit_code = 1

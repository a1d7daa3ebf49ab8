"""Errors the CLI turns into one clear message and exit code 2 (bad input, missing tools)."""

from __future__ import annotations

import re


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


_B64 = "A-Za-z0-9/+"
CREDENTIALS = (
    (re.compile(r"(?<=://)[^/@\s]+@"), "***@"),  # a URL's user:password@
    # an AWS access key id, and whatever is glued to it (its secret key, pasted after a ':' or '/')
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}[^\s'\"@,;]*"), r"\1…"),
    # a query or config parameter that names a secret: ?token=…, &password=…, X-Amz-Signature=…
    (
        re.compile(
            r"(?i)((?<![A-Za-z0-9])[A-Za-z0-9_.-]*"
            r"(?:password|passwd|pwd|token|secret|signature|credential|api[_-]?key|access[_-]?key)=)"
            r"[^&#;\s'\"]+"
        ),
        r"\1***",
    ),
)
# Secret access keys (40) and session tokens (100s) are base64 runs with no marker of their own: judged
# by length and mix, so that a path (a slash every few characters) or a hex digest is not taken for one.
_BASE64_RUN = re.compile(rf"(?<![{_B64}=])[{_B64}]{{40,}}={{0,2}}(?![{_B64}=])")


def mask(text: str) -> str:
    """`text` with anything shaped like a credential masked: a URL's user:password@, an AWS access key
    id and what is glued to it, a secret key, a session token, a password=/token=/signature= parameter.
    The one masking function: every echo of user input goes through it (`shown`, the CLI's error sink)."""
    for pattern, replacement in CREDENTIALS:
        text = pattern.sub(replacement, text)
    return _BASE64_RUN.sub(_masked_run, text)


def _masked_run(match: re.Match[str]) -> str:
    run = match.group(0)
    body = run.rstrip("=")
    mixed = all(re.search(c, body) for c in ("[A-Z]", "[a-z]", "[0-9]"))
    segments = [s for s in body.split("/") if s]  # a path has a short one every few characters
    secret_key = len(body) == 40 and len(segments) <= 5
    session_token = len(body) >= 100 and len(body) / len(segments) >= 25
    return "***" if mixed and (secret_key or session_token) else run

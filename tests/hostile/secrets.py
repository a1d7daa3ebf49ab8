"""Class 2 of issue 55: what of the deploying shell a local node gets (`training.pass_env`), and that
no shell secret is echoed while a spec is refused. The real run is tests/e2e/test_secrets.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hostile import Case

SHELL = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKEHOSTILE00002",
    "AWS_SECRET_ACCESS_KEY": "fakeHostileSecretKey/dlinfra0000000000000",
    "GITHUB_TOKEN": "ghp_fakeHostileToken000000000000000000000",
}


def _spec(body: str, *extra: str) -> Callable[[Path], list[str]]:
    def args(work: Path) -> list[str]:
        spec = work / "experiment.yaml"
        spec.write_text(body)
        return ["validate", str(spec), *extra]

    return args


CASES = [
    Case(
        "pass-env-not-a-name",
        _spec("training:\n  pass_env: ['A=B; rm -rf /']\n"),
        expected=("training.pass_env", "is not a variable name", "Fix:"),
    ),
    Case(
        "pass-env-overrides-the-nodes-own",
        _spec("training:\n  pass_env: [TF_CONFIG, PATH]\n"),
        expected=("training.pass_env", "TF_CONFIG is set by dlinfra", "PATH is set by dlinfra"),
    ),
    Case(
        "pass-env-to-instances",
        _spec("target: aws\ntraining:\n  pass_env: [AWS_SECRET_ACCESS_KEY]\n"),
        expected=("training.pass_env", "instance profile", "Fix:"),
        absent=tuple(SHELL.values()),
        env=SHELL,
    ),
    Case(
        "pass-env-names-too-many",
        _spec("training:\n  pass_env: [" + ", ".join(f"V{i}" for i in range(65)) + "]\n"),
        expected=("training.pass_env", "64"),
    ),
]

"""Class 3 of issue 55 at the controller's flags: what would keep it up for ever, or point it at a
local path or a credentialed endpoint, is refused before it reads or starts anything. Planted
hand-over records are real runs, not CLI calls: tests/test_controller_handovers.py and
tests/infra/test_controller_handovers_moto.py."""

from __future__ import annotations

from hostile import Case

NOWHERE = "http://127.0.0.1:9"  # never reached: each case is refused before any call


def _run(*flags: str) -> list[str]:
    return ["controller", "run", "--bucket", "okbucket", *flags]


CASES = [
    Case(
        "controller-idle-forever",
        lambda work: _run("--idle-minutes", "inf", "--endpoint-url", NOWHERE),
        expected=("--idle-minutes inf", "Fix: e.g. --idle-minutes 10"),
    ),
    Case(
        "setup-controller-idle-forever",
        lambda work: [
            *("setup", "--bucket", "okbucket", "--controller", "--ami", "ami-0123456789abcdef0"),
            *("--idle-minutes", "inf", "--endpoint-url", NOWHERE),
        ],
        expected=("--idle-minutes inf", "Fix:"),
    ),
    Case(
        "controller-endpoint-local-file",
        lambda work: ["controller", "status", "--bucket", "okbucket", "--endpoint-url", f"file://{work}"],
        expected=("--endpoint-url", "must be an http(s) URL", "Fix:"),
    ),
    Case(
        "controller-endpoint-with-password",
        lambda work: _run("--endpoint-url", "http://someone:hunter2secret@127.0.0.1:9"),
        expected=("--endpoint-url", "must not carry credentials"),
        absent=("hunter2secret",),
    ),
    Case(
        "controller-bucket-path",
        lambda work: ["controller", "logs", "--bucket", "../../etc", "--endpoint-url", NOWHERE],
        expected=("--bucket", "not an S3 bucket name", "Fix:"),
    ),
]

"""Bad input, timed: every case of tests/test_spec_errors.py through `dlinfra validate` (and a few
other commands' bad paths and sizes) in a fresh process, with its exit code, wall time, peak RSS and
stderr size. Goals (issue 14): each one under 2 s and 200 MB, stderr under 8 KB, exit 2. The alias
bomb is the case to watch (it once hung and ate gigabytes).

`--baseline DIR` also runs another checkout's source (a `git worktree` of an older commit) in the
same run, case by case, so both columns see the same machine load."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from hostile import all_cases  # noqa: E402
from test_spec_errors import CASES, FILE_CASES  # noqa: E402

GOAL_SECONDS, GOAL_MB, GOAL_STDERR = 2.0, 200.0, 8192


def measure(
    args: list[str], source: Path | None, home: str, extra_env: dict[str, str]
) -> tuple[int, float, float, int]:
    """(exit code, seconds, peak RSS in MB, stderr bytes) of one fresh `dlinfra` process."""
    env = dict(os.environ, DLINFRA_HOME=home, **extra_env)
    if source:
        env["PYTHONPATH"] = str(source / "src")
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "dlinfra", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0, os.SEEK_END)
        return proc.returncode, seconds, usage.ru_maxrss / 1024, err.tell()  # Linux: ru_maxrss in KB


# Bad input that is not a spec (issue 30): output paths, a cluster this machine cannot hold, GPUs an
# emulated instance cannot see. Each must also exit 2 at once, before anything is written or started.
OTHER_COMMANDS: list[tuple[str, list[str]]] = [
    ("render-out-proc", ["render", "--out", "/proc/x"]),
    ("render-out-is-a-file", ["render", "--out", "{workdir}/a-file"]),
    ("plan-markdown-proc", ["plan", "--markdown", "/proc/x.md"]),
    ("init-proc", ["init", "/proc/x.yaml"]),
    ("local-1101-nodes", ["validate", "--workers", "1000", "--ps", "100"]),
    (
        "emulated-gpu-this-machine-lacks",
        [
            *("deploy", "--target", "aws", "--endpoint-url", "http://127.0.0.1:9", "--emulate-instances"),
            *("--set", "aws.ami=ami-12345678", "--set", "storage.url=s3://results-bucket/runs"),
        ],
    ),
]


Row = tuple[str, list[str], dict[str, str], int]  # name, arguments, extra environment, expected exit


def cases(workdir: Path) -> list[Row]:
    (workdir / "a-file").write_text("not a directory\n")
    out: list[Row] = [
        (name, [a.format(workdir=workdir) for a in args], {}, 2) for name, args in OTHER_COMMANDS
    ]
    for name, text, extra, _ in CASES:
        args = ["validate", *extra]
        if text is not None:
            path = workdir / f"{name}.yaml"
            path.write_text(text)
            args.insert(1, str(path))
        out.append((name, args, {}, 2))
    for name, content, _ in FILE_CASES:
        path = workdir / f"file-{name}.yaml"
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)
        out.append((f"file-{name}", ["validate", str(path)], {}, 2))
    for case in all_cases():  # issue 55's classes: each makes its files in a directory of its own
        scratch = workdir / "hostile" / case.name
        scratch.mkdir(parents=True)
        out.append((case.name, case.args(scratch), case.env, case.code))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another checkout to run side by side")
    baseline = parser.parse_args().baseline
    sources: list[tuple[str, Path | None]] = [("this", None)] + ([("baseline", baseline)] if baseline else [])
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        rows = []
        expected = {}
        for name, args, extra_env, code in cases(workdir):
            expected[name] = code
            home = str(workdir / "home")
            rows.append((name, [measure(args, source, home, extra_env) for _, source in sources]))
    header = f"{'case':34}" + "".join(f"{label:>30}" for label, _ in sources)
    print(header)
    print(f"{'':34}" + f"{'exit      s     MB  stderr B':>30}" * len(sources))
    for name, results in rows:
        print(
            f"{name:34}"
            + "".join(f"{code:>6} {sec:6.2f} {mb:6.0f} {err:9}" for code, sec, mb, err in results)
        )
    for column, (label, _) in enumerate(sources):
        results = [r[column] for _, r in rows]
        off = [
            n
            for n, r in rows
            if r[column][0] != expected[n] or r[column][1] > GOAL_SECONDS or r[column][2] > GOAL_MB
        ]
        slowest = max(r[1] for r in results)
        print(
            f"{label}: {len(rows)} cases; slowest {slowest:.2f} s (goal {GOAL_SECONDS} s), "
            f"peak {max(r[2] for r in results):.0f} MB (goal {GOAL_MB:.0f}), largest stderr "
            f"{max(r[3] for r in results)} B (goal < {GOAL_STDERR}); off goal: {', '.join(off) or 'none'}"
        )


if __name__ == "__main__":
    main()

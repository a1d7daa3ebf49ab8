"""Every hostile-input case of tests/hostile/ through the real CLI in a fresh process (issue 55)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import Case, all_cases

from support import Cli

CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_refused_clearly(cli: Cli, tmp_path: Path, home: Path, case: Case) -> None:
    work = tmp_path / "case"
    work.mkdir()
    result = cli(*case.args(work), extra_env=case.env, cwd=work, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == case.code, out
    for text in case.expected:
        assert text in " ".join(out.split()), f"{text!r} not in:\n{out}"  # rich wraps long lines
    for text in case.absent:
        assert text not in out, f"{text!r} must not be printed:\n{out}"
    assert "Traceback" not in out and "internal error" not in out
    assert len(result.stderr) < 8192, "one short message per problem, never the input echoed whole"
    if case.code == 2:
        assert not (home / "runs").exists(), "refused input must not create a run"

"""A checkout's lock is resolved from its pyproject.toml while its wheel builds (environment/declared.py,
runs/wheel.BuildingWheel): the same requirements as the built wheel's metadata, the same lock from the
real index, the same refusal of a Python dlinfra does not support, and no run when the build fails."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from dlinfra.environment.declared import Declared
from dlinfra.environment.lock import EXTRAS, OWN_TENSORFLOW_EXTRAS, SCRIPT_EXTRAS, Index, Platform, resolve
from dlinfra.errors import DlinfraError
from dlinfra.prepare import NodeInstall, prepare
from dlinfra.render import loopback_plan
from dlinfra.runs.wheel import SOURCE_ROOT, BuildingWheel, node_wheel
from dlinfra.spec.model import Spec
from support import fixed_locks, run_cli

PYPROJECT = SOURCE_ROOT / "pyproject.toml"
EVERY_EXTRAS = sorted({*EXTRAS.values(), *SCRIPT_EXTRAS.values(), OWN_TENSORFLOW_EXTRAS})


def _comparable(line: str) -> tuple[str, str, frozenset[str]]:
    """A requirement without its `extra == …` marker, as the resolver reads it."""
    requirement = Requirement(line)
    return requirement.name.lower(), str(requirement.specifier), frozenset(requirement.extras)


def _wheel_requirements(wheel: Path, wanted: str) -> set[tuple[str, str, frozenset[str]]]:
    """What the wheel's metadata requires of dlinfra[wanted]: the lines without a marker, and those
    whose marker holds for one of the extras."""
    with zipfile.ZipFile(wheel) as zipped:
        (name,) = [n for n in zipped.namelist() if n.endswith(".dist-info/METADATA")]
        head = zipped.read(name).decode().split("\n\n", 1)[0]
    lines = [
        line.removeprefix("Requires-Dist: ")
        for line in head.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    return {
        _comparable(line)
        for line in lines
        if (marker := Requirement(line).marker) is None
        or any(marker.evaluate({"extra": extra}) for extra in wanted.split(","))
    }


@pytest.mark.parametrize("wanted", EVERY_EXTRAS)
def test_the_checkouts_declared_requirements_are_its_built_wheels(wanted: str) -> None:
    declared = Declared.read(PYPROJECT).requirements(wanted)
    assert declared, "dlinfra declares dependencies"
    assert {_comparable(line) for line in declared} == _wheel_requirements(node_wheel(), wanted)


def test_the_lock_from_the_pyproject_is_the_lock_from_the_wheel_on_the_real_index() -> None:
    """The same pins and hashes, byte for byte: a node's lock (and so its environment's digest) does
    not depend on whether the wheel was built yet."""
    index = Index.of(None, None, os.environ)
    here = Platform.here()
    for requirements, script in (([], False), (["pandas"], True)):
        from_wheel = resolve(str(node_wheel()), requirements, "cpu", here, index, script)
        from_pyproject = resolve(str(PYPROJECT), requirements, "cpu", here, index, script)
        assert from_pyproject.text == from_wheel.text
        assert "tensorflow-cpu==2.21" in from_pyproject.text and "dlinfra" not in from_pyproject.text


def test_an_extra_naming_the_projects_own_extras_takes_theirs(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "Some_Tool"\nversion = "1.0"\ndependencies = ["pyyaml"]\n'
        "[project.optional-dependencies]\n"
        'a = ["numpy<3"]\nb = ["scipy", "some-tool[a]"]\n'
        'all = ["some-tool[a,b]", "rich; python_version >= \'3.11\'"]\n'
    )
    assert Declared.read(pyproject).requirements("all") == [
        "pyyaml",
        "rich; python_version >= '3.11'",
        "scipy",
        "numpy<3",
    ]


def test_nodes_on_a_python_dlinfra_does_not_support_are_refused_naming_aws_python(tmp_path: Path) -> None:
    spec = tmp_path / "experiment.yaml"
    spec.write_text('name: old-python\naws:\n  python: "3.10"\n')
    env = {**os.environ, "DLINFRA_HOME": str(tmp_path / "home"), "DLINFRA_CACHE": str(tmp_path / "cache")}
    result = run_cli("validate", "--target", "aws", str(spec), env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "aws.python: the nodes would run Python 3.10, and dlinfra" in result.stderr
    assert "needs Python >=3.11. Fix: set aws.python" in result.stderr
    assert not (tmp_path / "home" / "runs").exists()


def test_a_wheel_that_fails_to_build_beside_the_lock_creates_no_run(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINFRA_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "checkout"
    (broken / "src" / "dlinfra").mkdir(parents=True)
    (broken / "pyproject.toml").write_text("[project\nname = ")  # not TOML: no build backend takes it
    install = NodeInstall("dlinfra==0.1.0", BuildingWheel(broken), boots=False)
    assert install.lock_source == str(broken / "pyproject.toml")
    spec = Spec()
    with pytest.raises(DlinfraError, match="could not build the dlinfra wheel for the nodes"):
        prepare(spec, loopback_plan(spec), install, locks=fixed_locks(), typed=False)
    assert not (home / "runs").exists()

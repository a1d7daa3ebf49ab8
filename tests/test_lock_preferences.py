"""A lock prefers the releases environment.lock.PREFERRED names (ml-dtypes 0.6.0: 0.7.0 costs every
TensorFlow import 0.55 s of CPU), on the real index, and yields them to a requirement that wants
another release: a preference, never a constraint."""

from __future__ import annotations

import os

from packaging.version import Version

from dlinfra.environment.lock import PREFERRED, Index, Platform, resolve
from dlinfra.runs.wheel import SOURCE_ROOT

PYPROJECT = str(SOURCE_ROOT / "pyproject.toml")


def test_a_lock_takes_the_preferred_ml_dtypes_and_a_requirement_for_another_gets_its_own() -> None:
    index = Index.of(None, None, os.environ)
    here = Platform.here()
    name, version = PREFERRED[0].split("==")
    preferred = resolve(PYPROJECT, [], "cpu", here, index)
    assert preferred.pins()[name] == version
    assert preferred.pins()["tensorflow-cpu"].startswith("2.21")
    script = resolve(PYPROJECT, ["pandas"], "cpu", here, index, script=True)
    assert script.pins()[name] == version, "script mode's TensorFlow imports it as well"

    wants_newer = resolve(PYPROJECT, [f"ml_dtypes>{version}"], "cpu", here, index)
    assert Version(wants_newer.pins()[name]) > Version(version)
    assert wants_newer.pins()["tensorflow-cpu"] == preferred.pins()["tensorflow-cpu"]
    # an older TensorFlow that needs an older ml-dtypes takes that one, and nothing is refused
    own_tensorflow = resolve(PYPROJECT, ["tensorflow-cpu==2.15.1"], "cpu", here, index, script=True)
    assert Version(own_tensorflow.pins()[name]) < Version(version)

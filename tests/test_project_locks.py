"""The project's own environment installs from committed hash locks: locks/*.txt, made by
`bash scripts/lock.sh` (scripts/lock.py), installed by scripts/install.sh. Each lock is current with
what it is resolved from (pyproject.toml's dependency tables, locks/*.in: the digest in its header is
recomputed here, offline), pins every package `==` with its sha256 hashes and nothing else, satisfies
every requirement it is resolved from, and is what install.sh installs (and what this venv holds)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "scripts" / "install.sh"


def _load_lock_module():
    spec = importlib.util.spec_from_file_location("project_lock", ROOT / "scripts" / "lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


lock = _load_lock_module()
PROFILES = {p.name: p for p in lock.PROFILES}
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
# the one platform the locks are for, as markers see it
TARGET = {
    **default_environment(),
    "python_version": lock.PYTHON,
    "python_full_version": f"{lock.PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": lock.PLATFORM.split("-")[0],
}


def logical_lines(text: str) -> list[str]:
    """A requirements file's entries, as pip reads them: comments dropped, continuations joined."""
    out: list[str] = []
    parts: list[str] = []
    for raw in text.splitlines():
        line = "" if raw.lstrip().startswith("#") else raw.split(" #", 1)[0].strip()
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        if joined := " ".join(p for p in parts if p):
            out.append(joined)
        parts = []
    if joined := " ".join(p for p in parts if p):
        out.append(joined)
    return out


def parse(text: str) -> tuple[dict[str, tuple[str, list[str]]], list[str]]:
    """{normalized name: (version, hashes)} and what is wrong with the lock's form."""
    pins: dict[str, tuple[str, list[str]]] = {}
    problems: list[str] = []
    for entry in logical_lines(text):
        first, *rest = entry.split()
        match = PIN.fullmatch(first)
        if not match or ";" in entry:
            problems.append(f"not an exact pin (name==version, no marker, no option): {entry[:80]}")
            continue
        name = canonicalize_name(match[1])
        if name in pins:
            problems.append(f"{name} is pinned twice")
        bad = [token for token in rest if not HASH.fullmatch(token)]
        if bad or not rest:
            problems.append(
                f"{name}: every pin needs --hash=sha256:… and nothing else, found {bad or 'none'}"
            )
        pins[name] = (match[2], rest)
    return pins, problems


def recorded_digest(text: str) -> str | None:
    found = re.search(r"^# inputs-sha256: ([0-9a-f]{64})$", text, re.M)
    return found[1] if found else None


def roots(profile, root: Path) -> list[str]:
    """The requirements a lock is resolved from."""
    data = lock.inputs(profile, root)
    found = [*data.get("dependencies", [])]
    for extra in data.get("extras", {}).values():
        found += extra
    for lines in data["files"].values():
        found += lines
    return found


def lock_problems(profile, text: str, root: Path = ROOT) -> list[str]:
    """Everything that makes `text` not a current, exact, hash-checked lock of `profile`."""
    pins, problems = parse(text)
    if lock.REFRESH not in text.split("\n# inputs-sha256", 1)[0]:
        problems.append(f"its header does not name the refresh command ({lock.REFRESH})")
    if recorded_digest(text) != lock.digest(profile, root):
        problems.append(
            f"stale: resolved from other inputs than pyproject.toml and {', '.join(profile.files)} hold "
            f"now. Fix: {lock.REFRESH}"
        )
    for line in roots(profile, root):
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate({**TARGET, "extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{name} is not in the lock ({line})")
        elif not requirement.specifier.contains(Version(pins[name][0]), prereleases=True):
            problems.append(f"{name}=={pins[name][0]} does not satisfy {line}")
    return problems


def lock_text(name: str) -> str:
    return PROFILES[name].lock.read_text()


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_lock_is_current_exact_and_hash_checked(name: str) -> None:
    pins, _ = parse(lock_text(name))
    assert len(pins) > 20  # a real resolution, not an empty file
    assert lock_problems(PROFILES[name], lock_text(name)) == []


def test_the_run_lock_takes_the_versions_ci_tests() -> None:
    """`install.sh` installs what `install.sh dev` (CI) tested: every run pin is dev's, hashes too."""
    run, _ = parse(lock_text("run"))
    dev, _ = parse(lock_text("dev"))
    assert {name: dev.get(name) for name in run} == run
    assert {"pytest", "moto", "ruff"} <= set(dev) - set(run)


def test_the_locks_hold_their_own_tools() -> None:
    """uv (which installs the locks), pip (which dlinfra runs), and pyproject.toml's build backend."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    tools = lock.requirement_lines(ROOT / "locks" / "tools.in")
    assert {str(Requirement(r)) for r in build} <= {str(Requirement(t)) for t in tools}
    for name in ("dev", "run"):
        pins, _ = parse(lock_text(name))
        assert {"uv", "pip", "hatchling", "editables"} <= set(pins)
    checkov, _ = parse(lock_text("checkov"))
    assert "checkov" in checkov and "tensorflow-cpu" not in checkov


@pytest.fixture
def good_lock() -> str:
    """The dev lock with its digest made current: whatever is wrong below, a breakage did it."""
    current = f"inputs-sha256: {lock.digest(PROFILES['dev'])}"
    return re.sub(r"inputs-sha256: \w+", current, lock_text("dev"))


def _drop_hashes(text: str, name: str) -> str:
    return re.sub(rf"^({name}==\S+) \\\n(    --hash=\S+( \\)?\n)+", r"\1\n", text, count=1, flags=re.M)


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (lambda t: _drop_hashes(t, "pydantic"), "pydantic: every pin needs --hash"),
        (lambda t: re.sub(r"^pyyaml==", "pyyaml>=", t, flags=re.M), "not an exact pin"),
        (lambda t: t + "requests\n", "not an exact pin"),
        (lambda t: t + "-e .\n", "not an exact pin"),
        (lambda t: t + "--extra-index-url https://example.invalid/simple\n", "not an exact pin"),
        (lambda t: t + "six==1.16.0 --hash=md5:0123\n", "six: every pin needs --hash"),
        (
            lambda t: re.sub(r"^tensorflow-cpu==\S+", "tensorflow-cpu==0.0.1", t, flags=re.M),
            "tensorflow-cpu==0.0.1 does not satisfy tensorflow-cpu==",
        ),
        (
            lambda t: re.sub(r"^pytest==.*?(?=^\S)", "", t, count=1, flags=re.M | re.S),
            "pytest is not in the lock",
        ),
        (lambda t: re.sub(r"inputs-sha256: \w+", "inputs-sha256: " + "0" * 64, t), "stale"),
        (lambda t: t.replace(lock.REFRESH, "make lock"), "refresh command"),
    ],
)
def test_a_broken_lock_is_caught(good_lock: str, breakage, expected: str) -> None:
    assert not any(expected in problem for problem in lock_problems(PROFILES["dev"], good_lock))
    broken = breakage(good_lock)
    assert broken != good_lock
    problems = lock_problems(PROFILES["dev"], broken)
    assert any(expected in problem for problem in problems), problems


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "locks").mkdir()
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for source in (ROOT / "locks").glob("*.in"):
        shutil.copy(source, tmp_path / "locks")
    return tmp_path


ADD = '\n    "requests>=2",'  # a new first entry of an array


def _add(key: str) -> tuple[str, str]:
    return rf"^{re.escape(key)} = \[", f"{key} = [{ADD}"


@pytest.mark.parametrize(
    ("edit", "stale"),
    [
        (_add("dependencies"), {"dev", "run"}),
        (_add("dev"), {"dev", "run"}),  # run is resolved at dev's versions
        (_add("report"), {"dev", "run"}),
        ((r'^requires-python = "[^"]*"', 'requires-python = ">=3.12"'), {"dev", "run"}),
        (_add("emulator"), set()),  # extras no lock reads
        (_add("train-gpu"), set()),
    ],
)
def test_editing_pyproject_stales_exactly_the_locks_it_feeds(tmp_path: Path, edit, stale: set[str]) -> None:
    tree = _tree(tmp_path)
    before = {name: lock.digest(p, tree) for name, p in PROFILES.items()}
    text = (tree / "pyproject.toml").read_text()
    edited = re.sub(edit[0], lambda _: edit[1], text, count=1, flags=re.M)
    assert edited != text
    (tree / "pyproject.toml").write_text(edited)
    assert {name for name, p in PROFILES.items() if lock.digest(p, tree) != before[name]} == stale


def test_editing_an_input_file_stales_its_lock(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    before = {name: lock.digest(p, tree) for name, p in PROFILES.items()}
    with (tree / "locks" / "checkov.in").open("a") as f:
        f.write("checkov<3.3\n")
    assert {name for name, p in PROFILES.items() if lock.digest(p, tree) != before[name]} == {"checkov"}
    with (tree / "locks" / "tools.in").open("a") as f:
        f.write("# a comment changes nothing\n")
    assert {name for name, p in PROFILES.items() if lock.digest(p, tree) != before[name]} == {"checkov"}
    with (tree / "locks" / "tools.in").open("a") as f:
        f.write("wheel\n")
    assert {name for name, p in PROFILES.items() if lock.digest(p, tree) != before[name]} == set(PROFILES)


def test_install_sh_installs_only_from_the_locks() -> None:
    script = INSTALL.read_text()
    code = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in script.splitlines())  # no comments
    assert 'lock="locks/${profile}.txt"' in code
    assert re.search(
        r'pip sync --python \.venv/bin/python --require-hashes --compile-bytecode "\$lock"', code
    )
    assert re.search(r"pip sync --python \.venv-checkov/bin/python --require-hashes locks/checkov.txt", code)
    assert "pip install --python .venv/bin/python --no-deps --no-build-isolation --offline -e ." in code
    # pip installs uv alone: --require-hashes, --no-deps, from the lines it takes out of the lock
    pip_installs = re.findall(r"pip install (?:[^\n]*\\\n)*[^\n]*", code)
    assert len(pip_installs) == 2
    assert all("--no-deps" in c for c in pip_installs)
    assert any("--require-hashes" in c and '-r "$pin"' in c for c in pip_installs)
    # no requirement of its own: no version range, no extras list (`.[train,…]`)
    assert not re.search(r"\b[A-Za-z][\w.-]*(\[[^]]*\])?\s*(==|>=|<=|~=|!=|<|>)\s*\d|\.\[", code)
    assert f"!= {lock.PYTHON} ]" in code and f"!= {lock.PLATFORM.split('-')[0]} ]" in code


def test_install_sh_bootstraps_the_locked_uv_with_all_its_hashes(tmp_path: Path) -> None:
    """The awk program install.sh takes uv's pin out of the lock with, run on the real locks."""
    [program] = re.findall(r"awk '([^']+)' \"\$lock\"", INSTALL.read_text())
    for name in ("dev", "run"):
        pin = subprocess.run(
            ["awk", program, str(PROFILES[name].lock)], capture_output=True, text=True, check=True
        ).stdout
        pins, problems = parse(pin)
        assert problems == [] and list(pins) == ["uv"]
        assert pins["uv"] == parse(lock_text(name))[0]["uv"]
        assert len(pins["uv"][1]) >= 2  # the wheels of every platform, and the sdist


def _site_packages(venv: Path) -> Path:
    [site] = (venv / "lib").glob("python*/site-packages")
    return site


def _installed(venv: Path) -> dict[str, str]:
    dists = metadata.distributions(path=[str(_site_packages(venv))])
    return {canonicalize_name(d.metadata["Name"]): d.version for d in dists}


def _in_project_venv() -> bool:
    return Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()


@pytest.mark.skipif(not _in_project_venv(), reason="not running in the project's .venv")
def test_this_venv_is_exactly_the_dev_lock() -> None:
    """What `install.sh dev` made (the venv this suite runs in): the dev lock, and this checkout."""
    have = _installed(ROOT / ".venv")
    want = {name: version for name, (version, _) in parse(lock_text("dev"))[0].items()}
    assert {n: Version(v) for n, v in have.items() if n != "dlinfra"} == {
        n: Version(v) for n, v in want.items()
    }, "the venv is not the dev lock. Fix: bash scripts/install.sh dev"
    direct = json.loads(metadata.distribution("dlinfra").read_text("direct_url.json") or "{}")
    assert direct.get("dir_info", {}).get("editable") is True
    assert Path(direct["url"].removeprefix("file://")).resolve() == ROOT


@pytest.mark.skipif(not _in_project_venv(), reason="not running in the project's .venv")
def test_the_checkov_venv_is_exactly_its_lock() -> None:
    venv = ROOT / ".venv-checkov"
    if not venv.is_dir():
        pytest.skip("no .venv-checkov (bash scripts/install.sh dev makes it)")
    want = {name: Version(version) for name, (version, _) in parse(lock_text("checkov"))[0].items()}
    assert {n: Version(v) for n, v in _installed(venv).items()} == want, "Fix: bash scripts/install.sh dev"

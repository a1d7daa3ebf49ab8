"""A user program with a dependency dlinfra does not have (`greeting`, built here and served from a
private index on loopback, next to PyPI): one hash-locked environment per run, the same on every
node, pinned for reruns, refused early when it cannot exist, and a node off it fails the run."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from package_index import PackageIndex
from support import aws_client, run_cli

from .conftest import Deployed, aws_emulation, deploy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
BUCKET = "dlinfra-environments"
DATA = Path(__file__).parent.parent / "data"
PROGRAM = """import greeting  # the user's own dependency: on the nodes only if the run's lock holds it

from user_program import build as _build


def build(training):
    print(f"greeting {greeting.VERSION}", flush=True)
    return _build(training)
"""


def _greeting(version: str) -> dict[str, str]:
    return {"greeting/__init__.py": f"VERSION = {version!r}\n"}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    with PackageIndex(tmp_path_factory.mktemp("index")) as served:
        served.publish("greeting", "1.0", _greeting("1.0"))
        yield served


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "user_program.py").write_text((DATA / "user_program.py").read_text())
    (root / "greet.py").write_text(PROGRAM)
    (root / "requirements.txt").write_text("# the program's own packages\ngreeting>=1.0\n")
    (root / "experiment.yaml").write_text(
        "name: greet\ntraining:\n  entrypoint: greet.py:build\n  steps: 40\n"
        "  requirements: requirements.txt\n"
    )
    return root


def _env(index: PackageIndex, cache: Path) -> dict[str, str]:
    # the variable pip users already set for a private index; a cache of environments of its own
    return {"PIP_EXTRA_INDEX_URL": index.url, "DLINFRA_CACHE": str(cache)}


def _statuses(run: Deployed) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in (run.store / "status").glob("*.json")}


def _runs_exactly_its_lock(run: Deployed, greeting: str) -> None:
    assert run.result.returncode == 0, run.result.stdout[-3000:] + run.result.stderr[-3000:]
    pin = run.manifest["environment"]["cpu"]
    assert pin["packages"]["greeting"] == greeting
    lock = (run.run_dir / "code" / pin["file"]).read_text()
    assert f"greeting=={greeting} \\\n    --hash=sha256:" in lock
    statuses = _statuses(run)
    assert sorted(statuses) == ["chief-0", "ps-0", "worker-0"]
    for node, status in statuses.items():
        assert status["packages"] == pin["packages"], node  # every package, as the lock has it
    assert f"greeting {greeting}" in (run.run_dir / "logs" / "chief-0.log").read_text()  # the program ran


@pytest.fixture(scope="module")
def first(index: PackageIndex, project: Path, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    tmp = tmp_path_factory.mktemp("first")
    return deploy(tmp, str(project / "experiment.yaml"), "--workers", "1", env=_env(index, tmp / "cache"))


def test_every_node_runs_the_runs_lock_with_the_users_package(first: Deployed) -> None:
    _runs_exactly_its_lock(first, "1.0")
    assert importlib.util.find_spec("greeting") is None, "a user's requirement never lands in the CLI's env"
    shown = run_cli("show", first.run_id, env={**os.environ, "DLINFRA_HOME": str(first.home)})
    assert shown.returncode == 0, shown.stderr
    assert "greeting 1.0" in shown.stdout


def test_a_rerun_installs_the_original_lock_and_refresh_records_the_change(
    first: Deployed, index: PackageIndex, tmp_path: Path
) -> None:
    index.publish("greeting", "1.1", _greeting("1.1"))
    try:
        env = {**_env(index, tmp_path / "cache"), "DLINFRA_HOME": str(first.home)}
        pinned = _rerun(first, tmp_path, env)
        _runs_exactly_its_lock(pinned, "1.0")
        assert (
            pinned.manifest["environment"]["cpu"]["sha256"] == first.manifest["environment"]["cpu"]["sha256"]
        )
        assert not pinned.manifest["lock_changes"]  # nothing resolved anew

        refreshed = _rerun(first, tmp_path, env, "--refresh-lock")
        _runs_exactly_its_lock(refreshed, "1.1")
        assert "greeting 1.0 → 1.1" in refreshed.manifest["lock_changes"]
        compared = run_cli("compare", pinned.run_id, refreshed.run_id, env={**os.environ, **env})
        assert compared.returncode == 0, compared.stderr
        assert "greeting" in compared.stdout and "1.0 → 1.1" in compared.stdout
    finally:
        index.unpublish("greeting", "1.1")


def _rerun(original: Deployed, tmp: Path, env: dict[str, str], *flags: str) -> Deployed:
    result = run_cli("rerun", original.run_id, *flags, env={**os.environ, **env}, cwd=tmp, timeout=600)
    runs = sorted((original.home / "runs").glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    return Deployed(result, original.home, runs[-1].parent)


def test_a_deploy_keeps_the_lock_of_the_same_inputs_and_a_refresh_takes_the_newest_release(
    first: Deployed, index: PackageIndex, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """greeting 1.1 is published after `first` resolved 1.0: a deploy of the same experiment keeps
    1.0 (the lock this machine resolved for the same inputs, as a lock file would) and says so; with
    --refresh-lock it resolves anew and takes 1.1. Each is planned as a deploy plans it (the run
    created, its lock pinned), with real uv against the real private index; nothing is started."""
    from dlinfra.deploy import Request, plan
    from dlinfra.spec.loading import Overrides, load_spec
    from dlinfra.targets import target_for
    from dlinfra.targets.base import TargetOptions

    cache = tmp_path / "cache"  # a copy of `first`'s locks (and its wheel): the refresh must not change them
    for kept_here in ("locks", "wheels"):
        shutil.copytree(first.home.parent / "cache" / kept_here, cache / kept_here)
    for name, value in {**_env(index, cache), "DLINFRA_HOME": str(tmp_path / "home")}.items():
        monkeypatch.setenv(name, value)
    path = project / "experiment.yaml"
    spec = load_spec(path, Overrides(workers=1))
    index.publish("greeting", "1.1", _greeting("1.1"))
    try:
        said: list[str] = []
        kept, _ = plan(Request(spec, path), target_for("local", TargetOptions(log=said.append)))
        refreshed, _ = plan(Request(spec, path, refresh_lock=True), target_for("local", TargetOptions()))
    finally:
        index.unpublish("greeting", "1.1")
    pinned = lambda prepared: prepared.run.manifest().environment["cpu"]  # noqa: E731
    assert pinned(kept).sha256 == first.manifest["environment"]["cpu"]["sha256"]
    assert pinned(kept).packages["greeting"] == "1.0"
    assert any(
        line.startswith("environment (cpu): the lock this machine resolved for the same inputs on 20")
        and line.endswith("(--refresh-lock resolves anew)")
        for line in said
    ), said
    assert pinned(refreshed).packages["greeting"] == "1.1"
    assert not refreshed.notes, "a lock the index gave just now needs no word"


def test_a_node_off_its_lock_fails_the_run_naming_it_and_the_package(
    first: Deployed, index: PackageIndex, tmp_path: Path
) -> None:
    """Tamper with the environment the nodes run in (the cached venv a rerun reuses): the run fails
    at once with the verdict `environment`, naming the node and the package, before any training."""
    from dlinfra.environment.lock import uv

    cache = tmp_path / "cache"
    env = {**_env(index, cache), "DLINFRA_HOME": str(first.home)}
    pinned = _rerun(first, tmp_path, env)
    assert pinned.result.returncode == 0, pinned.result.stderr[-3000:]
    (venv,) = [p.parent for p in (cache / "envs").glob("*/dlinfra-env.json")]
    # made with its bytecode: where PYTHONDONTWRITEBYTECODE is set, no node would ever write it
    (tensorflow,) = venv.glob("lib/python*/site-packages/tensorflow/__pycache__/__init__.*.pyc")
    assert list(venv.glob("lib/python*/site-packages/greeting/__pycache__/*.pyc"))
    # TensorFlow's is the CLI environment's own where uv hard-linked one cache file into both (one
    # file system, as here); greeting's was compiled
    cli = Path(sysconfig.get_paths()["purelib"], "tensorflow")
    if (tensorflow.parent.parent / "__init__.py").samefile(cli / "__init__.py"):
        assert tensorflow.samefile(cli / "__pycache__" / tensorflow.name)
    # the run's dlinfra is beside the environment, which runs of any dlinfra wheel share
    assert not list(venv.glob("lib/python*/site-packages/dlinfra"))
    (code,) = [p.parent for p in (cache / "code").glob("*/dlinfra-env.json")]
    assert code.name == pinned.manifest["wheel"]["sha256"][:20]
    assert list(code.glob("dlinfra/__pycache__/__init__.*.pyc"))
    index.publish("greeting", "1.1", _greeting("1.1"))
    try:
        tamper = [uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
        done = subprocess.run(
            [*tamper, "--index-url", index.url, "greeting==1.1"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        drifted = _rerun(first, tmp_path, env)
    finally:
        index.unpublish("greeting", "1.1")
    assert drifted.result.returncode == 1, drifted.result.stdout[-2000:] + drifted.result.stderr[-2000:]
    said = drifted.result.stdout + drifted.result.stderr
    assert "environment" in said and "greeting 1.1 (the lock has 1.0)" in said
    assert drifted.manifest["status"] == "FAILED"
    marker = json.loads((drifted.store / "FAILED").read_text())
    assert marker["verdict"] == "environment" and marker["node"] in ("chief-0", "ps-0", "worker-0")
    assert not (drifted.store / "metrics.json").exists(), "no training on an environment off its lock"


def test_with_no_network_validate_and_render_answer_and_deploy_runs_the_lock_cached_and_says_so(
    first: Deployed, index: PackageIndex, project: Path, tmp_path: Path
) -> None:
    """A laptop on a train: no network at all (`unshare -rn`: a namespace with no link, not even to
    PyPI or the private index). validate and render answer from the lock this machine resolved for
    the same inputs; a deploy that asks for a fresh lock cannot ask the index and uv's cache is
    empty, so it runs that lock, says so, and every node runs exactly it."""
    cache = first.home.parent / "cache"  # where `first` left its lock and its environment
    env = {
        **os.environ, **_env(index, cache), "DLINFRA_HOME": str(first.home),
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "UV_HTTP_RETRIES": "0",
    }  # fmt: skip
    spec = str(project / "experiment.yaml")

    def offline(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["unshare", "-rn", sys.executable, "-m", "dlinfra", *args], capture_output=True, text=True,
            env=env, cwd=tmp_path, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    checked = offline("validate", spec)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rendered = offline("render", spec, "--workers", "2", "--out", str(tmp_path / "rendered"))
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    names = sorted(p.name for p in (tmp_path / "rendered").iterdir())
    assert names == sorted(f"{n}.{kind}" for n in ("chief-0", "ps-0", "worker-0", "worker-1")
                           for kind in ("json", "user-data.yaml"))  # fmt: skip
    # --refresh-lock: it asks the index, which does not answer, then uv's cache, which is empty
    deployed = offline("deploy", spec, "--workers", "1", "--refresh-lock")
    said = deployed.stdout + deployed.stderr
    assert "environment (cpu): the package index did not answer" in said, said[-3000:]
    assert "the lock this machine resolved for the same inputs on" in said
    runs = sorted((first.home / "runs").glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    run = Deployed(deployed, first.home, runs[-1].parent)
    _runs_exactly_its_lock(run, "1.0")
    assert run.manifest["environment"]["cpu"]["sha256"] == first.manifest["environment"]["cpu"]["sha256"]


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        ("greeting==9.9", "greeting"),  # a version the index lacks
        ("numpy<1.0", "numpy"),  # contradicts TensorFlow's numpy range
    ],
)
@pytest.mark.parametrize("target", ["local", "aws"])
def test_an_environment_that_cannot_exist_is_refused_at_validate_with_nothing_created(
    index: PackageIndex, tmp_path: Path, requirement: str, why: str, target: str
) -> None:
    spec = tmp_path / "experiment.yaml"
    spec.write_text(f"name: nope\ntraining:\n  requirements: [{json.dumps(requirement)}]\n")
    env = {**os.environ, **_env(index, tmp_path / "cache"), "DLINFRA_HOME": str(tmp_path / "home")}
    result = run_cli("validate", "--target", target, str(spec), env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "training.requirements: no environment satisfies them" in result.stderr
    assert why in result.stderr and "Fix:" in result.stderr
    assert not (tmp_path / "home" / "runs").exists()


@pytest.mark.full  # the lock's way to an instance (the store); nodes running a lock is in the default tier
@pytest.mark.terraform
def test_aws_instances_install_the_runs_lock_from_the_store_and_run_the_users_package(
    index: PackageIndex, project: Path, moto_endpoint: str, tf_cli_config: Path, tmp_path: Path
) -> None:
    """The aws target, instances emulated as processes: the lock resolved here travels in the
    store beside the wheel, each instance's user-data pins its sha256, and every node reports
    exactly its packages, `greeting` among them. (Instances are processes here: each boots its
    flavor's environment made from the lock, which install.sh makes on a real instance; that script
    runs for real in tests/test_render.py and on a VM in tests/e2e/test_vms.py.)"""
    aws = aws_emulation(moto_endpoint, tf_cli_config, tmp_path / "home", BUCKET)
    env = aws["env"] | _env(index, tmp_path / "cache")
    result = run_cli(
        "deploy", str(project / "experiment.yaml"), "--target", "aws", "--workers", "1", "--yes",
        "--emulate-instances", *aws["args"], env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [run_dir] = (tmp_path / "home" / "runs").iterdir()
    pin = json.loads((run_dir / "manifest.json").read_text())["environment"]["cpu"]
    assert pin["packages"]["greeting"] == "1.0"
    s3, prefix = aws_client(moto_endpoint, "s3"), f"runs/{run_dir.name}/"

    def stored(key: str) -> bytes:
        return s3.get_object(Bucket=BUCKET, Key=prefix + key)["Body"].read()

    lock = stored(f"code/{pin['file']}")
    assert hashlib.sha256(lock).hexdigest() == pin["sha256"] and b"greeting==1.0 \\\n" in lock
    ec2 = aws_client(moto_endpoint, "ec2")
    instances = [
        i
        for r in ec2.describe_instances(Filters=[{"Name": "tag:dlinfra:run-id", "Values": [run_dir.name]}])[
            "Reservations"
        ]
        for i in r["Instances"]
    ]
    assert len(instances) == 3
    for instance in instances:
        attr = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
        assert pin["sha256"] in user_data and f"{prefix}code/{pin['file']}" in user_data
    for node in ("chief-0", "ps-0", "worker-0"):
        status = json.loads(stored(f"status/{node}.json"))
        assert status["packages"] == pin["packages"], node
    assert b"greeting 1.0" in stored("logs/chief-0.log"), "the user's program imported its package"

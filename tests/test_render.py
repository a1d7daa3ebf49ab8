"""Rendered user-data: valid for the real cloud-init, round-trips to the NodeConfig, holds no secret,
and installs the run's environment exactly: its flavor's lock (sha256-checked, hashes required),
then the run's wheel without dependencies."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from uv import find_uv_bin

from dlinfra import __version__
from dlinfra.contract import BUDGET_CHECKPOINT_SECONDS, LOCK_PATH
from dlinfra.environment.lock import Index, Lock
from dlinfra.prepare import Environment, NodeInstall, boot_install, release_requirement
from dlinfra.render import build_node_configs, node_config_from_user_data, render_cluster
from dlinfra.render.cloud_init import Install, render_user_data
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.model import Spec
from package_index import PackageIndex, build_wheel, package_index_fixture  # noqa: F401
from support import (
    FAKE_CREDS,
    Cli,
    addresses,
    assert_valid_cloud_config,
    fixed_locks,
    node_configs,
    store_config,
)

STORE = "s3://bucket/runs/r-1"
INSTALL_SH = "/usr/local/lib/dlinfra/install.sh"


def _environment(spec: Spec, locks: dict | None = None, environ: dict[str, str] | None = None) -> Environment:
    """The run's environment as prepare makes it, its locks given (resolution is not tested here)."""
    index = Index.of(spec.aws.pip_index_url, spec.aws.pip_extra_ca, environ or {})
    return Environment(locks or fixed_locks(), index)


def _boot(spec: Spec, env: Environment, wheel: Path | None = None, boots: bool = True) -> Install | None:
    """What prepare tells the nodes to install: `wheel` (None: the release) on top of the locks,
    each named by its URI under the run's store."""
    install = NodeInstall(release_requirement(), wheel, boots=boots)
    return boot_install(spec, install, lambda name: f"{STORE}/code/{name}", env)


def _script(user_data: str) -> str:
    doc = yaml.safe_load(user_data)
    return next(f["content"] for f in doc["write_files"] if f["path"] == INSTALL_SH)


def _lines(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines()]


def _installers(script: str) -> list[str]:
    """Every line that runs pip or uv to put something into the node's venv."""
    return [line for line in _lines(script) if re.match(r"/opt/dlinfra/bin/(pip|uv) ", line)]


def _image_check(lines: list[str], want: str, flavor: str, lock_sha256: str) -> str:
    """The line that asks whether the image holds the run's dlinfra (`want`) and lock already."""
    [line] = [line for line in lines if line.endswith(f"python3 - {want} {flavor} {lock_sha256} <<'PY'")]
    return line


def _render(target: str, strategy: str, workers: int) -> dict[str, tuple[str, object]]:
    sets = ["aws.subnet_cidr=10.42.0.0/23"] if workers > 100 else []
    spec = load_spec(None, Overrides(target=target, strategy=strategy, workers=workers, sets=sets))
    env = _environment(spec)
    configs = env.locked(node_configs(spec, "digits-cnn-20261122-000000-abcd", "s3://bucket/runs/x"))
    rendered = render_cluster(configs, _boot(spec, env, boots=target == "aws"))
    return {name: (rendered[name], configs[name]) for name in configs}


MATRIX = [
    (target, strategy, workers)
    for target in ("local", "aws")
    for strategy in ("parameter_server", "multi_worker_mirrored")
    for workers in (1, 3, 100)
]


@pytest.mark.parametrize(("target", "strategy", "workers"), MATRIX)
def test_every_user_data_passes_cloud_init_schema_and_round_trips(
    tmp_path: Path, target: str, strategy: str, workers: int
) -> None:
    nodes = _render(target, strategy, workers)
    expected = workers + (2 if strategy == "parameter_server" else 0)
    assert len(nodes) == expected
    files = []
    locks = fixed_locks()
    for name, (text, config) in nodes.items():
        assert text.startswith("#cloud-config\n")
        assert node_config_from_user_data(text) == config
        # node.json names the lock its node must run; on aws, install.sh checks that very lock
        assert config.lock_sha256 == locks[config.flavor].sha256
        if target == "aws":
            assert f"{config.lock_sha256}  {LOCK_PATH}" in text
            assert f"{STORE}/code/env-{config.flavor}.lock {LOCK_PATH}" in text
        else:
            assert "install.sh" not in text
        assert len(text.encode()) < 16384, "EC2 caps user_data at 16 KB"
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        files.append(path)
    # validate a sample spanning every role (all nodes of a role share one template path)
    sample = [f for f in files if f.stem in ("chief-0", "ps-0", "worker-0", f"worker-{workers - 1}")]
    for path in sample:
        assert_valid_cloud_config(path.read_text(), path)


def test_aws_user_data_installs_the_runs_lock_then_its_wheel_from_the_store(tmp_path: Path) -> None:
    """Unless the image holds exactly this lock and wheel, the install script fetches its flavor's lock
    from the store and checks its sha256 before anything else; uv (pip where uv cannot run) installs
    the lock alone, every file's hash required, from the private index and trusting its CA; then the
    run's wheel, checked too, goes on top without dependencies."""
    ca = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(
        yaml.safe_dump({"aws": {"pip_index_url": "https://pypi.internal.example/simple", "pip_extra_ca": ca}})
    )
    spec = load_spec(experiment, Overrides(target="aws", workers=2))
    wheel = tmp_path / "dlinfra-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"the run's wheel\n")
    wheel_sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    extra = "https://extra.internal.example/simple"  # an extra index the lock was resolved from too
    env = _environment(spec, environ={"PIP_EXTRA_INDEX_URL": extra})
    rendered = render_cluster(env.locked(node_configs(spec, "r-1", STORE)), _boot(spec, env, wheel))
    index = "--index-url https://pypi.internal.example/simple"
    pip_index = f"{index} --cert /etc/ssl/certs/ca-certificates.crt --extra-index-url {extra}"
    uv_index = f"{index} --extra-index-url {extra} --native-tls"  # the CA is in the system's roots
    at = f"/opt/dlinfra-wheel/{wheel.name}"
    for node, flavor in (("worker-0", "gpu"), ("chief-0", "cpu"), ("ps-0", "cpu")):  # g4dn / m5 nodes
        lock, other = env.locks[flavor], env.locks["cpu" if flavor == "gpu" else "gpu"]
        doc = yaml.safe_load(rendered[node])
        commands = [" ".join(map(str, c)) for c in doc["runcmd"]]
        assert commands[-1] == (
            "sh -c sh /usr/local/lib/dlinfra/install.sh && systemctl daemon-reload && "
            "systemctl start --no-block dlinfra-node.service || "
            '{ echo "dlinfra: the install failed: powering off"; systemctl poweroff; }'
        ), "the agent starts only after a good install"
        files = {f["path"]: f["content"] for f in doc["write_files"]}
        assert json.loads(files["/etc/dlinfra/node.json"])["lock_sha256"] == lock.sha256
        script = files[INSTALL_SH]
        assert other.sha256 not in script and f"env-{other.flavor}.lock" not in script, node
        lines = _lines(script)
        mismatch = f"/etc/dlinfra/env.lock does not match the sha256 the run pinned ({lock.sha256[:12]})"
        uv_from_lock = (
            "/opt/dlinfra/bin/pip install --quiet --no-compile --no-deps --require-hashes "
            f'--disable-pip-version-check {pip_index} -r "$uv_lock"'
            ' || echo "dlinfra: uv did not install: pip installs the lock"'
        )
        uv_sync = (
            "/opt/dlinfra/bin/uv pip sync --python /opt/dlinfra/bin/python --require-hashes "
            f"{uv_index} /etc/dlinfra/env.lock"
        )
        pip_sync = (
            "/opt/dlinfra/bin/pip install --quiet --no-compile --no-cache-dir --no-deps --require-hashes "
            f"--disable-pip-version-check {pip_index} -r /etc/dlinfra/env.lock"
        )
        uv_wheel = (  # a dlinfra of the same version in the image is replaced all the same
            "/opt/dlinfra/bin/uv pip install --python /opt/dlinfra/bin/python --no-deps "
            f"--reinstall-package dlinfra {at}"
        )
        pip_wheel = (
            "/opt/dlinfra/bin/pip install --quiet --no-compile --no-deps --force-reinstall "
            f"--disable-pip-version-check {at}"
        )
        image_check = _image_check(lines, f"sha256:{wheel_sha}", flavor, lock.sha256)
        steps = [
            f"aws s3 cp {STORE}/code/env-{flavor}.lock /etc/dlinfra/env.lock",
            # fail closed: a lock off its pin ends the script before anything is installed
            f"if ! echo '{lock.sha256}  /etc/dlinfra/env.lock' | sha256sum -c --quiet -; then",
            f"echo 'dlinfra: {mismatch}: not installed' >&2",
            "exit 1",
            image_check,  # does the image hold this lock, this wheel?
            "[ -x /opt/dlinfra/bin/python ] || python3 -m venv /opt/dlinfra",
            "update-ca-certificates",
            uv_from_lock,
            uv_sync,
            pip_sync,
            f"aws s3 cp {STORE}/code/{wheel.name} /opt/dlinfra-wheel/",
            f"if ! echo '{wheel_sha}  {at}' | sha256sum -c --quiet -; then",
            uv_wheel,
            pip_wheel,
        ]
        at_line = [lines.index(step) for step in steps]
        assert at_line == sorted(at_line), node
        # an image baked from this very lock keeps it: the store's copy is fetched only otherwise
        kept = (
            f"if echo '{lock.sha256}  /etc/dlinfra/image.lock' | sha256sum -c --quiet - >/dev/null 2>&1; then"
        )
        assert lines[at_line[0] - 3 : at_line[0] + 2] == [
            kept,
            "cp /etc/dlinfra/image.lock /etc/dlinfra/env.lock",
            "else",
            steps[0],
            "fi",
        ], node
        assert at_line[1:4] == [at_line[1], at_line[1] + 1, at_line[1] + 2], "a mismatch exits at once"
        assert lines[at_line[7] - 1].endswith(' /etc/dlinfra/env.lock > "$uv_lock"')  # uv's entry
        # the lock is installed by uv pip sync or pip --require-hashes alone; the wheel only --no-deps
        assert _installers(script) == [uv_from_lock, uv_sync, pip_sync, uv_wheel, pip_wheel], node
        assert [line for line in lines if line.startswith("aws s3 cp ")] == [steps[0], steps[10]]
        assert files["/usr/local/share/ca-certificates/dlinfra-extra-ca.crt"] == ca
    assert_valid_cloud_config(rendered["worker-0"], tmp_path / "worker-0.yaml")


def test_cloud_init_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validator used above can fail: a bad key in write_files is caught."""
    text, _ = _render("aws", "parameter_server", 1)["chief-0"]
    doc = yaml.safe_load(text)
    doc["write_files"][0]["permissions"] = 644  # must be a string
    with pytest.raises(AssertionError, match="permissions"):
        assert_valid_cloud_config("#cloud-config\n" + yaml.safe_dump(doc), tmp_path / "bad.yaml")


def test_aws_user_data_installs_this_exact_version_and_starts_the_agent() -> None:
    """Without a wheel to ship, the release is one of the lock's packages: the node fetches and
    installs its lock alone, and skips even that on an image of this release and lock."""
    text, config = _render("aws", "parameter_server", 1)["worker-0"]
    doc = yaml.safe_load(text)
    commands = [" ".join(map(str, c)) for c in doc["runcmd"]]
    script = _script(text)
    gpu = fixed_locks()["gpu"]
    assert config.flavor == "gpu" and config.lock_sha256 == gpu.sha256, "g4dn: the GPU build"
    lines = _lines(script)
    assert _image_check(lines, f"dlinfra=={__version__}", "gpu", gpu.sha256)
    assert [line for line in lines if line.startswith("aws s3 cp ")] == [
        f"aws s3 cp {STORE}/code/env-gpu.lock /etc/dlinfra/env.lock"
    ]
    installers = _installers(script)
    assert len(installers) == 3 and all("--require-hashes" in line for line in installers), installers
    assert [line.split(" || ")[0].rsplit(" ", 1)[-1] for line in installers] == [
        '"$uv_lock"',  # uv, off the lock (a mktemp file)
        "/etc/dlinfra/env.lock",
        "/etc/dlinfra/env.lock",
    ]
    assert "dlinfra[" not in script and "/opt/dlinfra-wheel" not in script, "no install beside the lock"
    unit = next(f for f in doc["write_files"] if f["path"].endswith("dlinfra-node.service"))["content"]
    assert "dlinfra node run /etc/dlinfra/node.json" in unit
    assert "Restart=on-failure" in unit
    assert any(c.startswith("shutdown -h +") for c in commands), "OS-level watchdog"


def test_the_os_watchdog_powers_off_at_the_budgets_end_when_that_comes_before_max_runtime() -> None:
    """cluster.max_cost of $2 at $4/h: 30 min, and the checkpoint's wait, not max_runtime's 10 h."""
    sets = ["cluster.max_cost=2", "cluster.max_runtime=36000"]
    spec = load_spec(None, Overrides(target="aws", workers=1, sets=sets))
    env = _environment(spec)
    made = build_node_configs(
        spec, "r-1", store_config(spec, STORE), addresses(spec), typed=True, usd_per_hour=4.0
    )
    for text in render_cluster(env.locked(made), _boot(spec, env)).values():
        shutdowns = [c for c in yaml.safe_load(text)["runcmd"] if c[0] == "shutdown"]
        assert shutdowns == [["shutdown", "-h", f"+{math.ceil((1800 + BUDGET_CHECKPOINT_SECONDS) / 60) + 5}"]]


def test_local_user_data_carries_only_the_node_config() -> None:
    text, _ = _render("local", "parameter_server", 1)["chief-0"]
    doc = yaml.safe_load(text)
    assert [f["path"] for f in doc["write_files"]] == ["/etc/dlinfra/node.json"]
    assert "runcmd" not in doc


def test_render_command_writes_user_data_and_node_json(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = cli("render", "--out", str(out), "--workers", "3", "--target", "aws", check=True)
    assert "rendered 5 nodes" in result.stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"{n}.{ext}"
        for n in ("chief-0", "ps-0", "worker-0", "worker-1", "worker-2")
        for ext in ("user-data.yaml", "json")
    )
    ud = (out / "worker-2.user-data.yaml").read_text()
    assert node_config_from_user_data(ud).model_dump() == json.loads((out / "worker-2.json").read_text())
    # each node.json names its flavor's lock (resolved for real), and install.sh checks exactly that one
    shas = {}
    for name, flavor in (("chief-0", "cpu"), ("ps-0", "cpu"), ("worker-0", "gpu"), ("worker-2", "gpu")):
        sha = json.loads((out / f"{name}.json").read_text())["lock_sha256"]
        script = _script((out / f"{name}.user-data.yaml").read_text())
        assert re.fullmatch(r"[0-9a-f]{64}", sha) and f"'{sha}  {LOCK_PATH}'" in script, name
        assert f"/code/env-{flavor}.lock {LOCK_PATH}" in script, name
        shas.setdefault(flavor, set()).add(sha)
    assert len(shas["cpu"]) == len(shas["gpu"]) == 1 and shas["cpu"] != shas["gpu"]


def test_no_credential_lands_in_rendered_or_recorded_files(cli: Cli, tmp_path: Path, home: Path) -> None:
    """Fake AWS credentials in the environment never reach user-data, node.json or the run record."""
    out = tmp_path / "rendered"
    cli("render", "--out", str(out), "--target", "aws", extra_env=FAKE_CREDS, check=True)
    cli("render", "--out", str(out / "local"), extra_env=FAKE_CREDS, check=True)
    # a real (short) local run records spec.lock, manifest, user-data, node.json, its environment's
    # lock, logs and the store
    result = cli(
        "deploy", "--workers", "1", "--steps", "20", "--set", "training.log_every=10", extra_env=FAKE_CREDS
    )
    assert result.returncode == 0, result.stdout + result.stderr
    files = [p for root in (out, home) for p in root.rglob("*") if p.is_file()]
    assert len(files) > 20
    assert any(p.name == "env-cpu.lock" for p in files), "the run's lock is among the files checked"
    secrets = [FAKE_CREDS[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret[:8]}… found in {path}"
    assert secrets[0] not in result.stdout + result.stderr


@pytest.mark.parametrize("variable", ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"])
def test_an_index_with_credentials_never_reaches_user_data(cli: Cli, tmp_path: Path, variable: str) -> None:
    """Booting nodes install from the index their user-data names: one whose URL carries credentials
    is refused before anything is resolved or rendered, and its secret is not echoed."""
    token = "t0kenForTestsOnly9"
    out = tmp_path / "out"
    url = f"https://builder:{token}@mirror.example/simple"
    result = cli("render", "--out", str(out), "--target", "aws", extra_env={variable: url})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "carries credentials, which would be written into every node's user-data" in result.stderr
    assert "https://***@mirror.example/simple" in result.stderr and "Traceback" not in result.stderr
    assert token not in result.stdout + result.stderr
    assert not out.exists()


def _served_install(
    tmp_path: Path, index: PackageIndex, environ: dict[str, str]
) -> tuple[Callable[[str, bytes], subprocess.CompletedProcess[str]], Lock, Path]:
    """install.sh of a node (chief-0, the cpu lock) whose spec names `index` as its private mirror,
    moved under tmp_path, and what it is run with; returns (run, lock, wheel): run(lock text, wheel
    bytes) serves those as the store's objects and runs the script."""
    index.publish("tinydep", "1.0", {"tinydep/__init__.py": "VERSION = '1.0'\n"})
    lock = Lock(f"tinydep==1.0 \\\n    --hash=sha256:{index.sha256('tinydep', '1.0')}\n", "cpu")
    # the run's wheel declares a dependency no index holds: only --no-deps installs it
    wheel = build_wheel(
        tmp_path / "built",
        "dlinfra",
        "0.1.0",
        {"dlinfra/__init__.py": "RUN = 'r-1'\n"},
        ["not-in-any-index>=1"],
    )
    spec = load_spec(
        None,
        Overrides(target="aws", workers=1, sets=[f"aws.pip_index_url={index.url}", "cluster.workers.gpus=0"]),
    )
    env = _environment(spec, {"cpu": lock})
    chief = env.locked(node_configs(spec, "r-1", STORE))["chief-0"]
    script = _script(render_user_data(chief, _boot(spec, env, wheel)))
    assert f"--index-url {index.url.rstrip('/')} --trusted-host 127.0.0.1:{index.port}" in script
    # one pass: a moved path is never moved again
    moved = r"/opt/dlinfra-wheel|/opt/dlinfra|/etc/dlinfra"
    script = re.sub(moved, lambda m: f"{tmp_path}{m[0]}", script)
    (tmp_path / "install.sh").write_text(script)
    for made in ("opt/dlinfra-wheel", "tmp", "served"):
        (tmp_path / made).mkdir(parents=True)
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "aws").write_text(
        "#!/bin/sh\n# stand-in for `aws s3 cp URI DEST`: the served file of the URI's name\n"
        f'echo "$3" >> "{tmp_path}/fetched"\ncp "{tmp_path}/served/${{3##*/}}" "$4"\n'
    )
    (stand_in / "aws").chmod(0o755)
    environ["PATH"] = f"{stand_in}:{environ['PATH']}"
    stages = itertools.count()

    def run(lock_text: str, wheel_bytes: bytes) -> subprocess.CompletedProcess[str]:
        (tmp_path / "served" / "env-cpu.lock").write_text(lock_text)
        (tmp_path / "served" / wheel.name).write_bytes(wheel_bytes)
        (tmp_path / "fetched").unlink(missing_ok=True)
        index.requests.clear()
        # a booting node's caches are empty: so are each run's
        cache = {"XDG_CACHE_HOME": str(tmp_path / f"cache-{next(stages)}"), "TMPDIR": str(tmp_path / "tmp")}
        return subprocess.run(
            ["sh", str(tmp_path / "install.sh")],
            env=environ | cache,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run, lock, wheel


def _clean_environ() -> dict[str, str]:
    """This machine's environment without its pip and uv settings (find-links, indexes, pip.conf)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV"))}
    environ |= {"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "UV_NO_CONFIG": "1"}
    environ["PIP_CONFIG_FILE"] = os.devnull
    return environ


def _distributions(venv: Path) -> dict[str, str]:
    if not (venv / "bin" / "python").exists():
        return {}
    listed = subprocess.run(
        [venv / "bin" / "python", "-c", "import importlib.metadata as m, json; "
         "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(listed.stdout)


@pytest.mark.parametrize("venv", ["base image", "baked image"])
def test_only_the_pinned_lock_and_wheel_are_ever_installed(
    tmp_path: Path, package_index: PackageIndex, venv: str
) -> None:
    """The install script itself, run on this machine with its paths moved under tmp, against a real
    index on loopback (tests/package_index.py) that the spec names as its private mirror. A lock whose
    bytes differ from the run's pin stops the script before the index is asked for anything; a lock
    file the index no longer serves as locked fails its hash check; a wheel off its pin stops the
    script before it is installed; the pinned bytes install exactly the lock, then the wheel without
    its dependencies. `base image`: no venv (the script makes it) and no uv in the lock: pip installs
    it. `baked image`: an image's venv, holding uv and a package of another lock, reused: uv syncs it
    to exactly this lock. `aws` is a stand-in for the S3 download (a copy of a local file)."""
    index = package_index
    environ = _clean_environ()
    venv_dir = tmp_path / "opt" / "dlinfra"
    run, lock, wheel = _served_install(tmp_path, index, environ)
    if venv == "baked image":  # made as the image recipe makes it, pip aside: uv never needs it
        index.publish("leftover", "1.0", {"leftover/__init__.py": ""})
        subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv_dir)], check=True, env=environ)
        uv = [find_uv_bin(), "pip", "install", "--quiet", "--python", str(venv_dir / "bin" / "python")]
        own_cache = environ | {"XDG_CACHE_HOME": str(tmp_path / "cache-image")}
        subprocess.run([*uv, "--index-url", index.url, "leftover==1.0"], check=True, env=own_cache)
        (venv_dir / "bin" / "uv").symlink_to(find_uv_bin())
    before = _distributions(venv_dir)
    good = wheel.read_bytes()
    lock_uri, wheel_uri = f"{STORE}/code/env-cpu.lock", f"{STORE}/code/{wheel.name}"

    def fetched() -> list[str]:
        return (tmp_path / "fetched").read_text().split()

    # a lock off its pin: refused before any install, before the index is asked for anything
    evil = lock.text + "evil==6.6.6 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    result = run(evil, good)
    assert result.returncode == 1, result.stdout + result.stderr
    pinned = f"does not match the sha256 the run pinned ({lock.sha256[:12]}): not installed"
    assert f"dlinfra: {tmp_path}/etc/dlinfra/env.lock {pinned}" in result.stderr, result.stderr
    assert fetched() == [lock_uri] and index.requests == []
    assert _distributions(venv_dir) == before and venv_dir.exists() == (venv == "baked image")

    # the run's lock, but the index now serves other bytes as tinydep 1.0: its hash is required
    index.publish("tinydep", "1.0", {"tinydep/__init__.py": "VERSION = 'swapped'\n"})
    result = run(lock.text, good)
    assert result.returncode != 0, result.stdout + result.stderr
    assert index.fetched("tinydep-1.0-py3-none-any.whl"), "the index was asked"
    swapped, locked = index.sha256("tinydep", "1.0"), lock.text.split("sha256:")[1].strip()
    assert swapped in result.stderr and locked in result.stderr, result.stderr  # expected vs got
    assert "tinydep" not in _distributions(venv_dir) and wheel_uri not in fetched()
    index.publish("tinydep", "1.0", {"tinydep/__init__.py": "VERSION = '1.0'\n"})  # the locked bytes
    assert index.sha256("tinydep", "1.0") in lock.text

    # the lock installs; a wheel off its pin is refused after it
    result = run(lock.text, good + b"tampered")
    assert result.returncode == 1, result.stdout + result.stderr
    wheel_sha = hashlib.sha256(good).hexdigest()[:12]
    assert f"dlinfra: {wheel.name} does not match the sha256 the run pinned ({wheel_sha})" in result.stderr
    assert fetched() == [lock_uri, wheel_uri]
    have = _distributions(venv_dir)
    assert have.get("tinydep") == "1.0" and "dlinfra" not in have, have

    # the pinned bytes: exactly the lock, then the wheel without its dependencies
    result = run(lock.text, good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dlinfra: no baked dlinfra image" in result.stdout and ": installing" in result.stdout
    have = _distributions(venv_dir)
    assert have.get("tinydep") == "1.0" and have.get("dlinfra") == "0.1.0", have
    assert "not-in-any-index" not in have and not index.fetched("/not-in-any-index/")
    site = next(venv_dir.glob("lib/python*/site-packages"))
    assert (site / "dlinfra" / "__init__.py").read_text() == "RUN = 'r-1'\n", "the served wheel's code"
    assert (tmp_path / "etc" / "dlinfra" / "env.lock").read_text() == lock.text, "kept for the agent"
    if venv == "baked image":  # uv synced the venv to exactly the lock (no pip: uv did it all)
        assert set(before) == {"leftover"} and set(have) == {"tinydep", "dlinfra"}, have
    else:  # no uv in the venv, nor in the lock: pip installed the lock
        assert not (venv_dir / "bin" / "uv").exists()


def test_an_image_holding_the_runs_lock_gets_only_the_runs_wheel(
    tmp_path: Path, package_index: PackageIndex
) -> None:
    """The install script for real, as above, on a baked image whose record holds this run's lock
    and another dlinfra wheel: the lock is not installed again (the index is never asked); the run's
    wheel, checked first, replaces the image's dlinfra, without dependencies. An image that keeps the
    lock it was baked from (image.lock, its sha256 this run's pin) is not sent it again."""
    index = package_index
    environ = _clean_environ()
    run, lock, wheel = _served_install(tmp_path, index, environ)
    venv_dir = tmp_path / "opt" / "dlinfra"
    baked = build_wheel(tmp_path / "baked", "dlinfra", "0.1.0", {"dlinfra/__init__.py": "RUN = None\n"})
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv_dir)], check=True, env=environ)
    uv = [find_uv_bin(), "pip", "install", "--quiet", "--python", str(venv_dir / "bin" / "python")]
    own_cache = environ | {"XDG_CACHE_HOME": str(tmp_path / "cache-image")}
    subprocess.run([*uv, "--index-url", index.url, "tinydep==1.0"], check=True, env=own_cache)
    subprocess.run([*uv, "--no-deps", str(baked)], check=True, env=own_cache)
    (venv_dir / "bin" / "uv").symlink_to(find_uv_bin())
    baked_sha = hashlib.sha256(baked.read_bytes()).hexdigest()
    record = {
        "dlinfra_version": "0.1.0",
        "flavor": "cpu",
        "wheel": baked.name,
        "wheel_sha256": baked_sha,
        "recipe_digest": "d" * 64,
        "builder": "local",
        "lock_sha256": lock.sha256,
    }
    (tmp_path / "etc" / "dlinfra").mkdir(parents=True)
    (tmp_path / "etc" / "dlinfra" / "image.json").write_text(json.dumps(record))
    site = next(venv_dir.glob("lib/python*/site-packages"))
    good = wheel.read_bytes()
    verdict = (
        f"dlinfra: the image holds this run's lock and bakes {baked.name} ({baked_sha[:12]}), "
        f"this run ships sha256:{hashlib.sha256(good).hexdigest()[:12]}: installing"
    )

    result = run(lock.text, good + b"tampered")  # the wheel off its pin: the image's dlinfra stays
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"dlinfra: {wheel.name} does not match the sha256 the run pinned" in result.stderr
    assert (site / "dlinfra" / "__init__.py").read_text() == "RUN = None\n"

    result = run(lock.text, good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict in result.stdout, result.stdout
    assert index.requests == [], "the lock is the image's already: nothing comes from the index"
    assert _distributions(venv_dir) == {"tinydep": "1.0", "dlinfra": "0.1.0"}
    assert (site / "dlinfra" / "__init__.py").read_text() == "RUN = 'r-1'\n", "the run's wheel's code"
    assert (tmp_path / "fetched").read_text().split() == [
        f"{STORE}/code/env-cpu.lock",
        f"{STORE}/code/{wheel.name}",
    ], "an image without its lock on disk (baked before images kept it): the store's copy"

    # the image keeps the lock it was baked from: nothing but the wheel comes from the store
    kept = tmp_path / "etc" / "dlinfra" / "image.lock"
    kept.write_text(lock.text)
    (tmp_path / "etc" / "dlinfra" / "env.lock").unlink()
    result = run(lock.text + "# the store's copy differs: it is not the one fetched\n", good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict in result.stdout, result.stdout
    assert (tmp_path / "fetched").read_text().split() == [f"{STORE}/code/{wheel.name}"]
    assert (tmp_path / "etc" / "dlinfra" / "env.lock").read_text() == lock.text, "kept for the agent"

    # an image lock that is not this run's is never taken for it: the store's copy, checked
    kept.write_text(lock.text + "# another lock\n")
    result = run(lock.text, good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "fetched").read_text().split()[0] == f"{STORE}/code/env-cpu.lock"
    assert (tmp_path / "etc" / "dlinfra" / "env.lock").read_text() == lock.text


def test_every_value_a_shell_reads_is_quoted_not_pasted() -> None:
    """Validation keeps such values out upstream; the template's quoting is the second wall."""
    hostile_wheel = 's3://results-bucket/code/dlinfra-0.1.0"; touch pwned; echo "-py3-none-any.whl'
    hostile_lock = "s3://results-bucket/code/env-cpu.lock'; touch pwned; echo '"
    hostile_index = "https://mirror.example/simple'; touch pwned; echo '"
    config = node_configs(load_spec(None, Overrides()), "run-1", "s3://results-bucket/r")["chief-0"]
    install = Install(
        source=hostile_wheel,
        wheel_sha256="ab" * 32,
        index_url=hostile_index,
        locks={"cpu": (hostile_lock, "cd" * 32)},
        extra_index=(hostile_index,),
    )
    script = _script(render_user_data(config, install))
    fetches = [shlex.split(line) for line in _lines(script) if line.startswith("aws s3 cp ")]
    assert fetches == [
        ["aws", "s3", "cp", hostile_lock, LOCK_PATH],
        ["aws", "s3", "cp", hostile_wheel, "/opt/dlinfra-wheel/"],
    ]
    installers = [shlex.split(line.split(" || ")[0]) for line in _installers(script)]
    assert len(installers) == 5
    for words in installers:
        for i, word in enumerate(words):
            if word in ("--index-url", "--extra-index-url"):
                assert words[i + 1] == hostile_index, words
    wheel_installs = [words for words in installers if words[-1].startswith("/opt/dlinfra-wheel/")]
    assert len(wheel_installs) == 2
    for words in wheel_installs:
        assert words[-1] == "/opt/dlinfra-wheel/" + hostile_wheel.rsplit("/", 1)[-1]
        assert "touch pwned" in words[-1], "the hostile tail stays inside one argument"

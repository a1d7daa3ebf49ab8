"""Shared fixtures: a private DLINFRA_HOME, the real CLI as a subprocess, a moto S3/EC2/IAM server,
a terraform CLI config that installs the AWS provider offline."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support import PROVIDER_MIRROR, Cli, run_cli


def _machine_has_a_gpu() -> bool:
    """Cheap and without TensorFlow: an NVIDIA driver that lists at least one GPU."""
    if shutil.which("nvidia-smi") is None:
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    return listed.returncode == 0 and "GPU" in listed.stdout


# Longest modules first (scripts/test.sh hands whole modules to the workers: a long one started last
# would leave one worker idle at the end). A rank per marker; a module takes its slowest test's.
_FIRST = ("images", "vm", "terraform", "faults", "e2e", "slow")


def _longest_modules_first(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, m in enumerate(_FIRST) if item.get_closest_marker(m)), len(_FIRST))

    modules: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        modules[module] = min(modules.get(module, len(_FIRST)), rank(item))
    order = {module: i for i, module in enumerate(modules)}
    # stable, and each module stays contiguous (its module fixtures are set up once)
    items.sort(key=lambda item: (modules[m := item.nodeid.split("::", 1)[0]], order[m]))


# A VM boot, an image bake or a test that needs the machine to itself costs minutes of both cores:
# the default tier (docs/tests.md) cannot hold one, so each must say it belongs to the slow tier.
_SLOW_TIER_ONLY = ("vm", "images", "exclusive")


def _slow_tier_marked(items: list[pytest.Item]) -> None:
    strays = [
        item.nodeid
        for item in items
        if any(item.get_closest_marker(m) for m in _SLOW_TIER_ONLY) and not item.get_closest_marker("full")
    ]
    if strays:
        raise pytest.UsageError(
            f"marked {'/'.join(_SLOW_TIER_ONLY)} but not `full` (the slow tier): {', '.join(strays)}. "
            "Fix: add pytest.mark.full to them"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first; a test of a VM, an image or the whole machine is in the slow tier. `gpu`
    tests run where a GPU is, or when asked for by marker; elsewhere they are deselected (counted in
    pytest's summary line), never skipped silently."""
    _slow_tier_marked(items)
    _longest_modules_first(items)
    wanted = "gpu" in (config.getoption("markexpr") or "")
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests or wanted or _machine_has_a_gpu():
        return
    config.hook.pytest_deselected(items=gpu_tests)
    items[:] = [item for item in items if not item.get_closest_marker("gpu")]
    config.stash[_GPU_DESELECTED] = len(gpu_tests)


_GPU_DESELECTED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if count := config.stash.get(_GPU_DESELECTED, 0):
        terminalreporter.write_line(
            f"{count} gpu test(s) deselected: no GPU on this machine (docs/gpus.md: run them with -m gpu)"
        )


_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _cpu_account() -> Callable[[], float] | None:
    """This pytest process (and everything it starts from now on) in a cpuacct cgroup of its own,
    read in seconds; None where no cpuacct hierarchy can be written (not root, cgroup v2 only).
    Processes of a test that outlive their parent (a deploy's detached nodes, emulated instances)
    stay in the group: reaped-children accounting missed them."""
    if not (_CPUACCT / "cpuacct.usage").exists() or not os.access(_CPUACCT, os.W_OK):
        return None
    group = _CPUACCT / f"dlinfra-test-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    usage = group / "cpuacct.usage"
    return lambda: int(usage.read_text()) / 1e9


_CPU_ACCOUNT = pytest.StashKey[Callable[[], float] | None]()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The account's cgroup goes with the session (kept while a process of a test is still in it)."""
    if config.stash.get(_CPU_ACCOUNT, None) is None:
        return
    with contextlib.suppress(OSError):
        (_CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        (_CPUACCT / f"dlinfra-test-{os.getpid()}").rmdir()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With DLINFRA_TEST_CPU=FILE, each test's wall and CPU seconds appended to FILE: the suite is
    CPU-bound on two cores, so CPU, not wall time, says which tests to make cheaper
    (`sort -t$'\\t' -k3 -g FILE`). CPU is that of everything the test ran (its nodes, terraform,
    qemu, this process's moto threads), from a cpuacct cgroup per pytest process where one can be
    made, else this process's and its reaped children's; the fourth column is pytest's own."""
    log = os.environ.get("DLINFRA_TEST_CPU")
    if not log:
        yield
        return
    stash = item.config.stash
    if _CPU_ACCOUNT not in stash:
        stash[_CPU_ACCOUNT] = _cpu_account()
    account = stash[_CPU_ACCOUNT]
    before, began = os.times(), time.monotonic()
    start = account() if account else 0.0
    yield
    after = os.times()
    # else: user, system, children's user and system
    cpu = account() - start if account else sum(after[:4]) - sum(before[:4])
    own = sum(after[:2]) - sum(before[:2])
    with open(log, "a") as out:
        out.write(f"{item.nodeid}\t{time.monotonic() - began:.1f}\t{cpu:.1f}\t{own:.1f}\n")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "dlinfra-home"
    monkeypatch.setenv("DLINFRA_HOME", str(path))
    return path


@pytest.fixture
def cli(home: Path, tmp_path: Path) -> Cli:
    """The real `dlinfra` in a subprocess, with this test's DLINFRA_HOME."""

    def call(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, DLINFRA_HOME=str(home), **kwargs.pop("extra_env", {}))  # type: ignore[arg-type]
        return run_cli(*args, env=env, cwd=kwargs.pop("cwd", tmp_path), **kwargs)  # type: ignore[arg-type]

    return call


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real moto server (S3, EC2, IAM, STS, SSM over HTTP) on a loopback port."""
    from moto.server import ThreadedMotoServer

    # port 0: the kernel picks a free port and it is bound at once (no window for another worker)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def tf_cli_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CLI config: providers from the local mirror (when present) plus a shared plugin cache."""
    if shutil.which("terraform") is None:
        pytest.fail(
            "terraform is not on PATH: install terraform >= 1.7 (or deselect with -m 'not terraform')"
        )
    root = tmp_path_factory.mktemp("terraform-cli")
    cache = root / "plugin-cache"
    cache.mkdir()
    lines = [f'plugin_cache_dir = "{cache}"']
    if PROVIDER_MIRROR.is_dir():
        lines += [
            "provider_installation {",
            f'  filesystem_mirror {{ path = "{PROVIDER_MIRROR}" }}',
            "}",
        ]
    config = root / "terraform.tfrc"
    config.write_text("\n".join(lines) + "\n")
    return config

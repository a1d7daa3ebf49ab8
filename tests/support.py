"""Test helpers shared by every test module (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# Fake credentials for the emulator; tests also check these values never land in any file.
FAKE_CREDS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKETESTING00001",
    "AWS_SECRET_ACCESS_KEY": "fakeSecretForTestsOnly/dlinfra0000000000000",
    "AWS_SESSION_TOKEN": "fakeSessionTokenForTestsOnly-dlinfra-123456789",
    "AWS_DEFAULT_REGION": "us-east-1",
}

# Where this machine keeps the AWS provider for offline `terraform init` (a test setting only).
PROVIDER_MIRROR = Path(os.environ.get("DLINFRA_TF_PROVIDER_MIRROR", "/opt/tf-plugins"))

Cli = Callable[..., subprocess.CompletedProcess[str]]


def cli_process(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[str]:
    """The CLI started and left running (read it with communicate()): what two terminals racing are."""
    return subprocess.Popen(
        [sys.executable, "-m", "dlinfra", *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 900,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "dlinfra", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"dlinfra {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


REPO = Path(__file__).resolve().parents[1]
# Node images for the VM tests: built once per checkout (a few minutes) and reused while the recipe,
# packages and wheel are the same.
IMAGE_CACHE = REPO / ".dlinfra" / "test-images"


def s3_client(endpoint: str):
    return aws_client(endpoint, "s3")


def ec2_client(endpoint: str, region: str = "us-east-1"):
    return aws_client(endpoint, "ec2", region)


@functools.cache  # a client costs 20 ms of CPU to make: tests that poll reuse one
def aws_client(endpoint: str, service: str, region: str = "us-east-1"):
    import boto3

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=FAKE_CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDS["AWS_SECRET_ACCESS_KEY"],
    )


def alive_node_pids(marker: str) -> list[int]:
    """PIDs of running node processes (`dlinfra node run`, the beacon, and `dlinfra node train`, its
    trainer) whose command line mentions `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split()[2]
        except OSError:
            continue
        if ("dlinfra node run" in cmd or "dlinfra node train" in cmd) and marker in cmd and state != "Z":
            found.append(int(proc.name))
    return found


def addresses(spec, target: str | None = None):
    """The address plan the spec's target (or `target`) would use."""
    from dlinfra.targets import target_for

    return target_for(target or spec.target).addresses(spec)


def node_configs(spec, run_id: str, url: str, target: str | None = None, code=None):
    """Every node's config, as the spec's target (or `target`) would prepare them, storing to `url`."""
    from dlinfra.render import build_node_configs
    from dlinfra.targets import target_for

    chosen = target_for(target or spec.target)
    return build_node_configs(
        spec,
        run_id,
        store_config(spec, url),
        chosen.addresses(spec),
        code,
        typed=chosen.uses_instance_types,
    )


def store_config(spec, url: str):
    from dlinfra.contract import StoreConfig

    return StoreConfig.for_run(spec, url)


BASE_EXPERIMENT = """\
name: review-demo
target: aws
cluster:
  workers:
    count: 3
    instance_type: c5.xlarge
    gpus: 0
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def review_repo(repo: Path) -> tuple[str, str]:
    """An experiment repository: a base commit (3 c5.xlarge workers) and a pull request's commit
    (5 c5.2xlarge workers). Returns (base sha, head sha); HEAD is the pull request."""
    (repo / "experiments").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    (repo / "experiments" / "demo.yaml").write_text(BASE_EXPERIMENT)
    (repo / "experiments" / "notes.yaml").write_text("owner: someone\n")  # YAML, not an experiment
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "-b", "pr")
    changed = BASE_EXPERIMENT.replace("count: 3", "count: 5").replace("c5.xlarge", "c5.2xlarge")
    (repo / "experiments" / "demo.yaml").write_text(changed)
    (repo / "experiments" / "notes.yaml").write_text("owner: someone else\n")
    git(repo, "commit", "-q", "-am", "more and bigger workers")
    return base, git(repo, "rev-parse", "HEAD").strip()


def assert_valid_workflow(path: Path) -> None:
    """GitHub's own workflow schema (check-jsonschema's vendored copy: no network)."""
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def assert_valid_cloud_config(text: str, path: Path) -> None:
    """Debian's cloud-init schema validator passes `text` (written to `path`)."""
    import shutil

    cloud_init = shutil.which("cloud-init")
    assert cloud_init, "cloud-init must be installed (the README's test command installs it)"
    path.write_text(text)
    checked = subprocess.run(
        [cloud_init, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0 and "Valid" in checked.stdout, checked.stdout + checked.stderr


def fixed_locks():
    """A lock per flavor, fixed, for tests of what prepare renders rather than of resolution (which
    tests/test_environment.py runs for real against an index): one hash-pinned package each."""
    from dlinfra.environment.lock import Lock

    pinned = "numpy==2.1.0 \\\n    --hash=sha256:" + "ab" * 32 + "\n"
    return {"cpu": Lock(pinned, "cpu"), "gpu": Lock(pinned.replace("numpy", "nvidia-nccl-cu12"), "gpu")}


def host_address() -> str:
    """This machine's own address on its network (not loopback): reachable from here and from a qemu
    guest alike (user-mode networking makes a guest's connections from the host's own sockets), so
    one index URL serves the resolution here and the install in a VM."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("198.51.100.1", 9))  # a documentation address: routes, sends nothing
        address = probe.getsockname()[0]
    assert not address.startswith("127."), f"no address beside loopback ({address})"
    return address


def prepare_aws_review(spec, **options):
    """`prepare` of an aws run as `plan --no-upload` makes it (nothing stored), with fixed locks:
    for tests of what it renders and derives, not of resolution."""
    from dlinfra.prepare import NodeInstall, prepare
    from dlinfra.targets import target_for

    target = target_for("aws")
    return prepare(
        spec,
        target.addresses(spec),
        NodeInstall("dlinfra==0.0.0"),
        locks=fixed_locks(),
        typed=True,
        upload=False,
        **options,
    )


def staging_node(role: str, index: int, training, results: Path, data_url: str, workers: int = 3):
    """A parameter-server node's config for tests of what it stages (no cluster runs): results go
    to `results`, data comes from `data_url`."""
    from dlinfra.contract import NodeConfig, StoreConfig

    peers = {"chief": ["h:1"], "worker": [f"h:{2 + i}" for i in range(workers)], "ps": ["h:9"]}
    return NodeConfig(
        run_id="r",
        role=role,
        index=index,
        strategy="parameter_server",
        cluster=peers,
        store=StoreConfig(url=f"file://{results}"),
        training=training,
        data=StoreConfig(url=data_url),
        startup_timeout=60,
        heartbeat_interval=1,
        max_runtime=60,
    )


def digits_source():
    """scikit-learn's digits as a source to pack, PNG-encoded as each shard is written."""
    from dlinfra.training import data, shards

    arrays = data.load(data.DatasetSpec(), Path("/nonexistent"))  # digits ship with scikit-learn
    return shards.array_source("digits", arrays.x_train, arrays.y_train, arrays.x_test, arrays.y_test, "png")


def pack_digits(root: Path, train_shards: int, eval_shards: int):
    """digits packed into shards at `root` (a file:// store); returns the manifest."""
    from dlinfra.runs.store_url import open_store
    from dlinfra.training import shards

    return shards.pack(digits_source(), open_store(f"file://{root}"), train_shards, eval_shards)


def cgroup_cpu_limit(required: bool = True):
    """A context manager factory `limit(pid, cpus)` that holds process `pid` (all its threads, and
    the children it starts afterwards) to `cpus` CPUs with the kernel's cgroup cpu controller (v1 or
    v2; needs root), moving it back out at the end. Where no cpu controller can be written (not
    root, no cgroup fs) it skips the test, or, not `required`, limits nothing."""
    import uuid

    import pytest

    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        root = v1
    elif "cpu" in _read(v2 / "cgroup.controllers").split() and os.access(v2, os.W_OK):
        root = v2
    elif required:
        pytest.skip("no writable cgroup cpu controller (the test throttles a node's CPU: run as root)")
    else:
        return lambda pid, cpus: contextlib.nullcontext()

    @contextlib.contextmanager
    def limit(pid: int, cpus: float):
        group = root / f"dlinfra-test-{uuid.uuid4().hex[:8]}"
        group.mkdir()
        period = 100_000
        try:  # the group goes also when the process was gone before it could be moved in
            if root is v1:
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
            else:
                (group / "cpu.max").write_text(f"{int(cpus * period)} {period}")
            (group / "cgroup.procs").write_text(str(pid))
            yield group
        finally:
            with contextlib.suppress(OSError):  # gone with its run
                (root / "cgroup.procs").write_text(str(pid))
            with contextlib.suppress(OSError):
                group.rmdir()

    return limit


def favour(pid: int | None, nice: int = -10) -> None:
    """Give process `pid`'s autogroup (its session's processes) `nice`: with the kernel's autogroups
    on, CPU is shared between sessions first, whatever each process's own nice (a VM's qemu is a
    session of its own; a run's nodes share their CLI's). Without root or autogroups it changes
    nothing."""
    if pid is not None:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cifar_tarball(path: Path, per_batch: int, test: int, images: Callable) -> Path:
    """A tarball in CIFAR-10's own 'python version' layout: five data batches of `per_batch` images
    and a test batch of `test`, each made by `images(n)` → (uint8 rows of 3072, channel planes
    first; their labels)."""
    import io
    import pickle
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", test)]:
            rows, labels = images(n)
            blob = pickle.dumps({b"data": rows, b"labels": [int(label) for label in labels]})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


DEVICE_FIGURES = {"gemm_gflops": "gemm", "conv_gflops": "conv"}


def device_flags(verdict: dict, node: str, min_ratio: float) -> list[dict]:
    """The throttled `node`'s device flags (gemm, conv or both), each below `min_ratio` of its
    peers. Which of the two falls under a CPU quota depends on the load: a gemm short enough to fit
    in the quota's slice of a CFS period can read above it while the conv reads a tenth (seen in CI:
    the local preflight test's conv at 0.09 with its gemm unflagged; the VM test's worker-1 flagged,
    but not for gemm)."""
    flags = [f for f in verdict["flagged"] if f["node"] == node and f["figure"] in DEVICE_FIGURES]
    assert flags, verdict["flagged"]
    for flag in flags:
        assert flag["against"] == "peers" and flag["ratio"] < min_ratio, flag
    return flags


def digits_beside(project: Path) -> None:
    """Where TensorFlow's guides download MNIST: small real data of the same kind beside the script
    (scikit-learn's 8x8 digits, 1,400 to train on and the rest held out)."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    np.savez(
        project / "digits.npz",
        x_train=d.images[:1400],
        y_train=d.target[:1400],
        x_test=d.images[1400:],
        y_test=d.target[1400:],
    )


def mnist_beside(project: Path) -> None:
    """An MNIST-shaped stand-in, in keras' mnist.npz layout, beside a guide that reads one: uint8
    28x28 images in [0, 255] (the 8x8 digits scaled 3x, padded by 2, 0..16 to 0..255), int labels.
    The training split is the 1,400 digits tiled 7 times: the custom-loop guide's dataset does not
    repeat, and 2 workers take 70 steps of 64 from it each epoch."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    big = np.pad(np.kron(d.images, np.ones((1, 3, 3))), ((0, 0), (2, 2), (2, 2)))
    images = np.round(big * (255 / 16)).clip(0, 255).astype(np.uint8)
    labels = d.target.astype(np.uint8)
    np.savez_compressed(
        project / "mnist.npz",
        x_train=np.tile(images[:1400], (7, 1, 1)),
        y_train=np.tile(labels[:1400], 7),
        x_test=images[1400:],
        y_test=labels[1400:],
    )


def fresh_process_accuracy(model_dir: str) -> float:
    """Load an exported SavedModel in a new plain-TensorFlow process and score the built-in example's
    held-out split (the e2e tests, and bench_chaos's check of a DONE model)."""
    import textwrap

    code = textwrap.dedent(
        """
        import sys, numpy as np, tensorflow as tf
        from dlinfra.spec.dataset import DatasetSpec
        from dlinfra.training.data import load
        data = load(DatasetSpec(), None)
        model = tf.saved_model.load(sys.argv[1])
        logits = model.serve(tf.constant(data.x_test))
        print(float(np.mean(np.argmax(logits.numpy(), axis=1) == data.y_test)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, model_dir], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip().splitlines()[-1])

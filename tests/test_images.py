"""Node images without booting anything: the recipe and its digest, the boot-time decision to install
nothing (the install script's own code, run here against image records), the emulated platform's
vendor-data, the VMs' networks, the private-mirror settings, and each role's AMI choice against moto."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dlinfra.environment.lock import Index, Lock
from dlinfra.errors import SpecError
from dlinfra.images import IMAGE_JSON_PATH, Recipe
from dlinfra.images.vm import Segment, nat_network, shell
from dlinfra.images.wheelhouse import _write_index, serve
from dlinfra.prepare import Environment, NodeInstall, boot_install, release_requirement
from dlinfra.render import render_cluster
from dlinfra.runs.manifest import ImagePin
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.targets.aws import amis
from dlinfra.targets.aws.vms import vendor_data
from support import FAKE_CREDS, Cli, ec2_client, fixed_locks, node_configs

LOCKS = fixed_locks()


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    path = tmp_path / "dlinfra-0.1.0-py3-none-any.whl"
    path.write_bytes(b"not really a wheel, but bytes with a digest")
    return path


def test_recipe_digest_names_what_goes_into_the_image(wheel: Path, tmp_path: Path) -> None:
    cpu, gpu = Recipe("cpu", wheel, LOCKS["cpu"]), Recipe("gpu", wheel, LOCKS["gpu"])
    assert cpu.digest == Recipe("cpu", wheel, LOCKS["cpu"]).digest
    assert cpu.digest != gpu.digest
    other = tmp_path / "other" / wheel.name
    other.parent.mkdir()
    other.write_bytes(b"another build")
    assert Recipe("cpu", other, LOCKS["cpu"]).digest != cpu.digest
    # another lock (a run's own requirements) is another environment, on the same wheel
    relocked = Lock(LOCKS["cpu"].text + "six==1.16.0 \\\n    --hash=sha256:" + "cd" * 32 + "\n", "cpu")
    assert Recipe("cpu", wheel, relocked).digest != cpu.digest
    # where pip fetches from does not change what the image holds
    local = cpu.render("/tmp/w.whl", "/tmp/env.lock", "--no-index --find-links /tmp/wh", "local")
    aws = cpu.render("/opt/w.whl", "/opt/env.lock", "--index-url https://mirror.example/simple", "aws")
    assert local != aws
    for script in (local, aws):
        assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    record = json.loads(re.search(r"json.loads\('(.*)'\)", local).group(1))
    assert record["wheel_sha256"] == cpu.wheel_sha256 and record["recipe_digest"] == cpu.digest
    assert record["lock_sha256"] == LOCKS["cpu"].sha256 and record["flavor"] == "cpu"
    gpu_record = json.loads(re.search(r"json.loads\('(.*)'\)", gpu.render("/w", "/l", "", "aws")).group(1))
    assert gpu_record["lock_sha256"] == LOCKS["gpu"].sha256 and gpu_record["flavor"] == "gpu"
    # exactly the lock, hashes required, from where pip is told; then the wheel, without dependencies
    joined = local.replace("\\\n", " ").splitlines()
    steps = [" ".join(step.split()) for step in joined if '"$venv/bin/pip" install' in step]
    assert steps == [  # the venv's only installs
        '"$venv/bin/pip" install --quiet --no-cache-dir --no-deps --require-hashes '
        '--disable-pip-version-check --no-index --find-links /tmp/wh -r "/tmp/env.lock"',
        '"$venv/bin/pip" install --quiet --no-cache-dir --no-deps --disable-pip-version-check "/tmp/w.whl"',
    ]
    assert "[train" not in local, "no extras resolved at build: the lock holds the flavor's TensorFlow"
    assert "terraform" not in local


def test_the_controller_recipe_carries_terraform_and_the_providers_and_its_digest_names_them(
    wheel: Path,
) -> None:
    lock = Lock(LOCKS["cpu"].text, "controller")
    tooled = Recipe("controller", wheel, lock, tools="a" * 64)
    assert tooled.digest != Recipe("controller", wheel, lock, tools="b" * 64).digest  # another terraform
    assert tooled.digest != Recipe("controller", wheel, lock).digest
    with pytest.raises(ValueError, match="tools"):
        tooled.render("/w.whl", "/env.lock", "", "local")  # its tools must be staged somewhere
    script = tooled.render("/w.whl", "/env.lock", "", "local", "/tmp/tools")
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    # where terraform looks with no CLI config: one of its implied local mirror directories
    assert 'install -m 0755 "/tmp/tools/terraform" "/usr/local/bin/terraform"' in script
    assert 'cp -a "/tmp/tools/plugins/." "/usr/local/share/terraform/plugins/"' in script
    record = json.loads(re.search(r"json.loads\('(.*)'\)", script).group(1))
    assert record["flavor"] == "controller" and record["recipe_digest"] == tooled.digest


def _install_check(gpus: int, want_sha: str | None, tmp_path: Path) -> str:
    """The image check of a rendered install script, pointed at a record under tmp_path. The node
    runs the fixed lock of its flavor; `want_sha`: the run's wheel (None: the release, in the lock)."""
    spec = load_spec(None, Overrides(target="aws", workers=1, sets=[f"cluster.workers.gpus={gpus}"]))
    env = Environment(LOCKS, Index())
    configs = env.locked(node_configs(spec, "r-1", "s3://bucket/runs/r-1"))
    wheel = None
    if want_sha:
        wheel = tmp_path / "wheels" / want_sha[:8] / "dlinfra-0.1.0-py3-none-any.whl"
        wheel.parent.mkdir(parents=True, exist_ok=True)
        wheel.write_bytes(want_sha.encode())  # bytes whose digest is the wheel's pin
    install = boot_install(
        spec, NodeInstall(release_requirement(), wheel), lambda name: f"s3://bucket/runs/r-1/code/{name}", env
    )
    assert install is not None
    doc = yaml.safe_load(render_cluster(configs, install)["worker-0"])
    script = next(f["content"] for f in doc["write_files"] if f["path"].endswith("install.sh"))
    # the check alone: what comes before it (fetching the lock, its sha256) needs the store
    node = configs["worker-0"]
    asks = f" {install.want} {node.flavor} {node.lock_sha256} <<'PY'"
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith(asks))
    end = lines.index("PY", start)
    assert lines[end + 1] == ") && verdict=0 || verdict=$?"
    check = tmp_path / "check.sh"
    check.write_text(
        "\n".join(lines[start : end + 2]).replace(IMAGE_JSON_PATH, str(tmp_path / "image.json"))
        + '\necho "$verdict: $why"\n'
    )
    code, why = (
        subprocess.run(["sh", str(check)], capture_output=True, text=True, check=True)
        .stdout.strip()
        .split(": ", 1)
    )
    return f"{VERDICTS[code]}: {why}"


# install.sh's verdicts on an image: nothing to install, only the run's wheel, the lock (and the wheel)
VERDICTS = {"0": "BAKED", "3": "WHEEL", "1": "INSTALL"}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _record(tmp_path: Path, text: str, flavor: str = "cpu", lock_sha256: str | None = "fixed") -> None:
    """An image record baking the wheel whose bytes are `text`, with the fixed lock of `flavor` (or
    `lock_sha256`; None: an image older than locks, which records none)."""
    record = {
        "dlinfra_version": "0.1.0",
        "flavor": flavor,
        "wheel": "dlinfra-0.1.0-py3-none-any.whl",
        "wheel_sha256": _sha(text),
        "recipe_digest": "d" * 64,
        "builder": "local",
        "tensorflow": "tensorflow-cpu 2.21.0",
    }
    if lock_sha256 is not None:
        record["lock_sha256"] = LOCKS[flavor].sha256 if lock_sha256 == "fixed" else lock_sha256
    (tmp_path / "image.json").write_text(json.dumps(record))


def test_boot_installs_nothing_only_when_the_image_bakes_this_very_wheel_and_lock(tmp_path: Path) -> None:
    a, b = "a" * 64, "b" * 64  # the bytes of two wheels
    assert _install_check(0, a, tmp_path).startswith("INSTALL: no baked dlinfra image")
    _record(tmp_path, a)
    baked = f"BAKED: the image ({'d' * 12}) bakes this run's dlinfra and lock"
    assert _install_check(0, a, tmp_path) == baked
    # this run's lock, another wheel: only the run's wheel is installed, the lock is there already
    assert _install_check(0, b, tmp_path) == (
        f"WHEEL: the image holds this run's lock and bakes dlinfra-0.1.0-py3-none-any.whl "
        f"({_sha(a)[:12]}), this run ships sha256:{_sha(b)[:12]}"
    )
    # the very wheel, but another lock (say, a run with its own requirements): the lock is installed
    _record(tmp_path, a, lock_sha256="e" * 64)
    assert _install_check(0, a, tmp_path) == (
        f"INSTALL: the image's lock ({'e' * 12}) is not this run's ({LOCKS['cpu'].sha256[:12]})"
    )
    assert _install_check(0, b, tmp_path).startswith("INSTALL: the image's lock"), "neither matches"
    _record(tmp_path, a, lock_sha256=None)  # an image baked before locks
    assert _install_check(0, a, tmp_path) == (
        f"INSTALL: the image's lock (none) is not this run's ({LOCKS['cpu'].sha256[:12]})"
    )
    # a GPU node needs the GPU build: a CPU image does not do, a GPU image (with the gpu lock) does
    _record(tmp_path, a)
    assert _install_check(1, a, tmp_path) == (
        "INSTALL: the image has the cpu build of TensorFlow; this node trains on GPUs"
    )
    _record(tmp_path, a, flavor="gpu")
    assert _install_check(1, a, tmp_path) == baked
    _record(tmp_path, a, flavor="gpu", lock_sha256=LOCKS["cpu"].sha256)  # a GPU image, the cpu lock
    assert _install_check(1, a, tmp_path).startswith("INSTALL: the image's lock")
    # a release pin matches the image's version, with the image's lock the node's
    _record(tmp_path, a)
    assert _install_check(0, None, tmp_path) == baked


def test_vendor_data_supplies_the_platform_and_never_the_hosts_credentials() -> None:
    script = vendor_data("us-east-1", "http://127.0.0.1:5000", "10.0.2.2")
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    assert "endpoint_url = http://127.0.0.1:5000" in script
    assert "ListenStream=127.0.0.1:5000" in script and "systemd-socket-proxyd 10.0.2.2:5000" in script
    assert not any(value in script for value in FAKE_CREDS.values() if len(value) > 12)
    remote = vendor_data("us-east-1", "http://10.9.8.7:4566", "10.0.2.2")
    assert "endpoint_url = http://10.9.8.7:4566" in remote and "socket-proxyd" not in remote


def test_vm_networks_never_overlap_the_vpc_and_runs_never_share_a_segment() -> None:
    assert nat_network("10.42.0.0/16") == ipaddress.IPv4Network("10.0.2.0/24")
    assert not nat_network("10.0.0.0/8").overlaps(ipaddress.IPv4Network("10.0.0.0/8"))
    a = Segment.for_run("digits-cnn-20261123-082822-dddf", "10.42.1.0/24")
    b = Segment.for_run("digits-cnn-20261123-082822-ddde", "10.42.1.0/24")
    assert (a.group, a.port) != (b.group, b.port)
    assert ipaddress.IPv4Address(a.group).is_multicast


@contextlib.contextmanager
def _serial_console(tmp_path: Path) -> Iterator[Path]:
    """What qemu's second serial port holds: a real interactive bash on a real tty, behind a unix
    socket (output is dropped while no one is connected, as qemu's socket chardev does)."""
    pid, master = pty.fork()
    if pid == 0:
        os.execvpe(
            "bash", ["bash", "--norc", "--noprofile", "-i"], {"PS1": "root@worker-0:~# ", "TERM": "vt100"}
        )
    sock_path = tmp_path / "shell.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(1)
    stop = threading.Event()

    def relay() -> None:
        while not stop.is_set():
            server.settimeout(0.2)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            # a client that leaves (even mid-output: a reset) only ends its connection, not the console
            with conn, contextlib.suppress(OSError):
                while not stop.is_set():
                    ready, _, _ = select.select([conn, master], [], [], 0.2)
                    if conn in ready:
                        data = conn.recv(4096)
                        if not data:
                            break
                        os.write(master, data)
                    if master in ready:
                        conn.sendall(os.read(master, 4096))

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        yield sock_path
    finally:
        stop.set()
        thread.join()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(master)
        server.close()


def test_vm_shell_returns_only_the_commands_output_though_the_tty_echoes_typeahead(tmp_path: Path) -> None:
    """A command that reaches the shell while it is still busy is echoed twice (the tty's echo of
    typeahead, then readline's redraw); the answer is still the command's output alone."""
    with _serial_console(tmp_path) as sock:
        assert shell(sock, "echo $((6 * 7))") == "42"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as busy:
            busy.connect(str(sock))
            busy.sendall(b"sleep 2\n")
        # typed while `sleep` runs, as a test types while the node's agent keeps the VM busy
        assert shell(sock, "echo restarts; echo $((1 + 1))") == "restarts\r\n2"
        assert shell(sock, "false") == ""


def test_wheelhouse_index_is_pep503_and_served_on_loopback(tmp_path: Path) -> None:
    (tmp_path / "Some_Project-1.0-py3-none-any.whl").write_bytes(b"wheel")
    _write_index(tmp_path)
    page = (tmp_path / "simple" / "some-project" / "index.html").read_text()
    assert "../../Some_Project-1.0-py3-none-any.whl#sha256=" in page
    with serve(tmp_path) as port:
        import urllib.request

        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/simple/some-project/").read().decode()
        assert body == page


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("aws.pip_index_url=https://user:token@mirror.example/simple", "looks like a credential"),
        ("aws.pip_index_url=ftp://mirror.example", "must be an http(s) URL"),
        ("aws.pip_extra_ca=not a certificate", "must be PEM text with its line breaks"),
        ("aws.image=newest", "aws.image"),
    ],
)
def test_private_mirror_and_image_settings_refuse_bad_input(cli: Cli, setting: str, message: str) -> None:
    result = cli("validate", "--target", "aws", "--set", setting)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_private_key_is_refused_as_an_extra_ca(tmp_path: Path) -> None:
    key = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({"target": "aws", "aws": {"pip_extra_ca": key}}))
    with pytest.raises(SpecError, match="holds a private key"):
        load_spec(tmp_path / "e.yaml")


def test_each_role_boots_a_baked_ami_or_the_base_one(moto_endpoint: str) -> None:
    # moto keeps one state per process, and tests/infra bakes AMIs in it: a region of our own has none
    ec2 = ec2_client(moto_endpoint, region="ca-central-1")
    flavors = {"chief": "cpu", "worker": "gpu"}
    spec = load_spec(None, Overrides(target="aws"))
    assert amis.choose(spec, flavors, ec2, {}) == {"chief": None, "worker": None}
    with pytest.raises(SpecError, match=r"aws\.image: baked, and no cpu AMI is baked"):
        amis.choose(load_spec(None, Overrides(target="aws", sets=["aws.image=baked"])), flavors, ec2, {})
    with pytest.raises(SpecError, match=r"aws\.egress: none, and chief, worker would install TensorFlow"):
        amis.choose(load_spec(None, Overrides(target="aws", sets=["aws.egress=none"])), flavors, ec2, {})
    # a rerun boots what the original booted
    pinned = {"chief": ImagePin(id="ami-0123456789abcdef0", digest="e" * 64, dlinfra_version="0.1.0")}
    assert amis.choose(spec, flavors, ec2, pinned)["chief"] == pinned["chief"]
    assert "chief: ami-0123456789abcdef0 (baked" in amis.describe(amis.choose(spec, flavors, ec2, pinned))


def test_a_baked_pin_without_its_recipe_digest_is_described_not_a_type_error() -> None:
    """ImagePin.digest is optional (a record without it); describe indexed it (found by mypy)."""
    pin = ImagePin(id="ami-0123456789abcdef0", digest=None, dlinfra_version="0.1.0")
    described = amis.describe({"worker": pin, "chief": None}, base_ami="ami-0fedcba9876543210")
    assert "worker: ami-0123456789abcdef0 (baked, dlinfra 0.1.0, recipe unrecorded)" in described
    assert "chief: base AMI ami-0fedcba9876543210, installs dlinfra" in described


def test_image_build_refuses_bad_flags(cli: Cli) -> None:
    for args, message in (
        (["--target", "gcp"], "--target gcp"),
        (["--target", "aws", "--flavor", "base"], "--flavor base"),
    ):
        result = cli("image", "build", *args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr


def test_vms_cannot_be_detached_from(cli: Cli) -> None:
    result = cli("deploy", "--target", "aws", "--emulate-instances=vm", "--detach", "--yes")
    assert result.returncode == 2
    assert "--detach: VMs live only while this deploy watches them" in result.stderr


def test_a_bare_emulate_instances_means_processes_and_never_eats_the_next_flag() -> None:
    from dlinfra.cli.options import with_emulation_default

    assert with_emulation_default(["deploy", "--emulate-instances", "--keep"]) == [
        "deploy",
        "--emulate-instances=process",
        "--keep",
    ]
    assert with_emulation_default(["--emulate-instances"]) == ["--emulate-instances=process"]
    assert with_emulation_default(["--emulate-instances", "vm"]) == ["--emulate-instances", "vm"]
    assert with_emulation_default(["--emulate-instances=vm"]) == ["--emulate-instances=vm"]


def test_pip_trusts_a_plain_http_mirror_only_when_it_is_named() -> None:
    from dlinfra.images import pip_options

    assert pip_options(None, False) == ""
    assert pip_options("https://mirror.example/simple", True) == (
        "--index-url https://mirror.example/simple --cert /etc/ssl/certs/ca-certificates.crt"
    )
    # pip ignores a plain-HTTP index that is not trusted (the VM test's wheelhouse on the host)
    assert pip_options("http://10.0.2.2:8080/simple", False) == (
        "--index-url http://10.0.2.2:8080/simple --trusted-host 10.0.2.2:8080"
    )


def test_a_second_image_build_waits_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builds in one cache run one after the other (a real flock, held by another process)."""
    from dlinfra.images import local

    monkeypatch.setenv("DLINFRA_IMAGE_CACHE", str(tmp_path))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from dlinfra.images import local\n"
            "with local._cache_lock(print):\n"
            "    print('holding', flush=True); sys.stdin.readline()\n",
        ],
        env=dict(os.environ, DLINFRA_IMAGE_CACHE=str(tmp_path)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "holding"
    told_to_let_go = threading.Event()

    def let_go() -> None:
        told_to_let_go.set()  # before the holder can possibly let go
        holder.stdin.write("\n")  # type: ignore[union-attr]
        holder.stdin.flush()  # type: ignore[union-attr]

    threading.Timer(1.0, let_go).start()
    said: list[str] = []
    with local._cache_lock(said.append):
        assert told_to_let_go.is_set(), "entered while the other build held the cache"
    assert said == [f"waiting for another image build in {tmp_path}"]
    assert holder.wait(timeout=60) == 0


def test_an_image_bakes_the_lock_a_deploy_of_its_experiment_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`image build` takes the lock this machine resolved last for the same inputs, as `deploy` does:
    resolved anew while the deploy took an older one (the index moved between: boto3 1.44.8 → 1.44.18
    in one hour), the image never held the run's lock and every boot installed."""
    from dlinfra.cli.images import _recipe
    from dlinfra.environment import lock_cache
    from dlinfra.images.vm import VM_PLATFORM
    from dlinfra.prepare import node_index
    from dlinfra.targets.aws import AwsTarget
    from dlinfra.targets.base import TargetOptions

    monkeypatch.setenv("DLINFRA_CACHE", str(tmp_path / "cache"))
    overrides = Overrides(target="aws")
    spec = load_spec(None, overrides)
    install = AwsTarget(TargetOptions(emulate_instances="vm")).node_install(spec)
    # what a deploy of the experiment resolves and keeps (prepare.Environment's call), then marked
    index = node_index(spec, install)
    deployed = lock_cache.locked(install.lock_source, [], "cpu", install.platform, index, False, fresh=False)
    (kept,) = (tmp_path / "cache" / "locks").glob("*.lock")
    kept.write_text(deployed.text + "# resolved by an earlier deploy\n", encoding="utf-8")
    recipe = _recipe(None, "cpu", overrides, lambda _: VM_PLATFORM)
    assert recipe.lock.text == deployed.text + "# resolved by an earlier deploy\n"
    assert recipe.wheel == install.wheel

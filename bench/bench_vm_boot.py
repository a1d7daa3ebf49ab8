"""Boot → first training step of one node VM, both ways a node gets its environment, side by side in
one run: the baked image (no pip at boot) and the base image (venv + pip install of dlinfra and
TensorFlow from a wheelhouse on the host's loopback). Each is `dlinfra deploy --target aws
--emulate-instances=vm` of one multi_worker_mirrored worker against a moto server.

    python bench/bench_vm_boot.py            # builds (or reuses) both local images first

Milestones come from the VM's own console (cloud-init's timestamps, seconds since the kernel
started) and the run's metrics (first step, wall clock): under TCG here, under KVM elsewhere
(DLINFRA_VM_ACCEL=kvm where /dev/kvm works)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moto.server import ThreadedMotoServer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from dlinfra.images.wheelhouse import serve, wheelhouse  # noqa: E402
from dlinfra.runs.wheel import node_wheel  # noqa: E402
from support import FAKE_CREDS, ec2_client, s3_client  # noqa: E402

CONSOLE_MARKS = {
    "cloud-init final starts": r"\[\s*([\d.]+)\].*running 'modules:final'",
    "install decided": r"\[\s*([\d.]+)\].*dlinfra: .*: (?:no install|installing)",
    "cloud-init done": r"\[\s*([\d.]+)\].*Cloud-init v\. .* finished at",
}


def main() -> None:
    os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # the kernel picks a free port
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3_client(endpoint).create_bucket(Bucket="bench")
    ami = ec2_client(endpoint).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-vm-"))
    rc = tmp / "tf.rc"
    rc.write_text('provider_installation {\n  filesystem_mirror { path = "/opt/tf-plugins" }\n}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | FAKE_CREDS
    env |= {
        "TF_CLI_CONFIG_FILE": str(rc),
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "DLINFRA_IMAGE_CACHE": os.environ.get("DLINFRA_IMAGE_CACHE", str(REPO / ".dlinfra" / "test-images")),
    }
    for flavor in ("cpu", "base"):
        subprocess.run(
            [sys.executable, "-m", "dlinfra", "image", "build", "--target", "local", "--flavor", flavor],
            env=env,
            check=True,
        )
    house = wheelhouse([f"{node_wheel()}[train,aws]"])
    rows = {}
    with serve(house) as index_port:
        for path, image in (("baked image", "auto"), ("install at boot", "base")):
            rows[path] = _one(tmp / image, env, endpoint, ami, image, index_port)
    moto.stop()
    marks = ["cloud-init final starts", "install decided", "cloud-init done", "first step", "run wall"]
    print("| milestone (s) | " + " | ".join(rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for mark in marks:
        print(f"| {mark} | " + " | ".join(f"{rows[p].get(mark, float('nan')):.0f}" for p in rows) + " |")


def _one(tmp: Path, env: dict[str, str], endpoint: str, ami: str, image: str, port: int) -> dict[str, float]:
    tmp.mkdir(parents=True)
    args = [
        "deploy", "--target", "aws", "--yes", "--emulate-instances=vm", "--endpoint-url", endpoint,
        "--strategy", "multi_worker_mirrored", "--workers", "1", "--steps", "20",
        "--set", "storage.url=s3://bench/runs", "--set", f"aws.ami={ami}", "--set", "cluster.workers.gpus=0",
        "--set", "cluster.startup_timeout=1800", "--set", f"aws.image={image}",
        "--set", f"aws.pip_index_url=http://10.0.2.2:{port}/simple",
    ]  # fmt: skip
    t0 = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "dlinfra", *args], env=env | {"DLINFRA_HOME": str(tmp)}, cwd=tmp
    )
    wall = time.time() - t0
    run_dir = sorted((tmp / "runs").iterdir())[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert result.returncode == 0 and manifest["status"] == "DONE", run_dir
    console = (run_dir / "vms" / "worker-0" / "console.log").read_text(errors="replace")
    row = {mark: float(m.group(1)) for mark, rx in CONSOLE_MARKS.items() if (m := re.search(rx, console))}
    started = (run_dir / "vms" / "worker-0" / "seed.iso").stat().st_mtime  # the VM boots right after
    metrics = json.loads(
        s3_client(endpoint)
        .get_object(Bucket="bench", Key=f"runs/{manifest['run_id']}/metrics.json")["Body"]
        .read()
    )
    row["first step"] = metrics["first_step_at"] - started
    row["run wall"] = wall
    return row


if __name__ == "__main__":
    main()

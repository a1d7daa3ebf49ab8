"""How the aws path grows with the cluster: `dlinfra render` and `dlinfra plan` at 1, 10, 100 and
1000 workers, and `terraform apply` + `destroy` of the planned stack against a moto server at 1, 16
and 64 workers (infrastructure only: no instance boots, nothing trains). Prints seconds and the peak
RSS of the largest process of each step (terraform's, for plan and apply), then the growth per
worker between the two largest sizes, so linear and worse-than-linear steps are told apart.

Goals (issue 15): render 1000 workers <= 2 s; plan 1000 <= 60 s; apply 64 against moto <= 3 min.
Uses the provider mirror at /opt/tf-plugins when present (offline).

    python bench/bench_scale.py [--render 1,10,100,1000] [--plan 1,10,100,1000] [--apply 1,16,64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emulated_aws import start_moto, terraform_rc

# Big enough for 1000 workers (a /20 holds 3967) and inside the default VPC, clear of its NAT subnet.
SUBNET = "10.42.16.0/20"
GOALS = {("render", 1000): 2.0, ("plan", 1000): 60.0, ("apply", 64): 180.0}
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


# Runs a command and writes its peak RSS (KiB) to argv[1]. A child forked straight from this script
# would report this script's RSS (moto, boto3) as its peak: ru_maxrss survives exec.
PEAK = """import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def measured(cmd: list[str], env: dict[str, str], peak_file: Path) -> tuple[float, float]:
    """Seconds, and peak RSS (MiB) of the largest process in the command's tree (wait4's rusage
    covers the child and every descendant it waited for)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, str(peak_file), *cmd],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])}... failed ({proc.returncode}):\n{proc.stdout.decode()[-3000:]}")
    return seconds, int(peak_file.read_text()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sizes = lambda text: [int(n) for n in text.split(",") if n]  # noqa: E731
    parser.add_argument("--render", type=sizes, default=[1, 10, 100, 1000])
    parser.add_argument("--plan", type=sizes, default=[1, 10, 100, 1000])
    parser.add_argument("--apply", type=sizes, default=[1, 16, 64])
    args = parser.parse_args()

    os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
    import boto3

    server, endpoint = start_moto()
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    rc = terraform_rc(work)
    env = dict(os.environ, **CREDS, AWS_DEFAULT_REGION="us-east-1", TF_CLI_CONFIG_FILE=str(rc))
    env["DLINFRA_HOME"] = str(work / "home")
    kw = {"endpoint_url": endpoint, "region_name": "us-east-1"} | {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    boto3.client("s3", **kw).create_bucket(Bucket="bench-results")
    ami = boto3.client("ec2", **kw).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    dl = [sys.executable, "-m", "dlinfra"]
    peak = work / "peak-rss"
    # plan is aws-only and takes no --target
    common = ["--set", f"aws.subnet_cidr={SUBNET}", "--strategy", "multi_worker_mirrored"]
    aws = ["--endpoint-url", endpoint, "--set", "storage.url=s3://bench-results/runs"]
    aws += ["--set", f"aws.ami={ami}"]
    rows: list[tuple[str, int, float, float]] = []

    for n in args.render:
        out = ["--workers", str(n), "--out", str(work / f"r{n}")]
        seconds, mib = measured([*dl, "render", "--target", "aws", *common, *out], env, peak)
        size = max(p.stat().st_size for p in (work / f"r{n}").glob("*.user-data.yaml"))
        rows.append((f"render (largest user-data {size / 1024:.1f} KiB)", n, seconds, mib))

    planned: dict[int, Path] = {}
    for n in sorted(set(args.plan) | set(args.apply)):
        before = set((work / "home" / "runs").glob("*")) if (work / "home" / "runs").exists() else set()
        seconds, mib = measured([*dl, "plan", *common, *aws, "--workers", str(n)], env, peak)
        [run_dir] = set((work / "home" / "runs").glob("*")) - before
        planned[n] = run_dir
        if n in args.plan:
            rows.append(("plan (init + plan + show)", n, seconds, mib))

    for n in args.apply:
        stack = planned[n] / "terraform" / "stack"
        tf = ["terraform", f"-chdir={stack}"]
        apply = ["apply", "-input=false", "-auto-approve", str(planned[n] / "tfplan")]
        seconds, mib = measured([*tf, *apply], env, peak)
        rows.append(("terraform apply against moto", n, seconds, mib))
        var_file = planned[n] / "tfvars.json"
        destroy = ["destroy", "-input=false", "-auto-approve", f"-var-file={var_file}"]
        seconds, mib = measured([*tf, *destroy], env, peak)
        rows.append(("terraform destroy against moto", n, seconds, mib))
    server.stop()

    print(f"{'step':<44} {'workers':>7} {'seconds':>8} {'peak MiB':>9} {'goal s':>7}")
    for step, n, seconds, mib in rows:
        goal = GOALS.get((step.removeprefix("terraform ").split()[0], n))
        goal_text = f"{goal:.0f}" if goal else "-"
        print(f"{step:<44} {n:>7} {seconds:8.2f} {mib:9.0f} {goal_text:>7}")
    print("\ngrowth between the two largest sizes of each step (seconds per added worker; a step")
    print("that is linear has a flat figure when compared across sizes):")
    by_step: dict[str, list[tuple[int, float]]] = {}
    for step, n, seconds, _ in rows:
        by_step.setdefault(step.split(" (")[0], []).append((n, seconds))
    for step, points in by_step.items():
        if len(points) >= 3:
            (n1, s1), (n2, s2), (n3, s3) = points[-3:]
            print(
                f"  {step:<36} {(s2 - s1) / (n2 - n1) * 1000:8.2f} ms/worker ({n1}->{n2}), "
                f"{(s3 - s2) / (n3 - n2) * 1000:8.2f} ms/worker ({n2}->{n3})"
            )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

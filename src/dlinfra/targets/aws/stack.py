"""A run's own copy of the Terraform stack (state included, unless the spec names a state bucket),
so concurrent runs never share state and a run's HCL is pinned with it; and the long-lived results
bucket in a stack and state of its own."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from dlinfra.errors import SpecError
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.run import Run, home
from dlinfra.spec.grammar import bucket_problems, endpoint_problems
from dlinfra.targets.aws import tfvars
from dlinfra.targets.base import Log
from dlinfra.terraform import Terraform

INFRA = Path(__file__).resolve().parents[2] / "infra"


def copy_hcl(stack: str, root: Path) -> None:
    """A root stack and the modules it references, side by side as in the package (no tests)."""
    for part in (stack, "modules"):
        shutil.copytree(INFRA / part, root / part, ignore=shutil.ignore_patterns("tests", ".terraform*"))


def run_stack(run: Run, log: Log) -> Terraform:
    """The run's copy of the HCL (stack + modules), initialised."""
    root = run.dir / "terraform"
    if not root.exists():
        copy_hcl("stack", root)
        backend = tfvars.state_backend(run.spec(), run.id)
        if backend is not None:
            (root / "stack" / "backend.tf.json").write_text(json.dumps(backend, indent=2))
    tf = Terraform(root / "stack", log=log)
    if not (root / "stack" / ".terraform").exists():
        tf.init()
    return tf


def move_state(run: Run, bucket: str, log: Log) -> None:
    """Move a run's local Terraform state into `bucket` (one key per run, under S3's lock file):
    a run handed to the controller is acted on from there, and this machine's copy goes."""
    root = run.dir / "terraform" / "stack"
    if (root / "backend.tf.json").exists():
        return  # the spec's state bucket has held it from the start
    spec = run.spec()
    held = spec.model_copy(update={"aws": spec.aws.model_copy(update={"state_bucket": bucket})})
    backend = tfvars.state_backend(held, run.id)
    (root / "backend.tf.json").write_text(json.dumps(backend, indent=2))
    Terraform(root, log=log).run(
        ["init", "-input=false", "-no-color", "-migrate-state", "-force-copy"], json_events=False
    )
    for local in ("terraform.tfstate", "terraform.tfstate.backup"):
        (root / local).unlink(missing_ok=True)


def var_file(run: Run) -> Path:
    return run.dir / "tfvars.json"


def write_inputs(run: Run, variables: dict[str, Any], tf: Terraform, upload: bool = True) -> Path:
    """The run's tfvars and provider lock, pinned in the run dir, the store (unless not `upload`)
    and the manifest: a rerun months later must apply what this run applied."""
    text = json.dumps(variables, indent=2, sort_keys=True) + "\n"
    path = var_file(run)
    path.write_text(text, encoding="utf-8")
    lock = tf.workdir / ".terraform.lock.hcl"
    shutil.copy2(lock, run.dir / "terraform.lock.hcl")
    if upload:
        run.store().put_terraform_pins(lock, text)
    run.update_manifest(
        tfvars_sha256=hashlib.sha256(text.encode()).hexdigest(),
        terraform_lock_sha256=file_sha256(lock),
    )
    return path


def destroy(run: Run) -> str:
    t0 = time.time()
    run_stack(run, log=lambda line: None).destroy(var_file(run))
    seconds = round(time.time() - t0, 1)
    run.update_manifest(destroyed=True, destroy_seconds=seconds)
    said = [f"run {run.id}: stack destroyed in {seconds:.0f}s (the results bucket is untouched)"]
    return "\n".join(said + [f"run {run.id}: {line}" for line in _outside_the_state(run)])


def _outside_the_state(run: Run) -> list[str]:
    """What EC2 still holds with the run's tag after the destroy (see leftovers), each said."""
    from botocore.exceptions import BotoCoreError, ClientError

    from dlinfra.targets.aws import leftovers, preflight

    try:
        found = leftovers.sweep(preflight.client(run.spec(), "ec2"), run.id)
    except (BotoCoreError, ClientError) as exc:
        return [
            f"could not look for resources Terraform did not track ({exc}). Fix: look in EC2 for the tag "
            f"{tfvars.RUN_TAG}={run.id} and remove what is there"
        ]
    return [f"outside Terraform's state, found by the run's tag: {line}" for line in found]


def setup_bucket(bucket: str, region: str, endpoint_url: str | None, log: Log) -> str:
    """Create the long-lived results bucket once, in its own stack and state (never a run's)."""
    if problems := bucket_problems(bucket, region) + endpoint_problems(endpoint_url):
        raise SpecError(problems)  # before anything is written or run
    root = home() / "setup" / bucket
    if not root.exists():
        copy_hcl("bucket", root)
    inputs = root / "bucket.tfvars.json"
    inputs.write_text(json.dumps(tfvars.bucket_tfvars(bucket, region, endpoint_url), indent=2))
    tf = Terraform(root / "bucket", log=log)
    tf.init()
    tf.plan(inputs, root / "bucket.tfplan")
    tf.apply(root / "bucket.tfplan")
    return f"bucket s3://{bucket} ready (state in {root}); set storage.url: s3://{bucket}/runs"

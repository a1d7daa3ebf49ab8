"""Handing a run to the account's controller, and taking it up there.

The controller keeps no memory that matters: a run it owns is acted on from the bucket alone. So a
hand-over puts three things there, in this order: the run dir (`run-dir.tar.gz` in the run's store:
its locked spec, user-data, tfvars, provider lock and copy of the HCL), the hand-over record in the
bucket's `controller/` prefix, and the run's lease, reserved for the controller (runs.ownership). The
run's Terraform state is already in S3 by then (the target moved it). A controller that dies, or a
new one, finds the same three things and picks the run up again.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dlinfra.errors import StoreError
from dlinfra.runs.bundle import extract_safely
from dlinfra.runs.layout import MANIFEST, RunStore
from dlinfra.runs.layout.controller import ControllerStore
from dlinfra.runs.ownership import Lease
from dlinfra.runs.records import Handover
from dlinfra.runs.run import SPEC_LOCK, Run, home
from dlinfra.runs.sealing import read_key, seal, verified
from dlinfra.spec.grammar import RUN_ID_RE

POLL_SECONDS = 5.0  # between a controller's looks at the bucket's hand-overs

# What the controller acts from; never the local state, plans, logs, VMs or provider binaries.
CARRIED = (SPEC_LOCK, "tfvars.json", "terraform.lock.hcl", "user-data", "nodes", "code", "terraform")
LEFT_OUT = (".terraform", "terraform.tfstate", "terraform.tfstate.backup", "terraform.log", "tfplan")


def pack(run: Run) -> bytes:
    """The run dir's records as one gzipped tar (the manifest travels on its own, newest)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name in CARRIED:
            if (run.dir / name).exists():
                tar.add(run.dir / name, arcname=name, filter=_carried)
    return out.getvalue()


def _carried(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if any(part in LEFT_OUT for part in Path(info.name).parts) else info


def hand_over(
    run: Run,
    store: RunStore,
    controller: ControllerStore,
    lease: Lease,
    *,
    keep: bool,
    emulate_instances: str | None,
) -> Handover:
    """Give the run to the controller. The lease goes last: until then, this CLI still owns it."""
    key = read_key(controller.bucket, controller.region, controller.endpoint_url, create=True)
    assert key is not None  # made when missing
    run.update_manifest(handed_over=True)
    run.publish_manifest()
    packed = pack(run)
    store.put_run_dir(packed)
    handover = Handover(
        run_id=run.id,
        store=run.manifest().store,
        emulate_instances=emulate_instances,
        keep=keep,
        by=lease.record.holder,
        time=time.time(),
        run_dir_sha256=hashlib.sha256(packed).hexdigest(),
    )
    handover = seal(handover, key)
    controller.put_handover(handover)
    lease.hand_over()
    return handover


@dataclass
class Judged:
    """The hand-over prefix as judged before anything acts on it."""

    sealed: list[Handover] = field(default_factory=list)  # verified; store: this bucket's, its way
    refused: list[tuple[str, str]] = field(default_factory=list)  # key, and why (never its content)
    unverified: int = 0  # well-formed, in this bucket, but no key to verify them with


def judge(
    controller: ControllerStore, listed: list[tuple[str, Handover | str]], key: Callable[[], bytes | None]
) -> Judged:
    """Which hand-overs this account's dlinfra sealed, each pointed at its run's prefix in the
    controller's own bucket by its own endpoint (never the record's), and which are refused. `key`
    is asked only when a record needs it: what anyone can see is bad is refused without it."""
    judged, readable = Judged(), []
    for name, found in listed:
        if isinstance(found, str):
            judged.refused.append((name, found))
        elif not RUN_ID_RE.fullmatch(found.run_id):
            judged.refused.append((name, "its run id is not a dlinfra run id"))
        elif (store := controller.run_store(found.store.url, found.run_id)) is None:
            judged.refused.append((name, "its store is not this run's prefix in this controller's bucket"))
        else:
            readable.append((name, found, store))
    secret = key() if readable else None
    if secret is None:
        judged.unverified = len(readable)
        return judged
    for name, handover, store in readable:
        if verified(handover, secret):  # as written; then reached by the controller's own way
            judged.sealed.append(handover.model_copy(update={"store": store}))
        else:
            judged.refused.append((name, "not sealed with this bucket's hand-over key"))
    judged.sealed.sort(key=lambda h: h.time)
    return judged


def controller_note(controller: ControllerStore) -> str | None:
    """What to do when the controller a run was handed to is not running now."""
    info = controller.info()
    if info is not None and info.running(time.time(), POLL_SECONDS):
        return None
    bucket = controller.uri().removeprefix("s3://").split("/", 1)[0]
    who = (
        f"the controller ({info.holder}) is {info.state if info else 'gone'}"
        if info
        else "no controller runs"
    )
    return (
        f"{who}: it picks the run up when it runs again (`dlinfra controller run --bucket {bucket}`); "
        "after 10 min without it, the next `dlinfra watch` takes the run"
    )


def take_up(handover: Handover) -> Run:
    """The handed-over run's dir on this machine, made from the store if it is not here yet (a new
    controller, or one whose disk was replaced). `handover` is verified (runs.sealing) and its store
    is the controller's own way to the run's prefix: the manifest's is not trusted over it."""
    run_dir = home() / "runs" / handover.run_id
    store = RunStore.open(handover.store)
    if not (run_dir / MANIFEST).is_file():
        data = store.run_dir()
        manifest = store.manifest()
        if data is None or manifest is None:
            raise StoreError(
                f"run {handover.run_id} was handed over, but {store.uri()} holds no run dir. Fix: "
                f"`dlinfra watch {handover.run_id}` from the machine that deployed it"
            )
        if hashlib.sha256(data).hexdigest() != handover.run_dir_sha256:
            raise StoreError(
                f"run {handover.run_id}: {store.uri()}'s run dir is not the one handed over (its digest "
                f"differs): not acted on. Fix: `dlinfra watch {handover.run_id}` from the machine that "
                "deployed it"
            )
        manifest = manifest.model_copy(update={"store": handover.store})
        staging = run_dir.with_name(f".{handover.run_id}.taking")
        staging.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            extract_safely(tar, staging)
        run = Run(handover.run_id, staging)
        if handover.emulate_instances != "process":  # the deploying machine's pids: none of this one's
            manifest = manifest.model_copy(update={"pids": {}})
        run.write_manifest(manifest)
        staging.rename(run_dir)
    return Run(handover.run_id, run_dir)

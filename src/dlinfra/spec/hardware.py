"""What a spec's nodes run on: each role's instance type from the catalog, and the GPUs it trains on.

Only workers train (under multi_worker_mirrored worker 0 is also the chief; under parameter_server
the chief coordinates and the ps hold variables, both on CPU). `cluster.workers.gpus: auto` means
all of the type's GPUs where instance types describe the machines (aws), and none where they do
not (local processes share this machine: ask for its GPUs explicitly).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from dlinfra.spec.catalog import InstanceType, catalog
from dlinfra.spec.loading import Problem
from dlinfra.spec.model import Spec

AUTO = "auto"
TRAINING_ROLE = "worker"
GPU_TYPES_HINT = "`dlinfra instances --gpu` lists the GPU types"
MIN_SHAPED_BPS = 1e6


@dataclass(frozen=True)
class RoleHardware:
    role: str
    count: int
    instance_type: str
    kind: InstanceType | None  # None: a type the catalog does not know
    gpus: int  # per node: the GPUs it trains on (0: CPU)

    def describe(self, typed: bool) -> str:
        """'g4dn.xlarge: 4 vCPU, 1 x NVIDIA T4 16 GiB; trains on 1 GPU' (typed), or 'trains on CPU'."""
        trains_on = _gpus(self.gpus) if self.gpus else "CPU"
        use = f"trains on {trains_on}" if self.role == TRAINING_ROLE else "CPU"
        if not typed:
            return use
        if self.kind is None:
            return f"{self.instance_type} (not in the catalog); {use}"
        gpu = f", {self.kind.gpu_text()}" if self.kind.gpus else ""
        return f"{self.instance_type}: {self.kind.vcpus} vCPU{gpu}; {use}"


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def cluster_hardware(spec: Spec, typed: bool) -> dict[str, RoleHardware]:
    """Role → its nodes' hardware. `typed`: the target runs each node on its instance type."""
    out = {}
    for role, shape in spec.roles().items():
        kind = catalog().get(shape.instance_type)
        gpus = 0
        if role == TRAINING_ROLE:
            asked = spec.cluster.workers.gpus
            if asked != AUTO:
                gpus = int(asked)
            elif typed and kind is not None:
                gpus = kind.gpus
        out[role] = RoleHardware(role, shape.count, shape.instance_type, kind, gpus)
    return out


def problems(spec: Spec, typed: bool) -> list[Problem]:
    """Everything that makes the spec's hardware impossible; each one exits 2 before anything runs."""
    found: list[Problem] = []
    workers = spec.cluster.workers
    kind = catalog().get(workers.instance_type)
    asked = workers.gpus
    loc = ("cluster", "workers", "gpus")
    if asked != AUTO and kind is not None and int(asked) > kind.gpus:
        if kind.gpus == 0:
            found.append(
                Problem(
                    loc,
                    f"{_gpus(int(asked))} per worker, but {kind.name} is a CPU type (0 GPUs)",
                    f"set gpus: 0 (or auto), or choose a GPU instance type; {GPU_TYPES_HINT}",
                )
            )
        else:
            found.append(
                Problem(
                    loc,
                    f"{_gpus(int(asked))} per worker, but {kind.name} has {kind.gpus} ({kind.gpu_text()})",
                    f"set gpus to at most {kind.gpus}, or choose a type with more GPUs; {GPU_TYPES_HINT}",
                )
            )
    if asked == AUTO and typed and kind is None:
        found.append(
            Problem(
                loc,
                f"auto means all of the instance type's GPUs, and {workers.instance_type} is not in "
                "dlinfra's instance catalog",
                "set cluster.workers.gpus to the number of GPUs to train on (0 for a CPU type), or use "
                "a type from `dlinfra instances`",
            )
        )
    if spec.strategy == "parameter_server" and spec.training.lr_scaling != "none":
        found.append(
            Problem(
                ("training", "lr_scaling"),
                f"{spec.training.lr_scaling} scaling needs a synchronous global batch, and under "
                "parameter_server every update is one worker's batch",
                "set lr_scaling: none, or use strategy: multi_worker_mirrored",
            )
        )
    found += _link_problems(spec, typed)
    if found:
        return found
    gpus = cluster_hardware(spec, typed)[TRAINING_ROLE].gpus
    if spec.strategy == "parameter_server" and gpus > 1:
        why = f" (auto: all of {workers.instance_type}'s GPUs)" if asked == AUTO else ""
        found.append(
            Problem(
                loc,
                f"{gpus} GPUs per worker{why} under parameter_server: TensorFlow's ParameterServerStrategy "
                "would mirror each step over a worker's GPUs, which dlinfra does not support",
                "use strategy: multi_worker_mirrored (all-reduce over every GPU of every worker), or "
                "gpus: 1 and more workers",
            )
        )
    if spec.training.mixed_precision and gpus == 0:
        why = (
            "local nodes train on CPU unless cluster.workers.gpus asks for this machine's GPUs"
            if not typed and asked == AUTO
            else f"the workers train on CPU ({workers.instance_type}, gpus {asked})"
        )
        found.append(
            Problem(
                ("training", "mixed_precision"),
                f"mixed_float16 needs GPUs, and no training node has one: {why}",
                "set mixed_precision: false, or give the workers GPUs (cluster.workers.gpus on a GPU type)",
            )
        )
    return found


def _link_problems(spec: Spec, typed: bool) -> list[Problem]:
    """A shaped local link slower than dlinfra makes one: tc's tbf takes whole bits a second (an
    extreme scale rounds to none), and the advisor's figures overflow. The field's own bound is only
    > 0: the floor depends on the types' bandwidth."""
    c = spec.cluster
    if typed or c.local_network != "shaped":
        return []
    known = [k for k in (catalog().get(r.instance_type) for r in spec.roles().values()) if k is not None]
    slowest = min(known, key=lambda k: k.network_baseline_gbps, default=None)
    if slowest is None or slowest.network_baseline_gbps * 1e9 * c.local_link_scale >= MIN_SHAPED_BPS:
        return []
    least = MIN_SHAPED_BPS / (slowest.network_baseline_gbps * 1e9)
    return [
        Problem(
            ("cluster", "local_link_scale"),
            f"{c.local_link_scale:g} would give {slowest.name} ({slowest.network_baseline_gbps:g} Gb/s) "
            f"a link under {MIN_SHAPED_BPS / 1e6:g} Mb/s, the slowest link dlinfra shapes",
            f"use a local_link_scale of at least {least:.2g}",
        )
    ]


def warnings(spec: Spec, typed: bool) -> list[str]:
    """What is allowed but likely a mistake: money spent on hardware nothing uses, unknown types."""
    if not typed:
        return []
    found = []
    for role, hw in cluster_hardware(spec, typed).items():
        field = f"cluster.{'workers' if role == TRAINING_ROLE else role}.instance_type"
        if hw.kind is None:
            found.append(
                f"{field}: {hw.instance_type} is not in dlinfra's instance catalog (`dlinfra instances`): "
                "its price is unknown and its GPUs are not checked"
            )
        elif hw.kind.gpus and role != TRAINING_ROLE:
            found.append(
                f"{field}: {hw.instance_type} has {hw.kind.gpu_text()}, which the {role} does not use "
                f"({'it coordinates' if role == 'chief' else 'it holds variables'}); a CPU type costs less"
            )
        elif hw.kind.gpus > hw.gpus:
            found.append(
                f"cluster.workers.gpus: {hw.gpus} of {hw.instance_type}'s {hw.kind.gpus} GPUs are used; "
                f"the rest ({hw.kind.gpu_text()}) is paid for and idle"
            )
    return found


def machine_gpus() -> int:
    """The NVIDIA GPUs of this machine that its processes may use (CUDA_VISIBLE_DEVICES honoured), from
    the driver: nodes that run here (local processes, emulated instances) can see no others."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = (
        sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0
    )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    return found


def host_gpu_problems(spec: Spec, typed: bool, available: int, nodes: str) -> list[Problem]:
    """The workers' GPUs when every node runs on this machine (`nodes` says how: 'local processes',
    'emulated instances'): they share its `available` GPUs, worker i taking GPUs i*gpus.. (devices.py)."""
    hw = cluster_hardware(spec, typed)[TRAINING_ROLE]
    needed = hw.gpus * hw.count
    if needed <= available:
        return []
    why = f" (auto: all of {hw.instance_type}'s)" if spec.cluster.workers.gpus == AUTO else ""
    return [
        Problem(
            ("cluster", "workers", "gpus"),
            f"{hw.count} workers x {_gpus(hw.gpus)}{why} need {needed}, and {nodes} run on this machine, "
            f"which has {_gpus(available)} they can use",
            "train on CPU with --set cluster.workers.gpus=0, or run where the GPUs are",
        )
    ]

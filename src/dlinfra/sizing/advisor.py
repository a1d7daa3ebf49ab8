"""A spec's sizing advice: its model's bytes, its devices' step time and its links, from the spec,
the instance catalog and the sizing history, with no TensorFlow (plan and validate print it)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlinfra.contract import StoreConfig
from dlinfra.runs.layout.sizing import SizingHistory
from dlinfra.sizing.advice import Advice, advise
from dlinfra.sizing.model_size import ModelSize, input_of, size_of
from dlinfra.sizing.predict import PS_TIER_EFFICIENCY, Links, Point, Workload, predict
from dlinfra.spec.catalog import catalog
from dlinfra.spec.hardware import cluster_hardware
from dlinfra.spec.model import Spec
from dlinfra.targets import uses_instance_types

GBIT = 1e9 / 8  # bytes/s
FLOW_CAP_GBPS = 5.0  # one flow outside a cluster placement group (EC2 docs); dlinfra makes none
LOOPBACK_GBPS = 16.0  # unshaped veth and loopback here: 15-16 Gb/s, the 2 cores the limit past it
# An estimate where nothing was measured (Paleo, ICLR'17: devices reach ~0.62 of their peak on
# training kernels) plus TensorFlow's own cost of a step, which dominates small models on GPUs.
COMPUTE_EFFICIENCY = 0.62
STEP_OVERHEAD_S = 0.002
CPU_GFLOPS_PER_VCPU = 24.0  # float32 matmul per vCPU: preflight's gemm measured 45-50 GFLOP/s on 2 here
GPU_TFLOPS = {  # float32 peak per GPU, from the vendors' data sheets
    "NVIDIA T4": 8.1,
    "NVIDIA A10G": 31.2,
    "NVIDIA L4": 30.3,
    "NVIDIA V100": 15.7,
    "NVIDIA A100": 19.5,
    "NVIDIA H100": 67.0,
}


@dataclass(frozen=True)
class Step:
    """One worker's step on its device: seconds, and where the figure comes from."""

    seconds: float | None
    source: str
    size: ModelSize | None


def model_key(spec: Spec) -> str:
    """What sets a step's work: the model (or the user's program), its input, batch and precision."""
    t = spec.training
    ds = t.dataset
    made_of: dict[str, Any] = {
        "model": t.model.model_dump(mode="json") if not (t.entrypoint or t.command) else None,
        "program": t.entrypoint or t.command,
        "input": [ds.format, list(ds.shape), ds.classes]
        if ds.format not in ("digits", "cifar10")
        else ds.format,
        "batch": t.batch_size,
        "mixed_precision": t.mixed_precision,
        "jit_compile": t.jit_compile,
    }
    digest = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:12]
    # not the experiment's name: two experiments of one model share its profile and its history
    return f"{'program' if made_of['program'] else t.model.name}-{digest}"


def device_key(spec: Spec) -> str:
    """The workers' instance type where each node has its own; else this machine."""
    return spec.cluster.workers.instance_type if uses_instance_types(spec.target) else this_machine()


def this_machine() -> str:
    return f"local-{_slug(local_cpu())}-x{os.cpu_count() or 1}"


def local_cpu() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return "cpu"
    found = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    return found.group(1).strip() if found else "cpu"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def history_of(spec: Spec, home: Path) -> SizingHistory:
    """The results bucket (or the spec's file:// store), else `home`/sizing for local runs."""
    url = spec.storage.url
    if not url:
        return SizingHistory.under(f"file://{home}", None, None)
    store = StoreConfig.for_run(spec, url)
    return SizingHistory.under(url, store.endpoint_url, store.region)


def step_of(spec: Spec, history: SizingHistory | None) -> Step:
    """Measured (a profile of this model on this device) over estimated (FLOPs at the device's
    rate) over unknown (a program's own model that was never profiled)."""
    device = device_key(spec)
    measured = history.profile(model_key(spec), device) if history else None
    shaped = input_of(spec.training.dataset)
    size = None
    if shaped and not (spec.training.entrypoint or spec.training.command):
        size = size_of(spec.training.model, *shaped)  # exact, with each variable's place
    elif measured:
        # what a step moves: a sparse gradient (an embedding's looked-up rows) and, under parameter
        # servers, the same rows read, beside every dense weight
        moved = measured.get("gradient_elements", measured["trainable"])
        size = ModelSize(
            measured["parameters"] - measured["trainable"] + moved,
            moved,
            0,
            tuple(measured.get("variables", ())),
        )
    if measured:
        when = str(measured.get("time", ""))[:10]
        return Step(
            measured["step_seconds"],
            f"measured by {measured.get('source', '`dlinfra profile`')} on {device} {when}".strip(),
            size,
        )
    rate = device_flops(spec)
    if size is None or rate is None:
        return Step(
            None, f"unknown: the figures are what the links allow. Fix: dlinfra profile (on {device})", size
        )
    seconds = size.step_flops(spec.training.batch_size) / (rate * COMPUTE_EFFICIENCY) + STEP_OVERHEAD_S
    return Step(
        seconds,
        f"estimated: {size.step_flops(spec.training.batch_size) / 1e9:.2g} GFLOP a step at "
        f"{COMPUTE_EFFICIENCY:.0%} of {rate / 1e12:.3g} TFLOP/s; `dlinfra profile` measures it",
        size,
    )


def device_flops(spec: Spec) -> float | None:
    """The float32 rate of one worker's device: its GPUs' peak, or its vCPUs'."""
    if not uses_instance_types(spec.target):
        return (os.cpu_count() or 1) * CPU_GFLOPS_PER_VCPU * 1e9
    worker = cluster_hardware(spec, True)["worker"]
    if worker.kind is None:
        return None
    if worker.gpus and worker.kind.gpu_model in GPU_TFLOPS:
        return worker.gpus * GPU_TFLOPS[worker.kind.gpu_model] * 1e12
    return None if worker.gpus else worker.kind.vcpus * CPU_GFLOPS_PER_VCPU * 1e9


def links_of(spec: Spec) -> tuple[Links, str] | None:
    """Each role's NIC, each way: the type's baseline (shaped local: scaled), or loopback."""
    c = spec.cluster
    typed = uses_instance_types(spec.target)
    if not typed and c.local_network != "shaped":
        fast = LOOPBACK_GBPS * GBIT
        return Links(fast, fast, None), f"loopback (~{LOOPBACK_GBPS:g} Gb/s): the nodes share this machine"
    worker, ps = catalog().get(c.workers.instance_type), catalog().get(c.ps.instance_type)
    if worker is None or ps is None:
        return None
    scale = 1.0 if typed else c.local_link_scale
    links = Links(worker.network_baseline_gbps * scale * GBIT, ps.network_baseline_gbps * scale * GBIT, None)
    kinds = f"{worker.type} {worker.network_baseline_gbps * scale:g} Gb/s"
    if spec.strategy == "parameter_server":
        kinds += f", {ps.type} {ps.network_baseline_gbps * scale:g} Gb/s"
    if not typed:
        return links, f"shaped: each type's baseline x {scale:g} ({kinds})"
    burst = (
        " ('up to' types fall to it after minutes of use)"
        if worker.network_gbps > worker.network_baseline_gbps
        else ""
    )
    if worker.efa:
        burst += f"; {worker.type}'s EFA unused (TensorFlow's gRPC runs over TCP)"
    return (
        Links(links.worker, links.ps, FLOW_CAP_GBPS * GBIT),
        f"each type's baseline bandwidth ({kinds}){burst}; one TCP flow at most {FLOW_CAP_GBPS:g} Gb/s "
        "outside a cluster placement group",
    )


def usd_per_hour(spec: Spec, workers: int, ps: int) -> float | None:
    if not uses_instance_types(spec.target):
        return None
    c = spec.cluster
    counts = {c.workers.instance_type: workers}
    if spec.strategy == "parameter_server":
        for kind, n in ((c.ps.instance_type, ps), (c.chief.instance_type, 1)):
            counts[kind] = counts.get(kind, 0) + n
    total = 0.0
    for kind, n in counts.items():
        known = catalog().get(kind)
        price = known.price(spec.aws.region) if known else None
        if price is None:
            return None
        total += n * price
    return total


def sizing_advice(spec: Spec, history: SizingHistory | None) -> Advice | str:
    """The advice, or why there is none (a model only its code knows, a type the catalog lacks)."""
    try:
        step = step_of(spec, history)
    except ValueError as exc:  # a layers model that cannot be built: training would fail on it too
        return f"sizing: none, training.model cannot be built: {exc}"
    if step.size is None:
        if spec.training.command:
            return "sizing: none for a script (training.command): its model is its own, unseen by dlinfra"
        return "sizing: the model is your program's, never profiled. Fix: `dlinfra profile FILE` measures it"
    linked = links_of(spec)
    if linked is None:
        return "sizing: none, an instance type is not in the catalog, so its bandwidth is unknown"
    links, where = linked
    typed = uses_instance_types(spec.target)
    hw = cluster_hardware(spec, typed)["worker"]
    work = Workload(
        spec.strategy,
        step.size.parameter_bytes,
        step.size.gradient_bytes,
        spec.training.batch_size * max(1, hw.gpus),
        step.seconds,
        shared_machine=not typed,
        variables=step.size.variables,
    )

    def at(workers: int, ps: int) -> Point:
        point = predict(work, links, workers, ps)
        return Point(
            point.workers,
            point.ps,
            point.steps_per_s,
            point.examples_per_s,
            point.bound,
            usd_per_hour(spec, workers, ps),
        )

    ps = spec.cluster.ps.count if spec.strategy == "parameter_server" else 0
    assumptions = [
        f"model: {step.size.parameter_bytes / 1e6:.3g} MB of variables, "
        f"{step.size.gradient_bytes / 1e6:.3g} MB of gradient a step",
        f"compute: {step.source}",
        f"links: {where}",
    ]
    if spec.strategy == "parameter_server":
        assumptions.append(
            "parameter servers: each worker step reads the variables and sends the gradient; the ps tier "
            f"reaches {PS_TIER_EFFICIENCY:.0%} of its full-duplex bound (measured)"
        )
        spread = max(ps, 2)  # at 1 ps: what a second would do
        busiest = work.busiest_share(spread)
        if busiest > 1.2 / spread:
            assumptions.append(
                f"variables are placed whole, one ps after another: the busiest of {spread} ps would hold "
                f"{busiest:.0%} of the bytes, so more ps barely help (a Program.variable_partitioner "
                "splits big variables)"
            )
    shared = not typed and spec.cluster.local_network != "shaped"
    if shared:
        assumptions.append(
            "local: every node shares this machine, so more workers here try the plumbing, not the speed "
            "(cluster.local_network: shaped gives each node a link like its instance type's)"
        )
    advice = advise(
        at, spec.cluster.workers.count, ps, step.seconds is not None, assumptions, warn=not shared
    )
    return dataclasses.replace(advice, size=step.size)

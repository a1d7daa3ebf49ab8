"""What a node really trains on: the devices TensorFlow sees, checked against the GPUs it asked for.

A GPU node that TensorFlow sees no GPU on would train on its CPUs at GPU prices, slowly and
silently. It fails at once instead, naming what it saw and the likely cause; that exit is final
(a restart cannot install a driver).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from dlinfra.contract import NodeConfig
from dlinfra.node.tensorflow_import import import_tensorflow


@dataclass(frozen=True)
class Devices:
    names: list[str]  # "GPU:0 Tesla T4 15 GiB", "CPU:0"
    gpus: int
    built_with_cuda: bool


def limit_visible_gpus(cfg: NodeConfig) -> str:
    """Before TensorFlow loads: this node sees only its own GPUs (none for a CPU node)."""
    visible = cuda_visible_devices(cfg.gpus, cfg.gpu_offset, os.environ.get("CUDA_VISIBLE_DEVICES"))
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return visible


def cuda_visible_devices(gpus: int, offset: int, inherited: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES of a node that trains on `gpus` GPUs starting at slot `offset` of
    its machine. Slots index the devices the machine lets us see (an inherited CUDA_VISIBLE_DEVICES),
    so a user who fenced off GPUs keeps them fenced. A CPU node sees none: it must not take GPU
    memory from the nodes that train."""
    if gpus == 0:
        return ""
    if inherited is not None:  # "" hides every GPU, and stays so
        visible = [d.strip() for d in inherited.split(",") if d.strip()]
    else:
        visible = [str(i) for i in range(offset + gpus)]
    return ",".join(visible[offset : offset + gpus])


def probe() -> Devices:
    """The devices TensorFlow sees; the first import of TensorFlow in a training node's process."""
    tf = import_tensorflow()
    memory = _gpu_memory_gib()
    names = []
    gpus = tf.config.list_physical_devices("GPU")
    for i, gpu in enumerate(gpus):
        model = tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
        gib = f" {memory[i]} GiB" if i < len(memory) else ""
        names.append(f"GPU:{i} {model}{gib}")
    names += [f"CPU:{i}" for i, _ in enumerate(tf.config.list_physical_devices("CPU"))]
    return Devices(names, len(gpus), bool(tf.test.is_built_with_cuda()))


# TensorFlow sizes its inter-op pool by the CPUs it may run on. With one, a parameter server's only
# thread blocks serving one request while the next waits for it: training stalls at step 0 (seen on a
# 1-vCPU node, and on a local cluster under `taskset -c 0`).
MIN_INTER_OP_THREADS = 2


def inter_op_threads() -> int:
    """0 (TensorFlow's own choice, a thread per CPU) unless this node may run on a single CPU."""
    return 0 if len(os.sched_getaffinity(0)) >= MIN_INTER_OP_THREADS else MIN_INTER_OP_THREADS


def size_thread_pools() -> int:
    """Before TensorFlow's runtime starts (probe() does not start it): the inter-op pool this node's
    sessions and servers use."""
    import tensorflow as tf

    if threads := inter_op_threads():
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    return threads


def shortfall(cfg: NodeConfig, devices: Devices, visible: str) -> str | None:
    """Why this node cannot train as asked, or None when TensorFlow sees every GPU it asked for."""
    if devices.gpus >= cfg.gpus:
        return None
    machine = cfg.instance_type or "this machine"
    plural = "s" if cfg.gpus > 1 else ""
    seen = ", ".join(devices.names) or "nothing"
    if not devices.built_with_cuda:
        cause = (
            "this TensorFlow is a CPU-only build (tensorflow-cpu). Fix: install the GPU build, "
            "pip install 'dlinfra[train-gpu]'"
        )
    elif shutil.which("nvidia-smi") is None:
        cause = (
            "no NVIDIA driver (nvidia-smi not found). Fix: use an image with the driver: on aws leave "
            "aws.ami unset for the Deep Learning AMI"
        )
    else:
        cause = (
            f"the driver or CUDA does not match TensorFlow's, or the machine has fewer GPUs than asked "
            f"(CUDA_VISIBLE_DEVICES={visible!r}; nvidia-smi says: {_nvidia_smi_list() or 'nothing'})"
        )
    return (
        f"{cfg.name} ({machine}) asked for {cfg.gpus} GPU{plural} and TensorFlow sees {devices.gpus} "
        f"(devices: {seen}). Likely cause: {cause}. Or train on CPU: cluster.workers.gpus=0"
    )


def _nvidia_smi(query: str) -> list[str]:
    """One line per GPU this node may use (nvidia-smi ignores CUDA_VISIBLE_DEVICES: -i applies it)."""
    if shutil.which("nvidia-smi") is None:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    select = ["-i", visible] if visible else []
    try:
        done = subprocess.run(
            ["nvidia-smi", *select, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def driver_version() -> str | None:
    found = _nvidia_smi("driver_version")
    return found[0] if found else None


def _nvidia_smi_list() -> str:
    return "; ".join(_nvidia_smi("index,name"))


def _gpu_memory_gib() -> list[int]:
    """Each visible GPU's memory, from the driver (TensorFlow does not report the total)."""
    out = []
    for line in _nvidia_smi("memory.total"):
        try:
            out.append(round(int(line) / 1024))
        except ValueError:
            return []
    return out

"""What a node measures of itself before training (node.preflight): its device, its links to its
peers, its input, its versions and the CPU its cgroup allows."""

from __future__ import annotations

import contextlib
import platform
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from dlinfra.contract import NodeConfig
from dlinfra.runs.preflight import Link
from dlinfra.runs.store_url import open_store


@dataclass(frozen=True)
class Effort:
    """How long and how much each check measures: quick fits in seconds, full gives steadier figures."""

    windows: int  # timed windows per device figure; the best one counts (a preempted window is noise)
    window_seconds: float
    matrix: int  # gemm size
    link_bytes: int  # each direction, per link, at most: a fast link is through in milliseconds
    link_seconds: float  # each direction, per link, at most: a slow one (~1 MB/s) is cut short
    pings: int
    input_bytes: int
    reductions: int  # all-reduces per timed round (rounds: `windows`), the same count on every worker


EFFORT = {
    "quick": Effort(
        windows=3,
        window_seconds=0.3,
        matrix=512,
        link_bytes=64 << 20,
        link_seconds=1.0,
        pings=20,
        input_bytes=16 << 20,
        reductions=2,
    ),
    "full": Effort(
        windows=10,
        window_seconds=1.0,
        matrix=1024,
        link_bytes=512 << 20,
        link_seconds=5.0,
        pings=200,
        input_bytes=256 << 20,
        reductions=5,
    ),
}


# ---------------------------------------------------------------- the device


def device_figures(cfg: NodeConfig, effort: Effort) -> dict[str, float]:
    """gemm and a convolution on the device the node trains on, at the run's precision; host→GPU."""
    import tensorflow as tf

    gpu = cfg.gpus > 0
    dtype = tf.float16 if gpu and cfg.training.mixed_precision else tf.float32
    device = "/GPU:0" if gpu else "/CPU:0"
    n = effort.matrix
    with tf.device(device):
        a = tf.random.uniform((n, n), dtype=dtype)
        b = tf.random.uniform((n, n), dtype=dtype)
        images = tf.random.uniform((64, 32, 32, 16), dtype=dtype)
        kernel = tf.random.uniform((3, 3, 16, 32), dtype=dtype)
        out = {
            "gemm_gflops": _best_rate(lambda: tf.linalg.matmul(a, b), 2 * n**3, effort),
            # a CNN's first layer at CIFAR's size: the kernel every image model starts with
            "conv_gflops": _best_rate(
                lambda: tf.nn.conv2d(images, kernel, 1, "SAME"), 2 * 64 * 32 * 32 * 32 * 9 * 16, effort
            ),
        }
    if gpu:
        host = tf.constant(0.0, shape=(16 << 20,))  # 64 MiB

        def copy() -> Any:
            with tf.device(device):
                return tf.identity(host)

        out["h2d_gb_s"] = _best_rate(copy, 64 << 20, effort)
    return out


def _best_rate(op: Callable[[], Any], work: float, effort: Effort) -> float:
    """Work per second (per 1e9) of the best of the timed windows, the result fetched in each."""
    start = time.perf_counter()
    op().numpy()  # warm-up: kernels chosen, memory allocated
    # A device so slow that one op outlasts a window (an emulated CPU: seconds per op) is measured in
    # one window: it spans many scheduler slices already, and the best of three would take minutes.
    windows = 1 if time.perf_counter() - start >= effort.window_seconds else effort.windows
    best = 0.0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < effort.window_seconds:
            result = op()
            count += 1
        result.numpy()  # a GPU runs ahead of Python: the window ends when its work does
        elapsed = time.perf_counter() - start
        best = max(best, count * work / elapsed / 1e9)
    return round(best, 3)


# ---------------------------------------------------------------- the strategy's all-reduce

# What is reduced when the model's size cannot be known before it trains (a model built lazily):
# the gradient bucket PyTorch's DDP and Horovod fuse to, a size at which a link runs near its rate.
DEFAULT_GRADIENT_BYTES = 25 << 20


def gradient_bytes(build_model: Callable[[], Any]) -> int:
    """Bytes of one gradient: the model's trainable weights at their dtypes, built once outside the
    strategy (training seeds and builds its own afterwards); a model built lazily has none yet."""
    import keras
    import numpy as np

    model = build_model()
    size = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in model.trainable_weights)
    del model
    keras.backend.clear_session()  # the run's own model gets the layer names it gets without preflight
    return size or DEFAULT_GRADIENT_BYTES


def allreduce_figures(strategy: Any, size: int, effort: Effort) -> dict[str, float]:
    """The strategy's own collective (what every mirrored step runs) on a gradient of `size` bytes:
    its bus bandwidth, nccl-tests' convention (algorithm bandwidth x 2(n-1)/n), which a ring that
    runs at its links' speed reaches whatever n is. Every worker takes part in every reduction, so
    the count is fixed, not timed."""
    import tensorflow as tf

    n = strategy.num_replicas_in_sync
    if n < 2:
        return {}
    with strategy.scope():
        value = tf.ones([max(size // 4, 1)], dtype=tf.float32)

    @tf.function
    def reduce() -> Any:
        def replica() -> Any:
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

        return strategy.experimental_local_results(strategy.run(replica))[0][0]

    reduce().numpy()  # warm-up: the ring is formed, the function traced
    best = float("inf")
    for _ in range(effort.windows):
        start = time.perf_counter()
        for _ in range(effort.reductions):
            reduce().numpy()
        best = min(best, (time.perf_counter() - start) / effort.reductions)
    bus = size / best * 2 * (n - 1) / n / 1e9
    return {"allreduce_gb_s": round(bus, 3), "allreduce_mb": round(size / 1e6, 1)}


# ---------------------------------------------------------------- links


def link_peers(cfg: NodeConfig) -> list[str]:
    """Whom this node measures its link to: every ps from the chief and workers (the transfers a step
    makes under parameter servers), the next worker around the ring under multi_worker_mirrored."""
    if cfg.strategy == "parameter_server":
        return [] if cfg.role == "ps" else [f"ps-{i}" for i in range(len(cfg.peers.get("ps", [])))]
    workers = len(cfg.peers.get("worker", []))
    return [f"worker-{(cfg.index + 1) % workers}"] if workers > 1 else []


class Sink:
    """A TCP server that takes and returns bytes, one peer at a time, so that a figure is one flow's."""

    def __init__(self, host: str, port: int):
        self.server = socket.create_server((host, port), reuse_port=False)
        self.address = f"{host}:{self.server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            with conn, contextlib.suppress(OSError):  # a peer that left mid-transfer: its loss
                _answer(conn)

    def close(self) -> None:
        self.server.close()


def _answer(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    kind, count = conn.recv(1), int.from_bytes(_exactly(conn, 8), "big")
    if kind == b"P":
        conn.sendall(b"G")
        for _ in range(count):
            conn.sendall(_exactly(conn, 1))
        return
    seconds = int.from_bytes(_exactly(conn, 4), "big") / 1000
    conn.sendall(b"G")
    got = _drain(conn)  # to the peer's half-close: it stops at its bytes or its seconds
    conn.sendall(b"R" + got.to_bytes(8, "big"))
    _pour(conn, count, seconds)
    conn.shutdown(socket.SHUT_WR)


def measure_link(peer: str, address: str, effort: Effort) -> Link:
    """Bytes each way (up to the effort's bytes, or its seconds on a slow link), then round trips."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ms = int(effort.link_seconds * 1000)
        conn.sendall(b"B" + effort.link_bytes.to_bytes(8, "big") + ms.to_bytes(4, "big"))
        _exactly(conn, 1)  # its turn: the sink serves one peer at a time
        start = time.perf_counter()
        _pour(conn, effort.link_bytes, effort.link_seconds)
        conn.shutdown(socket.SHUT_WR)
        _exactly(conn, 1)
        sent = time.perf_counter()  # the sink has every byte: what sat in buffers is counted
        arrived = int.from_bytes(_exactly(conn, 8), "big")
        received = _drain(conn)
        done = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"P" + effort.pings.to_bytes(8, "big"))
        _exactly(conn, 1)
        rtts = []
        for _ in range(effort.pings):
            t = time.perf_counter()
            conn.sendall(b"p")
            _exactly(conn, 1)
            rtts.append(time.perf_counter() - t)
    return Link(
        peer=peer,
        send_mb_s=round(arrived / 1e6 / (sent - start), 1),
        receive_mb_s=round(received / 1e6 / (done - sent), 1),
        latency_ms=round(statistics.median(rtts) * 1000, 3),
    )


# Small enough that a slow link's pour stops near its seconds (one chunk past them at most), large
# enough that a fast one's is not a syscall per few kilobytes.
CHUNK = 256 << 10


def _pour(conn: socket.socket, count: int, seconds: float) -> None:
    block = bytes(CHUNK)
    deadline = time.perf_counter() + seconds
    while count > 0 and time.perf_counter() < deadline:
        conn.sendall(block[: min(count, CHUNK)])
        count -= min(count, CHUNK)


def _drain(conn: socket.socket) -> int:
    """Bytes read until the peer's half-close."""
    buffer, total = bytearray(CHUNK), 0
    while got := conn.recv_into(buffer, CHUNK):
        total += got
    return total


def _exactly(conn: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        got = conn.recv(count - len(data))
        if not got:
            raise ConnectionError("the peer closed the link")
        data += got
    return data


# ---------------------------------------------------------------- input


def input_figures(cfg: NodeConfig, effort: Effort) -> dict[str, float]:
    """MB/s reading the run's data files (the first ones, up to the effort's bytes); nothing to read
    for a data set inside the program (the built-in digits)."""
    if cfg.data is None:
        return {}
    directory, _, name = cfg.data.url.rpartition("/")
    glob = next((i for i, ch in enumerate(name) if ch in "*?["), len(name))
    store = open_store(directory, cfg.data.endpoint_url, cfg.data.region)
    read, start = 0, time.perf_counter()
    for listed in store.files(name[:glob])[:64]:
        data = store.get_bytes(listed.name)
        read += len(data or b"")
        if read >= effort.input_bytes:
            break
    elapsed = time.perf_counter() - start
    return {"input_mb_s": round(read / 1e6 / elapsed, 1)} if read else {}


# ---------------------------------------------------------------- versions and limits


def versions(gpus: int) -> dict[str, str]:
    """Every installed package, the Python, the kernel and, on GPU nodes, CUDA, cuDNN and the driver."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():  # in sys.path order: the first of a name is what imports
        if name := dist.metadata["Name"]:
            out.setdefault(f"package {name.lower()}", dist.version)
    out["python"] = platform.python_version()
    out["kernel"] = platform.release()
    if "tensorflow" in sys.modules and hasattr(sys.modules["tensorflow"], "sysconfig"):
        build = sys.modules["tensorflow"].sysconfig.get_build_info()
        for key in ("cuda_version", "cudnn_version"):
            if build.get(key):
                out[key.replace("_version", "")] = str(build[key])
    if gpus:
        from dlinfra.node.devices import driver_version

        if driver := driver_version():
            out["nvidia driver"] = driver
    return out


def machine_id(boot_id: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    """Which machine (kernel) this process runs on: processes that stand in for instances share one."""
    try:
        return boot_id.read_text().strip()
    except OSError:
        return socket.gethostname()


def cpu_quota(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPUs this process's cgroup lets it use (CFS quota / period), None where none limits it."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):  # cgroup v1
            quota = root / "cpu" / path.lstrip("/")
            try:
                us = int((quota / "cpu.cfs_quota_us").read_text())
                period = int((quota / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                return None
            return round(us / period, 3) if us > 0 else None
        if controllers == "":  # cgroup v2
            try:
                limit, interval = (root / path.lstrip("/") / "cpu.max").read_text().split()
            except (OSError, ValueError):
                continue
            return None if limit == "max" else round(int(limit) / int(interval), 3)
    return None

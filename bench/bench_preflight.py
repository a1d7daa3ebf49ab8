"""Preflight, side by side in one run:

- quick preflight's time on local clusters of 1, 3 and 8 nodes (multi_worker_mirrored: N workers),
  from the chief's `peers` phase to its `preflight` phase (rounds, turns and the verdict included).
  Local nodes share one machine, so they measure in turn: on machines of their own they measure at
  once and the time is about one node's;
- the gemm figure preflight reports next to a plain `tf.linalg.matmul` loop of the same size, and
  its link figure next to a plain socket transfer of the same bytes over loopback: the goal is
  preflight's figures within 10 % of the plain programs (it measures the hardware, not itself).

    python bench/bench_preflight.py [--nodes 1,3,8] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def preflight_seconds(nodes: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, DLINFRA_HOME=f"{tmp}/home")
        args = ["deploy", "--workers", str(nodes), "--steps", "20", "--strategy", "multi_worker_mirrored"]
        args += ["--set", "cluster.preflight=quick"]
        done = subprocess.run(
            [sys.executable, "-m", "dlinfra", *args], env=env, cwd=tmp, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(done.stdout + done.stderr)
        status = next(Path(tmp, "home", "runs").glob("*/store/status/worker-0.json"))
        phases = json.loads(status.read_text())["phases"]
        return phases["preflight"] - phases["peers"]


def plain_matmul(n: int, seconds: float) -> float:
    import tensorflow as tf

    a, b = tf.random.uniform((n, n)), tf.random.uniform((n, n))
    tf.linalg.matmul(a, b).numpy()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        c = tf.linalg.matmul(a, b)
        count += 1
    c.numpy()
    return count * 2 * n**3 / (time.perf_counter() - start) / 1e9


def plain_socket(nbytes: int) -> float:
    """MB/s of one sendall of `nbytes` to a plain receiving loop, over loopback."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def receive() -> None:
        conn, _ = server.accept()
        buffer, left = bytearray(1 << 20), nbytes
        while left:
            left -= conn.recv_into(buffer, min(left, len(buffer)))
        conn.sendall(b"k")
        conn.close()

    thread = threading.Thread(target=receive)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        data = bytes(nbytes)
        start = time.perf_counter()
        conn.sendall(data)
        conn.recv(1)
        elapsed = time.perf_counter() - start
    thread.join()
    server.close()
    return nbytes / 1e6 / elapsed


def preflight_figures() -> tuple[float, float]:
    """Preflight's own gemm figure and link figure (send), with quick's sizes, in this process."""
    import tensorflow as tf

    from dlinfra.node.measure import EFFORT, Sink, _best_rate, measure_link

    effort = EFFORT["quick"]
    n = effort.matrix
    a, b = tf.random.uniform((n, n)), tf.random.uniform((n, n))
    gemm = _best_rate(lambda: tf.linalg.matmul(a, b), 2 * n**3, effort)
    sink = Sink("127.0.0.1", 0)
    try:
        link = measure_link("peer", sink.address, effort)
    finally:
        sink.close()
    return gemm, link.send_mb_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="1,3,8")
    parser.add_argument("--reps", type=int, default=3)
    opts = parser.parse_args()
    from dlinfra.node.measure import EFFORT

    effort = EFFORT["quick"]
    print("quick preflight, local cluster (nodes measure in turn on one machine)")
    for nodes in [int(n) for n in opts.nodes.split(",")]:
        took = preflight_seconds(nodes)
        print(f"  {nodes} node(s): {took:.1f} s")
    print(f"figures, {opts.reps} repetitions each (mean ± sd)")
    mine = [preflight_figures() for _ in range(opts.reps)]
    plain_gemm = [
        plain_matmul(effort.matrix, effort.windows * effort.window_seconds) for _ in range(opts.reps)
    ]
    plain_link = [plain_socket(effort.link_bytes) for _ in range(opts.reps)]
    for label, ours, plain in [
        (f"gemm {effort.matrix}² GFLOP/s", [m[0] for m in mine], plain_gemm),
        (f"link {effort.link_bytes >> 20} MiB MB/s", [m[1] for m in mine], plain_link),
    ]:
        a, b = statistics.mean(ours), statistics.mean(plain)
        print(
            f"  {label:<22} preflight {a:8.1f} ± {statistics.pstdev(ours):6.1f}   plain {b:8.1f} ± "
            f"{statistics.pstdev(plain):6.1f}   ratio {a / b:.2f}"
        )


if __name__ == "__main__":
    main()

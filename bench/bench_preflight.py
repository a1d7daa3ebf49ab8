"""Preflight, side by side in one run:

- quick preflight's time on local clusters of 1, 3 and 8 nodes (multi_worker_mirrored: N workers),
  from the chief's `peers` phase to its `preflight` phase (rounds, turns, the all-reduce and the
  verdict included), and full's at 3. Local nodes share one machine, so they measure in turn: on
  machines of their own they measure at once and the time is about one node's;
- the gemm figure preflight reports next to a plain `tf.linalg.matmul` loop of the same size, and
  its link figure next to a plain socket transfer of the same bytes over loopback, like for like:
  the plain gemm keeps the best of as many windows of the same length, the plain transfer is one
  transfer as preflight's is; the goal is preflight's figures within 10 % of the plain programs'
  (it measures the hardware, not itself).

    python bench/bench_preflight.py [--nodes 1,3,8] [--full 3] [--reps 5]
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


def preflight_seconds(nodes: int, checks: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, DLINFRA_HOME=f"{tmp}/home")
        args = ["deploy", "--workers", str(nodes), "--steps", "20", "--strategy", "multi_worker_mirrored"]
        # warn: a time is wanted whatever the verdict (8 processes on 2 cores differ by a third)
        args += ["--set", f"cluster.preflight={{checks: {checks}, on_fail: warn}}"]
        done = subprocess.run(
            [sys.executable, "-m", "dlinfra", *args], env=env, cwd=tmp, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(done.stdout + done.stderr)
        status = next(Path(tmp, "home", "runs").glob("*/store/status/worker-0.json"))
        phases = json.loads(status.read_text())["phases"]
        return phases["preflight"] - phases["peers"]


def plain_matmul(n: int, windows: int, seconds: float) -> float:
    """GFLOP/s of the best of `windows` timed loops of `seconds` each."""
    import tensorflow as tf

    a, b = tf.random.uniform((n, n)), tf.random.uniform((n, n))
    tf.linalg.matmul(a, b).numpy()
    best = 0.0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            c = tf.linalg.matmul(a, b)
            count += 1
        c.numpy()
        best = max(best, count * 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


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
    parser.add_argument("--full", default="3")
    parser.add_argument("--reps", type=int, default=5)
    opts = parser.parse_args()
    from dlinfra.node.measure import EFFORT

    effort = EFFORT["quick"]
    print("preflight's time, local cluster (nodes measure in turn on one machine)")
    for checks, counts in (("quick", opts.nodes), ("full", opts.full)):
        for nodes in [int(n) for n in counts.split(",") if n]:
            print(f"  {checks} {nodes} node(s): {preflight_seconds(nodes, checks):.1f} s")
    print(f"figures, {opts.reps} repetitions each, interleaved (median, min-max)")
    mine, plain_gemm, plain_link = [], [], []
    for _ in range(opts.reps):  # interleaved: a busy moment of the machine falls on both sides
        mine.append(preflight_figures())
        plain_gemm.append(plain_matmul(effort.matrix, effort.windows, effort.window_seconds))
        plain_link.append(plain_socket(effort.link_bytes))
    for label, ours, plain in [
        (f"gemm {effort.matrix}² GFLOP/s", [m[0] for m in mine], plain_gemm),
        (f"link {effort.link_bytes >> 20} MiB MB/s", [m[1] for m in mine], plain_link),
    ]:
        a, b = statistics.median(ours), statistics.median(plain)
        print(
            f"  {label:<22} preflight {a:8.1f} ({min(ours):.1f}-{max(ours):.1f})   plain {b:8.1f} "
            f"({min(plain):.1f}-{max(plain):.1f})   ratio {a / b:.2f}"
        )


if __name__ == "__main__":
    main()

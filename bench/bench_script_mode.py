"""Script mode's cost: the same hand-written parameter-server program (bench/programs/ps_throughput.py)
started by hand with TF_CONFIG, and run by `dlinfra deploy` in script mode (beacon, agent, progress
reports, checkpoint and TensorBoard syncs, the store), side by side, alternating, in one run. The
program measures its own examples/s after a warm-up, so startup is not in that figure; the wall time
from the command to the result is shown beside it, and the program's own startup too.

By hand, the program runs in the very environment dlinfra made for the run (its python), on this
machine's loopback; dlinfra's run is a local deploy, in its own network namespace (the default) and
on this machine's network (`cluster.local_network: host`).

    python bench/bench_script_mode.py [--reps 3] [--workers 2] [--calls 60]
    python bench/bench_script_mode.py --startup-only [--reps 3]   # Program against script: first step
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from dlinfra.render.addresses import free_ports  # noqa: E402

PROGRAM = ROOT / "bench" / "programs" / "ps_throughput.py"


def by_hand(python: str, workers: int, calls: int, scratch: Path) -> dict[str, float]:
    roles = [("chief", 0)] + [("worker", i) for i in range(workers)] + [("ps", 0)]
    ports = free_ports(len(roles))
    cluster: dict[str, list[str]] = {}
    for role, _ in roles:
        cluster.setdefault(role, []).append(f"127.0.0.1:{next(ports)}")
    started = time.perf_counter()
    procs = {}
    for role, index in roles:
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}),
        )
        env.pop("DLINFRA_PROGRESS_FILE", None)
        log = open(scratch / f"{role}-{index}.log", "wb")  # noqa: SIM115 - closed with the process
        procs[(role, index)] = (
            subprocess.Popen(
                [python, str(PROGRAM), "--calls", str(calls)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=scratch,
            ),
            log,
        )
    chief, _ = procs[("chief", 0)]
    chief.wait(timeout=900)
    wall = time.perf_counter() - started
    for proc, log in procs.values():
        proc.kill()
        proc.wait()
        log.close()
    return _result((scratch / "chief-0.log").read_text(errors="replace"), wall)


def script_mode(workers: int, calls: int, scratch: Path, network: str) -> tuple[dict[str, float], str]:
    project = scratch / "project"
    project.mkdir()
    shutil.copy(PROGRAM, project / "train.py")
    (project / "experiment.yaml").write_text(
        "name: bench-script\nstrategy: parameter_server\n"
        f"cluster: {{ps: {{count: 1}}, local_network: {network}}}\ntraining:\n"
        f"  command: [python, train.py, --calls, '{calls}', --model_dir, $DLINFRA_MODEL_DIR]\n"
    )
    env = dict(os.environ, DLINFRA_HOME=str(scratch / "home"))
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlinfra",
            "deploy",
            str(project / "experiment.yaml"),
            "--workers",
            str(workers),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"deploy failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    [run_dir] = (scratch / "home" / "runs").iterdir()
    python = re.search(r"environment \(cpu\): .*: (\S+)", done.stdout + done.stderr)
    assert python, done.stdout
    python_bin = str(Path(python.group(1)) / "bin" / "python")
    return _result((run_dir / "logs" / "chief-0.log").read_text(errors="replace"), wall), python_bin


def startup(kind: str, scratch: Path) -> float:
    """Seconds from `dlinfra deploy` to the first step, as its result table says: the built-in
    digits Program, or TensorFlow's MWMS custom-loop guide in script mode (its first report), both
    multi_worker_mirrored on 2 workers."""
    project = scratch / "project"
    project.mkdir()
    body = "name: bench-startup\nstrategy: multi_worker_mirrored\ntraining:\n"
    if kind == "script":
        from sklearn.datasets import load_digits

        d = load_digits()
        np.savez(project / "digits.npz", x_train=d.images, y_train=d.target)
        shutil.copy(ROOT / "tests" / "data" / "scripts" / "mwms_custom_loop.py", project / "train.py")
        # its checkpoints where dlinfra keeps them: the guide's default, /tmp/ckpt, outlives a run, and
        # the next run on this machine resumes from it and trains nothing
        body += (
            "  command: [python, train.py, --data, digits.npz, --checkpoint_dir, $DLINFRA_CHECKPOINT_DIR,\n"
            "            --report]\n"
        )
    else:
        body += "  steps: 60\n"
    (project / "experiment.yaml").write_text(body)
    done = subprocess.run(
        [sys.executable, "-m", "dlinfra", "deploy", str(project / "experiment.yaml"), "--workers", "2"],
        env=dict(os.environ, DLINFRA_HOME=str(scratch / "home")),
        capture_output=True,
        text=True,
        timeout=900,
    )
    found = re.search(r"command to first step\s*\|\s*([\d.]+) s", done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"deploy failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return float(found.group(1))


def _result(log: str, wall: float) -> dict[str, float]:
    found = re.findall(r"^RESULT (.*)$", log, flags=re.M)
    if not found:
        raise SystemExit(f"no RESULT line in the chief's log:\n{log[-3000:]}")
    return json.loads(found[-1]) | {"wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--startup-only", action="store_true", help="only the time to the first step")
    args = parser.parse_args()
    if args.startup_only:
        return startup_table(args.reps)
    modes = ["script mode", "by hand", "script mode, host network"]
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    python = None
    with tempfile.TemporaryDirectory(prefix="bench-script-") as tmp:
        for rep in range(args.reps):
            # script mode first in the first rep: it makes (or finds) the environment by hand runs in
            for mode in modes if rep % 2 == 0 else modes[::-1]:
                scratch = Path(tmp) / f"{rep}-{mode.replace(' ', '-').replace(',', '')}"
                scratch.mkdir()
                if mode.startswith("script mode"):
                    network = "host" if "host" in mode else "private"
                    found, python = script_mode(args.workers, args.calls, scratch, network)
                else:
                    assert python is not None
                    found = by_hand(python, args.workers, args.calls, scratch)
                results[mode].append(found)
                print(f"rep {rep + 1} {mode:25s}: {found['examples_per_sec']:8.0f} examples/s, "
                      f"wall {found['wall']:.1f} s", flush=True)  # fmt: skip
    print(f"\n1 chief + {args.workers} workers + 1 ps, {args.calls} calls of 10 steps of 64 examples\n")
    print("| started | examples/s (mean ± sd) | wall s, command to result (mean) |")
    print("|---|---|---|")
    for mode, found in results.items():
        rates = [f["examples_per_sec"] for f in found]
        sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
        wall = statistics.mean(f["wall"] for f in found)
        print(f"| {mode} | {statistics.mean(rates):.0f} ± {sd:.0f} | {wall:.1f} |")
    hand = statistics.mean(f["examples_per_sec"] for f in results["by hand"])
    for mode in (m for m in modes if m != "by hand"):
        ratio = statistics.mean(f["examples_per_sec"] for f in results[mode]) / hand
        print(f"{mode} / by hand, examples/s: {ratio:.3f}")


def startup_table(reps: int) -> None:
    seconds: dict[str, list[float]] = {"program": [], "script": []}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for rep in range(reps):
            for kind in ("program", "script") if rep % 2 == 0 else ("script", "program"):
                scratch = Path(tmp) / f"{rep}-{kind}"
                scratch.mkdir()
                seconds[kind].append(startup(kind, scratch))
                print(f"rep {rep + 1} {kind}: {seconds[kind][-1]:.1f} s to the first step", flush=True)
    print("\n| multi_worker_mirrored, 2 workers | command to first step, s (mean ± sd) |")
    print("|---|---|")
    for kind, found in seconds.items():
        sd = statistics.stdev(found) if len(found) > 1 else 0.0
        print(f"| {kind} | {statistics.mean(found):.1f} ± {sd:.1f} |")


if __name__ == "__main__":
    main()

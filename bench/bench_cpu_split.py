"""Where the CPU goes while a `dlinfra deploy` trains: each process of the tree (the CLI, the private
network helper, each node's beacon and trainer), as a share of one core, over a window of the
training between two progress lines of worker 0 (of the chief under parameter servers). Start-up,
export and evaluation are left out (the CPU column of bench_anchors.py includes them). A harness that
costs throughput shows here as CPU outside the trainers.

    python bench/bench_cpu_split.py [--model resnet20|digits] [--strategy multi_worker_mirrored]
                                    [--workers 1] [--from-step 40] [--to-step 140] [--jit]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_anchors import BATCH, MODELS, STEPS_PER_CALL

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> dict[int, tuple[float, str]]:
    """pid → (CPU seconds so far, what it is) for `root` and all its descendants."""
    table: dict[int, tuple[int, float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended between the listing and the read
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, cmd)
    members, grown = {root}, True
    while grown:
        grown = False
        for pid, (ppid, _, _) in table.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grown = True
    return {pid: (table[pid][1], shown(pid, table)) for pid in members if pid in table}


def shown(pid: int, table: dict[int, tuple[int, float, str]]) -> str:
    """A node's process as its node and part (its beacon forks the trainer, whose command line is
    the beacon's), any other by its command line."""
    ppid, _, cmd = table[pid]
    words = cmd.split()
    if words[1:5] != ["-m", "dlinfra", "node", "run"]:
        return cmd[:100]
    part = "trainer" if table.get(ppid, (0, 0.0, ""))[2] == cmd else "beacon"
    return f"{Path(words[5]).stem} {part}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default="resnet20", choices=sorted(MODELS))
    parser.add_argument("--strategy", default="multi_worker_mirrored")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--from-step", type=int, default=40)
    parser.add_argument("--to-step", type=int, default=140)
    parser.add_argument("--jit", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp())
    training = {**MODELS[args.model], "batch_size": BATCH, "learning_rate": 0.001}
    steps = args.to_step + 20
    training |= {"steps": steps, "checkpoint_every": steps, "jit_compile": args.jit}
    training |= {"log_every": STEPS_PER_CALL, "steps_per_execution": STEPS_PER_CALL}
    spec = home / "exp.yaml"
    spec.write_text(json.dumps({"name": "cpu-split", "strategy": args.strategy, "training": training}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlinfra", "deploy", str(spec), "--workers", str(args.workers)],
        env=dict(os.environ, DLINFRA_HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # never block the CLI on a full pipe
    marks, wanted = [], [args.from_step, args.to_step]
    reporter = "chief-0" if args.strategy == "parameter_server" else "worker-0"  # who logs the steps
    while wanted and proc.poll() is None:
        logs = list(home.glob(f"runs/*/logs/{reporter}.log"))
        steps = re.findall(r" step (\d+)/", logs[0].read_text(errors="replace")) if logs else []
        if steps and int(steps[-1]) >= wanted[0]:
            marks.append((time.time(), int(steps[-1]), tree_cpu(proc.pid)))
            wanted.pop(0)
        time.sleep(0.05)
    proc.wait()
    if len(marks) < 2:
        sys.exit(f"the run ended (exit {proc.returncode}) before step {args.to_step}; see {home}/runs")
    (t1, s1, before), (t2, s2, after) = marks
    wall = t2 - t1
    print(f"{args.model} {args.strategy} {args.workers} worker(s): steps {s1}→{s2} in {wall:.1f} s")
    print(f"{'% of a core':>12}  process")
    for pid, (cpu, cmd) in sorted(after.items(), key=lambda kv: before.get(kv[0], (0.0, ""))[0] - kv[1][0]):
        used = cpu - before.get(pid, (0.0, ""))[0]
        print(f"{100 * used / wall:>12.1f}  {cmd}")


if __name__ == "__main__":
    main()

"""Issue 56's acceptance for restarts: kill -9 the script of a random worker of a 2-worker script-mode
run, mid-training, N times; each run must end DONE with the restart in its result table (the killed
node, its cause, where it resumed, the seconds lost). MWMS runs TensorFlow's custom-loop guide
(tests/data/scripts/mwms_custom_loop.py, on digits, checkpoints in $DLINFRA_CHECKPOINT_DIR); ps runs
TensorFlow's parameter-server guide (tests/data/scripts/ps_coordinator.py, one ps; 200 epochs, long
enough for the killed worker to serve again before the other one has done them all). Which worker and
when (the step, or the chief's finished epoch) come from --seed.

A run that fails on the checkpoint pull's temporary files (`.pulling`, a race another change fixes)
is counted apart.

    python bench/bench_restarts.py --kills 5 --strategy mwms [--seed 56]
    python bench/bench_restarts.py --kills 5 --strategy ps
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "data" / "scripts"
sys.path[:0] = [str(ROOT / "tests")]

from support import digits_beside  # noqa: E402

RUN_SECONDS = 900

SPECS = {
    "mwms": (
        "mwms_custom_loop.py",
        "name: bench-restarts-mwms\nstrategy: multi_worker_mirrored\ntraining:\n"
        "  command: [python, train.py, --data, digits.npz, --checkpoint_dir, $DLINFRA_CHECKPOINT_DIR,\n"
        "            --epochs, 4, --steps_per_epoch, 30, --report]\n",
    ),
    "ps": (
        "ps_coordinator.py",
        "name: bench-restarts-ps\nstrategy: parameter_server\ncluster: {ps: {count: 1}}\ntraining:\n"
        "  command: [python, train.py, --epochs, 200]\n",
    ),
}


@dataclass
class Kill:
    node: str
    at: str  # when it was killed: the chief's step or finished epoch
    state: str = "?"  # DONE | FAILED | STOPPED | TIMEOUT | NOT KILLED
    shown: bool = False  # the result table's restarts row names the killed node
    line: str = ""  # the killed node's restart line, as the result says it
    seconds_lost: float | None = None
    pulling: bool = False  # failed on the checkpoint pull's temporary files
    wall: float = 0.0


def project(scratch: Path, strategy: str) -> Path:
    script, spec = SPECS[strategy]
    where = scratch / "project"
    if not where.exists():
        where.mkdir(parents=True)
        shutil.copy(SCRIPTS / script, where / "train.py")
        (where / "experiment.yaml").write_text(spec)
        if strategy == "mwms":
            digits_beside(where)
    return where


def _state(run_dir: Path, node: str) -> dict[str, object]:
    try:
        return json.loads((run_dir / "work" / node / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _reached(run_dir: Path, strategy: str, point: int) -> bool:
    if strategy == "mwms":
        return int(_state(run_dir, "worker-0").get("step") or 0) >= point  # type: ignore[call-overload]
    log = run_dir / "logs" / "chief-0.log"
    return log.exists() and f"Finished epoch {point}," in log.read_text(errors="replace")


def one_kill(scratch: Path, strategy: str, rng: random.Random) -> Kill:
    home = scratch / "home"
    node = f"worker-{rng.randrange(2)}"
    point = rng.randint(35, 100) if strategy == "mwms" else rng.randint(1, 5)
    kill = Kill(node, f"step {point}" if strategy == "mwms" else f"epoch {point}")
    before = set((home / "runs").glob("*")) if (home / "runs").exists() else set()
    env = dict(os.environ, DLINFRA_HOME=str(home))
    started = time.monotonic()
    spec = str(project(scratch, strategy) / "experiment.yaml")
    output = scratch / f"deploy-{len(before)}.out"  # a file: a pipe left unread would fill and block it
    with output.open("w") as sink:
        deploy = subprocess.Popen(
            [sys.executable, "-m", "dlinfra", "deploy", spec, "--workers", "2"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    run_dir = None
    try:
        while time.monotonic() - started < RUN_SECONDS and deploy.poll() is None:
            new = (
                [d for d in (home / "runs").glob("*") if d not in before] if (home / "runs").exists() else []
            )
            run_dir = new[0] if new else None
            state = _state(run_dir, node) if run_dir else {}
            if run_dir and state.get("state") == "running" and _reached(run_dir, strategy, point):
                os.kill(int(state["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
                break
            time.sleep(0.1)
        else:
            kill.state = "NOT KILLED"
        deploy.wait(timeout=max(1.0, RUN_SECONDS - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        os.killpg(deploy.pid, signal.SIGINT)  # the deploy's Ctrl-C tears its nodes down
        deploy.wait(timeout=120)
        kill.state = "TIMEOUT"
    kill.wall = time.monotonic() - started
    out = output.read_text(errors="replace")
    if kill.state == "?":
        ended = re.search(r"\brun \S+?:? (DONE|FAILED|STOPPED)\b", out)
        kill.state = ended.group(1) if ended else "?"
    kill.pulling = ".pulling" in out and "FileNotFoundError" in out
    said = re.search(rf"restart: ({node} restarted \(killed by signal 9\)[^\n]*)", out)
    kill.line = said.group(1) if said else ""
    kill.shown = bool(re.search(rf"restarts\W+\d+ \([^)]*{node}", out)) and said is not None
    lost = re.search(r"; ([\d.]+) s lost", kill.line)
    kill.seconds_lost = float(lost.group(1)) if lost else None
    if kill.state == "DONE" and kill.shown:
        output.unlink()  # what is left in the scratch dir is what went wrong
    return kill


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--strategy", choices=sorted(SPECS), default="mwms")
    parser.add_argument("--seed", type=int, default=56)
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir (runs, their outputs)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    scratch = Path(tempfile.mkdtemp(prefix=f"bench-restarts-{args.strategy}-"))
    kills = []
    for i in range(args.kills):
        kill = one_kill(scratch, args.strategy, rng)
        kills.append(kill)
        print(
            f"kill {i + 1}/{args.kills}: {kill.node} at {kill.at}: {kill.state} in {kill.wall:.0f} s, "
            f"restart {'shown' if kill.shown else 'NOT shown'}"
            + (" (.pulling FileNotFoundError)" if kill.pulling else "")
            + (f": {kill.line}" if kill.line else ""),
            flush=True,
        )
    done = sum(k.state == "DONE" for k in kills)
    shown = sum(k.state == "DONE" and k.shown for k in kills)
    lost = [k.seconds_lost for k in kills if k.seconds_lost is not None]
    spread = f"median {statistics.median(lost):.1f} s, max {max(lost):.1f} s" if lost else "-"
    print(
        f"{args.strategy}, seed {args.seed}: {done}/{len(kills)} DONE, {shown}/{len(kills)} with the restart "
        f"in the result table; {sum(k.pulling for k in kills)} failed on .pulling; seconds lost {spread}; "
        f"wall median {statistics.median(k.wall for k in kills):.0f} s"
    )
    if args.keep or shown < len(kills):
        print(f"kept: {scratch} (deploy-N.out: the output of each run that went wrong)")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    if shown < len(kills):
        raise SystemExit(1)


if __name__ == "__main__":
    main()

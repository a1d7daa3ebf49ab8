"""What script mode's checkpoint sync leaves in the store and pulls on a restart (issue 56): TensorFlow's
MWMS custom-loop guide (tests/data/scripts/mwms_custom_loop.py, `CheckpointManager(max_to_keep=1)`)
saving one checkpoint per epoch for 40 epochs, through a real local deploy on 2 workers, one worker's
script killed with kill -9 at epoch 25.

Printed: what the script wrote over its life (the checkpoint directory watched every 0.1 s, and the
save count in the state file), what the store holds after the run (objects and bytes), and what each
restarted node pulled (files, from its log; bytes, those files' sizes in the store). Before this issue
the store kept every checkpoint that settled and a restart pulled all of them: that is the "wrote over
its life" row, and at the restart the checkpoints saved by then.

    python bench/bench_checkpoint_sync.py [--epochs 40] [--steps 20] [--kill-at 25]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from dlinfra.node.status import read_state, state_file  # noqa: E402
from support import digits_beside  # noqa: E402

GUIDE = ROOT / "tests" / "data" / "scripts" / "mwms_custom_loop.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--kill-at", type=int, default=25, help="the epoch worker-1's script is killed in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        scratch = Path(tmp)
        project = _project(scratch, args.epochs, args.steps)
        deploy = subprocess.Popen(
            [sys.executable, "-m", "dlinfra", "deploy", str(project / "experiment.yaml"), "--workers", "2"],
            env=dict(os.environ, DLINFRA_HOME=str(scratch / "home")),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        written: dict[str, int] = {}  # every file the script's checkpoint directory held, by name
        killed = False
        while deploy.poll() is None:
            runs = list((scratch / "home" / "runs").glob("*")) if (scratch / "home" / "runs").is_dir() else []
            if runs:
                run_dir = runs[0]
                _look(run_dir / "work" / "checkpoints", written)
                if not killed:
                    state = read_state(state_file(run_dir / "work" / "worker-1"))
                    step = (read_state(state_file(run_dir / "work" / "worker-0")) or {}).get("step", 0)
                    if state and state.get("state") == "running" and step >= args.kill_at * args.steps:
                        os.kill(int(state["pid"]), signal.SIGKILL)
                        killed = True
            time.sleep(0.1)
        out = deploy.stdout.read() if deploy.stdout else ""
        if deploy.returncode != 0 or not killed:
            raise SystemExit(f"deploy failed (rc {deploy.returncode}, killed {killed}):\n{out[-4000:]}")
        _report(run_dir, written, args)


def _project(scratch: Path, epochs: int, steps: int) -> Path:
    project = scratch / "project"
    project.mkdir()
    shutil.copy(GUIDE, project / "train.py")
    digits_beside(project)
    (project / "experiment.yaml").write_text(
        "name: bench-ckpt\nstrategy: multi_worker_mirrored\ntraining:\n"
        "  command: [python, train.py, --data, digits.npz, --checkpoint_dir, $DLINFRA_CHECKPOINT_DIR,\n"
        f"            --epochs, {epochs}, --steps_per_epoch, {steps},\n"
        "            --report]\n"
    )
    return project


def _look(directory: Path, written: dict[str, int]) -> None:
    try:
        for path in directory.iterdir():
            if path.is_file() and not path.name.startswith("."):
                written[path.name] = max(written.get(path.name, 0), path.stat().st_size)
    except OSError:
        pass  # not there yet, or a file removed while looked at


def _report(run_dir: Path, written: dict[str, int], args: argparse.Namespace) -> None:
    files = run_dir / "store" / "checkpoints" / "files"
    stored = {p.name: p.stat().st_size for p in files.rglob("*") if p.is_file()}
    state = stored.get("checkpoint", 0)
    one = sum(size for name, size in stored.items() if name != "checkpoint")  # the one checkpoint kept
    per = len(stored) - 1
    saves = int(re.findall(r"ckpt-(\d+)", (files / "checkpoint").read_text())[0])
    families = {m[1] for n in written if (m := re.fullmatch(r"(.+)\.(index|data-\d+-of-\d+)", n))}
    print(f"\nMWMS guide, 2 workers, {args.epochs} epochs of {args.steps} steps, max_to_keep=1, ", end="")
    print(
        f"kill -9 of worker-1 at epoch {args.kill_at}; {saves} saves, one checkpoint {one} bytes "
        f"in {per} files\n"
    )
    rows = [
        ("the script wrote over its life (seen)", len(families), len(written), sum(written.values())),
        ("before: every save kept (saves x one + state)", saves, saves * per + 1, saves * one + state),
        ("the store after the run", len({n for n in stored if n != "checkpoint"}) // max(per, 1), len(stored),
         sum(stored.values())),
    ]  # fmt: skip
    print("| | checkpoints | objects | bytes |\n|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
    print()
    for node in ("worker-0", "worker-1"):
        log = (run_dir / "logs" / f"{node}.log").read_text(errors="replace")
        for count in re.findall(r"restored (\d+) checkpoint files from the store", log):
            print(
                f"{node}'s restart pulled {count} files, {one + state} bytes if the newest and its state ",
                end="",
            )
            print(
                f"(before: every checkpoint saved by then, about {args.kill_at} x {per} files, "
                f"{args.kill_at * one} bytes)"
            )


if __name__ == "__main__":
    main()

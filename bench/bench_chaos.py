"""Issue 57's chaos soak: random faults injected into real runs, and the invariants checked by code
after each one (chaos_checks.py): the run ends DONE, or with a verdict naming a faulted node and its
cause, within a bound from its settings; the steps exact; a DONE model as good as the same cell's
fault-free run; the store's checkpoints whole; nothing left behind; every fault in the record.

Each run's shape and faults come from its own seed (chaos_plan.plan_run): a failure replays with
the replay command it prints. Local runs keep their store in S3 on the soak's moto server (so the store can go
down), except runs that cut a link, whose nodes sit in namespaces of their own and use a file store.

    python bench/bench_chaos.py --runs 60 --faults-per-run 3 --seed 57
    python bench/bench_chaos.py --runs 6 --target local --strategy ps --mode program --seed 7
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

import chaos_checks as checks  # noqa: E402
from chaos_faults import Injector, state  # noqa: E402
from chaos_plan import Cell, RunPlan, plan_run  # noqa: E402
from emulated_aws import terraform_rc  # noqa: E402

from dlinfra.contract import StoreConfig  # noqa: E402
from dlinfra.runs import incidents  # noqa: E402
from dlinfra.runs import restarts as restart_records  # noqa: E402
from dlinfra.runs.layout import RunStore  # noqa: E402
from metadata_stand_in import MetadataStandIn  # noqa: E402
from stoppable_moto import StoppableMoto, freeing_private_ips  # noqa: E402
from support import digits_beside  # noqa: E402

BUCKET = "chaos"
HEARTBEAT = (
    20.0  # cluster.heartbeat_timeout of every soak run: a lost node is named in a third of the default
)
PROGRAM_STEPS = {"ps": 1200, "mwms": 600}
SCRIPTS = {
    "mwms": ("mwms_custom_loop.py", 120, "  command: [python, train.py, --data, digits.npz, "
             "--checkpoint_dir, "
             "$DLINFRA_CHECKPOINT_DIR, --epochs, 4, --steps_per_epoch, 30, --report]\n"),
    "ps": ("ps_coordinator.py", 200, "  command: [python, train.py, --epochs, 200]\n"),
}  # fmt: skip
STRATEGIES = {"ps": "parameter_server", "mwms": "multi_worker_mirrored"}
STALL_TIMEOUT = 600.0  # cluster.stall_timeout, the default the soak keeps
HANGS = {"netcut", "freeze"}  # faults that leave every node alive and may leave TensorFlow waiting


class Moto(StoppableMoto):
    """The soak's moto server, its outages (an outage begun while one lasts extends it), clients of it."""

    def __init__(self) -> None:
        os.environ.setdefault("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
        # the soak reads its runs' stores through dlinfra's own store, with the fake keys moto takes
        os.environ.update(
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
        )
        super().__init__()
        self._lock, self.down_until = threading.Lock(), 0.0
        self.back = threading.Thread()  # the thread ending an outage: none yet
        from moto.ec2.models.instances import InstanceBackend

        terminate = InstanceBackend.terminate_instances
        InstanceBackend.terminate_instances = freeing_private_ips(terminate)  # type: ignore[method-assign]
        self.client("s3").create_bucket(Bucket=BUCKET)

    def outage(self, seconds: float) -> None:
        with self._lock:
            self.down_until = max(self.down_until, time.time() + seconds)
            if self.back.is_alive():
                return
            self.down()
            self.back = threading.Thread(target=self._come_back, daemon=True)
            self.back.start()

    def _come_back(self) -> None:
        while True:
            with self._lock:
                if time.time() >= self.down_until:
                    break
            time.sleep(0.1)
        self.up()

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip

    def ec2(self) -> Any:
        return self.client("ec2")


@dataclass
class Outcome:
    plan: RunPlan
    run_id: str = "?"
    state: str = "?"
    wall: float = 0.0
    bound: float = 0.0
    broken: list[str] = field(default_factory=list)
    accuracy: float | None = None
    lost_seconds: list[float] = field(default_factory=list)
    lost_steps: list[int] = field(default_factory=list)
    lived: int = 0  # incidents in the record: faults lived through without a restart
    verdict: str = ""  # a FAILED or STOPPED run's: its node and cause, as the marker says


def deploy_args(plan: RunPlan, scratch: Path, moto: Moto) -> tuple[list[str], dict[str, str], Path]:
    cell, project = plan.cell, scratch / f"project-{plan.cell.strategy}-{plan.cell.mode}"
    args = ["--workers", "2", "--strategy", STRATEGIES[cell.strategy],
            "--set", f"cluster.heartbeat_timeout={HEARTBEAT:g}",
            "--set", f"cluster.local_network={plan.network}"]  # fmt: skip
    if cell.mode == "program":
        steps = PROGRAM_STEPS[cell.strategy]
        args += ["--steps", str(steps), "--set", f"training.checkpoint_every={steps // 6}"]
    else:
        script, _, command = SCRIPTS[cell.strategy]
        if not project.exists():
            project.mkdir(parents=True)
            shutil.copy(ROOT / "tests" / "data" / "scripts" / script, project / "train.py")
            ps = "cluster: {ps: {count: 1}}\n" if cell.strategy == "ps" else ""
            (project / "experiment.yaml").write_text(f"name: chaos-script\n{ps}training:\n{command}")
            if cell.strategy == "mwms":
                digits_beside(project)
        args.insert(0, str(project / "experiment.yaml"))
    if cell.strategy == "ps" and cell.mode == "program":
        args += ["--set", "cluster.ps.count=1"]
    if any(f.kind == "spot" for f in plan.faults):
        args += ["--set", "cluster.workers.spot=true"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "DLINFRA_HOME": str(scratch / "home"),
    }  # fmt: skip
    if plan.network != "shaped":  # a namespace per node cannot reach the host's loopback moto
        args += ["--set", f"storage.url=s3://{BUCKET}/runs", "--set", f"storage.endpoint_url={moto.endpoint}"]
    if cell.target == "aws-emulated":
        ami = moto.ec2().describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        args += ["--target", "aws", "--endpoint-url", moto.endpoint, "--yes", "--emulate-instances",
                 "--set", f"aws.ami={ami}", "--set", "cluster.workers.gpus=0"]  # fmt: skip
        env["TF_CLI_CONFIG_FILE"] = str(terraform_rc(scratch))
    return args, env, project if cell.mode == "script" else scratch


def progress(run_dir: Path, plan: RunPlan) -> float:
    """The share of the run's steps the furthest node has reported (a script's epochs, for the ps guide)."""
    if plan.cell.mode == "script" and plan.cell.strategy == "ps":
        log = run_dir / "logs" / "chief-0.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return text.count("Finished epoch ") / SCRIPTS["ps"][1]
    total = PROGRAM_STEPS[plan.cell.strategy] if plan.cell.mode == "program" else SCRIPTS["mwms"][1]
    steps = [int(state(run_dir, p.name).get("step") or 0) for p in (run_dir / "work").glob("*")]
    return max(steps, default=0) / total


def new_run_dir(home: Path, before: set[Path]) -> Path | None:
    found = [p.parent for p in (home / "runs").glob("*/manifest.json") if p.parent not in before]
    return found[0] if found else None


def one_run(plan: RunPlan, scratch: Path, moto: Moto, base: Outcome | None) -> Outcome:
    out = Outcome(plan)
    home = scratch / "home"
    before = set((home / "runs").glob("*")) if (home / "runs").exists() else set()
    args, env, cwd = deploy_args(plan, scratch, moto)
    per_fault = HEARTBEAT * 2 + 90 + sum(f.seconds for f in plan.faults)
    out.bound = (base.wall * 1.5 if base else 600) + per_fault * len(plan.faults) + 60
    if any(f.kind in HANGS for f in plan.faults):  # TF may wait until the stall verdict
        out.bound += STALL_TIMEOUT
    with MetadataStandIn() as imds:
        env["DLINFRA_METADATA_ENDPOINT"] = imds.node_template()
        log = scratch / f"deploy-{plan.seed}.out"
        started = time.monotonic()
        with log.open("w") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "dlinfra", "deploy", *args], env=env, cwd=cwd,
                                    stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        run_dir, injector, pending = None, None, list(plan.faults)
        try:
            while proc.poll() is None and time.monotonic() - started < out.bound + 120:
                run_dir = run_dir or new_run_dir(home, before)
                if run_dir is not None and pending and progress(run_dir, plan) >= pending[0].at:
                    injector = injector or Injector(run_dir, moto, imds, moto.endpoint)
                    fault = pending.pop(0)
                    steps = (int(state(run_dir, n).get("step") or 0) for n in plan.nodes())
                    fault.step = max(steps, default=0)
                    injector.inject(fault)
                    at = time.strftime("%H:%M:%S", time.localtime(fault.injected_at or time.time()))
                    print(f"  {fault.label()}: injected at step {fault.step}, {at}", flush=True)
                time.sleep(0.05)
        except KeyboardInterrupt:  # the soak stopped: its run torn down first, while moto still answers
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=300)
            raise
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # a hang: Ctrl-C tears the cluster down
            proc.wait(timeout=300)
            out.broken.append(f"hung: still running after {out.bound + 120:.0f} s")
        if injector:
            injector.settle()
            told = {node for node, path in imds.answered if path.endswith("instance-action")}
            for fault in plan.faults:
                if fault.kind == "spot" and fault.node not in told:
                    # its beacon asked no more before its life ended (a restart with the cluster is a
                    # new session, which the stand-in answers as a new instance): no notice to record
                    fault.note = "never seen by its node"
                print(f"  {fault.label()}: {fault.note or 'as planned'}", flush=True)
                if fault.note == "never seen by its node" and fault.injected_at is not None:
                    for line in imds.story(fault.node or "", fault.injected_at):  # what explains it
                        print(f"    metadata: {line}", flush=True)
        out.wall = time.monotonic() - started
    run_dir = run_dir or new_run_dir(home, before)
    if run_dir is None:
        out.broken.append("no run dir: " + log.read_text(errors="replace")[-500:])
        return out
    out.run_id = run_dir.name
    judge(out, run_dir, moto, base)
    if not out.broken:
        log.unlink()
    return out


def judge(out: Outcome, run_dir: Path, moto: Moto, base: Outcome | None) -> None:
    plan = out.plan
    manifest = json.loads((run_dir / "manifest.json").read_text())
    store = RunStore.open(StoreConfig.model_validate(manifest["store"]))
    marker, metrics = store.marker(), store.metrics()
    out.state = marker.marker if marker else "NONE"
    if marker is not None and marker.marker != "DONE":  # kept in the output: the scratch goes at the end
        out.verdict = f" ({marker.node}: {(marker.error or marker.reason or '')[:200]})"
    out.broken += checks.outcome(plan, marker, metrics, out.wall, out.bound)
    torn, pointer_step = checks.store_consistent(store)
    out.broken += torn
    scripted = SCRIPTS["mwms"][1] if plan.cell.strategy == "mwms" else None  # the ps guide reports none
    total = PROGRAM_STEPS[plan.cell.strategy] if plan.cell.mode == "program" else scripted
    if out.state == "DONE":
        out.broken += checks.steps(plan, metrics, pointer_step, total)
        statuses = store.statuses(plan.nodes())
        lived = incidents.of_nodes(statuses.values())
        beat = max(1.0, min(10.0, HEARTBEAT / 4))  # render.configs: the nodes' heartbeat interval
        shown = restart_records.of_nodes(statuses.values())  # as the result shows them
        out.broken += checks.faults_named(plan, marker, metrics, lived, beat, shown)
        out.lived = len(lived)
        if plan.cell.mode == "program":
            out.accuracy = checks.model_accuracy(store)
            floor = (base.accuracy if base and base.accuracy else 0.9) - checks.ACCURACY_TOLERANCE
            if out.accuracy is None or out.accuracy < floor:
                out.broken.append(f"model accuracy {out.accuracy}, the fault-free run's floor {floor:.3f}")
    out.broken += checks.left_behind(out.run_id, store)
    if plan.cell.target == "aws-emulated":
        from e2e.conftest import left_of

        left = {k: v for k, v in left_of(moto.endpoint, out.run_id).items() if v}
        if left:
            out.broken.append(f"left in moto: {left}")
        locks = [str(p) for p in (run_dir / "terraform").rglob(".terraform.tfstate.lock.info")]
        if locks:
            out.broken.append(f"a terraform state lock left: {locks}")
    restarts = metrics.restarts if metrics else []
    for restart in restarts:
        if restart.resumed_at:
            out.lost_seconds.append(restart.resumed_at - restart.failed_at)
    for fault in plan.faults:  # a kill's cost: the steps from where it struck to where its node resumed
        after = [r for r in restarts if r.node == fault.node and r.restarted_at >= (fault.injected_at or 0)]
        if fault.kind.startswith("kill") and after and fault.step is not None:
            resumed = after[0].checkpoint_step if plan.cell.mode == "program" else after[0].first_step
            if resumed is not None:
                out.lost_steps.append(max(0, fault.step - resumed))
    for notice in metrics.interruptions if metrics else []:
        if notice.steps_lost is not None:
            out.lost_steps.append(notice.steps_lost)


def cells(args: argparse.Namespace) -> list[Cell]:
    pick = lambda value, every: every if value == "all" else [value]  # noqa: E731
    return [Cell(t, s, m) for t, s, m in itertools.product(
        pick(args.target, ["local", "aws-emulated"]), pick(args.strategy, ["ps", "mwms"]),
        pick(args.mode, ["program", "script"]))]  # fmt: skip


def table(outcomes: list[Outcome]) -> None:
    print(
        "\n| target/strategy/mode | runs | faults | DONE | right verdict | wrong "
        "| steps lost per fault (median, max) | s to training again (median, p95) | lived through, recorded |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(str(o.plan.cell), []).append(o)
    for cell, runs in sorted(by.items()):
        faults = sum(1 for o in runs for f in o.plan.faults if f.injected_at is not None)
        done = sum(o.state == "DONE" and not o.broken for o in runs)
        right = sum(o.state in ("FAILED", "STOPPED") and not o.broken for o in runs)
        lost = sorted(s for o in runs for s in o.lost_seconds)
        p95 = lost[math.ceil(0.95 * len(lost)) - 1] if lost else 0.0  # nearest rank
        spread = f"{statistics.median(lost):.1f}, {p95:.1f}" if lost else "-"
        steps = sorted(n for o in runs for n in o.lost_steps)
        steps_lost = f"{statistics.median(steps):g}, {max(steps)}" if steps else "-"
        print(
            f"| {cell} | {len(runs)} | {faults} | {done} | {right} "
            f"| {sum(bool(o.broken) for o in runs)} | {steps_lost} | {spread} "
            f"| {sum(o.lived for o in runs)} |"
        )


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # `kill` stops the soak as Ctrl-C does: the run under way torn down


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=57)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--faults-per-run", type=int, default=3)
    parser.add_argument("--target", choices=["local", "aws-emulated", "all"], default="local")
    parser.add_argument("--strategy", choices=["ps", "mwms", "all"], default="all")
    parser.add_argument("--mode", choices=["program", "script", "all"], default="all")
    parser.add_argument("--plan-only", action="store_true", help="print each run's faults and stop")
    args = parser.parse_args()
    grid = cells(args)
    plans = [plan_run(args.seed + i, grid[i % len(grid)], args.faults_per_run) for i in range(args.runs)]
    for plan in plans:
        print(f"seed {plan.seed} {plan.cell}: " + "; ".join(f.label() for f in plan.faults))
    if args.plan_only:
        return
    moto, scratch = Moto(), Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    bases: dict[str, Outcome] = {}
    outcomes = []
    for plan in plans:
        key = str(plan.cell)
        if key not in bases:
            bases[key] = one_run(RunPlan(plan.seed, plan.cell), scratch, moto, None)
            print(f"fault-free {key}: {bases[key].state} in {bases[key].wall:.0f} s, accuracy "
                  f"{bases[key].accuracy}" + (f"; BROKEN {bases[key].broken}" if bases[key].broken else ""),
                  flush=True)  # fmt: skip
        print(f"seed {plan.seed} {plan.cell}:", flush=True)
        out = one_run(plan, scratch, moto, bases[key])
        outcomes.append(out)
        verdict = "ok" if not out.broken else "WRONG: " + " | ".join(out.broken)
        ended = f"{out.run_id} {out.state}{out.verdict} in {out.wall:.0f} s"
        print(f"  -> {ended} (bound {out.bound:.0f}): {verdict}", flush=True)
    table(outcomes)
    wrong = [o for o in outcomes if o.broken]
    print(f"\nseeds {args.seed}..{args.seed + args.runs - 1}; wrong outcomes: {len(wrong)}")
    for o in wrong:
        c = o.plan.cell
        print(
            f"  replay: python bench/bench_chaos.py --runs 1 --seed {o.plan.seed} --faults-per-run "
            f"{args.faults_per_run} --target {c.target} --strategy {c.strategy} --mode {c.mode}"
        )
    print(f"kept: {scratch} (deploy-SEED.out of each run that went wrong)" if wrong else "")
    moto.stop()
    if not wrong:
        shutil.rmtree(scratch, ignore_errors=True)
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()

"""The chaos soak's own judgement. Its clock (bench/chaos_faults.py): a fault on a node's life is
timed from when it lands, not from when it was due. A new life can take seconds to come up (its
beacon's start waits out a store outage); bench_chaos seed 1113 stamped a spot notice 5 s before it
reached such a life, which was killed 60 ms after it, and the check called the notice missed by a
life that went on. Its step check (bench/chaos_checks.py): the final checkpoint is the last step's,
which under parameter servers may be a rerun call past the steps asked for (seed 300 of the slow
tier's soak: 1210 of 1200)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlinfra.node.status import state_file
from metadata_stand_in import MetadataStandIn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from chaos_checks import PER_CALL, _ended_soon, steps
from chaos_faults import Injector
from chaos_plan import Cell, Fault, RunPlan

from dlinfra.runs.records import Restart


@pytest.fixture
def life() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing in for the node's next life (only its pid is looked at)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _write_state(run_dir: Path, fields: dict[str, object]) -> None:
    path = state_file(run_dir / "work" / "worker-0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fields))


def test_a_notice_for_a_life_still_starting_is_timed_from_when_that_life_is_given_it(
    tmp_path: Path, life: subprocess.Popen[bytes]
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_state(
        tmp_path, {"pid": dead.pid, "started": time.time() - 30, "phases": {"spawned": time.time() - 31}}
    )
    with MetadataStandIn() as imds:
        injector = Injector(tmp_path, moto=None, imds=imds, endpoint="")
        fault = Fault(kind="spot", node="worker-0", at=0.3)
        injector.inject(fault)  # due now; the node's next life is not up yet
        due = fault.injected_at
        time.sleep(1.5)
        spawned = time.time()
        ask = urllib.request.Request(
            f"{imds.url}/worker-0/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        )
        urllib.request.urlopen(ask, timeout=5).read()  # the new life's beacon asks for its session
        _write_state(tmp_path, {"pid": life.pid, "started": spawned + 0.5, "phases": {"spawned": spawned}})
        landed_by = time.time()
        injector.settle()
    assert due is not None and fault.injected_at is not None
    assert fault.injected_at >= spawned > due + 1, "timed from when it was due, not from when it landed"
    assert fault.injected_at <= landed_by + 5
    # that life killed a moment after the notice reached it: a restart came first, not a missed notice
    killed = Restart(node="worker-0", life=2, cause="killed by signal 9", failed_at=fault.injected_at + 0.06,
                     restarted_at=fault.injected_at + 9)  # fmt: skip
    assert _ended_soon(fault, [killed])


def test_a_kill_waiting_for_a_life_is_timed_from_the_kill(
    tmp_path: Path, life: subprocess.Popen[bytes]
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_state(tmp_path, {"pid": dead.pid, "started": time.time() - 30})
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    injector = Injector(tmp_path, moto=None, imds=None, endpoint="")
    fault = Fault(kind="kill9", node="worker-0", at=0.4)
    injector.inject(fault)
    due = fault.injected_at
    time.sleep(1.0)  # the next life comes up a second later
    up = time.time()
    _write_state(tmp_path, {"pid": victim.pid, "started": up})
    injector.settle()
    assert victim.wait(timeout=30) == -9
    assert due is not None and fault.injected_at is not None and fault.injected_at >= up > due


def test_the_last_checkpoint_is_the_last_steps_even_past_the_steps_asked_under_parameter_servers() -> None:
    ps = RunPlan(300, Cell("local", "ps", "program"))
    ended = SimpleNamespace(steps=1210)  # the metrics' count: a lost call rerun, its updates landed twice
    assert steps(ps, ended, 1210, 1200) == []  # type: ignore[arg-type]
    assert steps(ps, ended, 1200, 1200) == ["the last checkpoint is at step 1200, not the last step 1210"]  # type: ignore[arg-type]
    past = SimpleNamespace(steps=1200 + PER_CALL + 10)
    assert steps(ps, past, past.steps, 1200) == [f"steps {past.steps}, scheduled 1200 (+{PER_CALL} allowed)"]  # type: ignore[arg-type]
    mwms = RunPlan(302, Cell("local", "mwms", "program"))
    assert steps(mwms, SimpleNamespace(steps=600), 600, 600) == []  # type: ignore[arg-type]
    assert steps(mwms, SimpleNamespace(steps=610), 610, 600) == ["steps 610, scheduled 600"]  # type: ignore[arg-type]

"""cluster.max_cost before a run starts: the price it is kept against (the catalog's), what plan
refuses, what each node is told, and how a run's cost so far is counted and shown. The run that
stops at its cap is tests/e2e/test_budget.py."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from dlinfra.contract import BUDGET_CHECKPOINT_SECONDS
from dlinfra.errors import SpecError
from dlinfra.prepare import checked_rate
from dlinfra.render import build_node_configs
from dlinfra.runs.manifest import Manifest, PlanCounts
from dlinfra.runs.run import utc_now
from dlinfra.spec.catalog import catalog
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.spec.pricing import BOOT_SECONDS, FirstCheckpoint, HourlyCost, budget_problem
from dlinfra.targets import target_for
from dlinfra.targets.aws.review import PlanSummary, hourly_cost
from support import store_config

CHECKPOINT_EVERY = 200  # training.checkpoint_every's default


def _spec(*sets: str, target: str = "aws", workers: int = 2):
    return load_spec(None, Overrides(target=target, workers=workers, sets=list(sets)))


def test_the_price_is_the_catalogs_for_every_node_and_the_nat_gateway() -> None:
    spec = _spec("cluster.workers.instance_type=c5.xlarge", "cluster.workers.gpus=0")
    region, prices = spec.aws.region, catalog()
    c = spec.cluster
    by_hand = (
        prices.get(c.chief.instance_type).price(region)
        + 2 * prices.get("c5.xlarge").price(region)
        + c.ps.count * prices.get(c.ps.instance_type).price(region)
        + prices.nat_gateway_usd_per_hour[region]
    )
    assert hourly_cost(spec).known == pytest.approx(by_hand)


def test_a_cap_below_boot_and_the_first_interval_is_refused_with_the_fix_that_passes() -> None:
    cost = HourlyCost({"chief": 0.5, "worker": 1.5}, {"NAT gateway": 0.045})
    first = FirstCheckpoint.estimate(CHECKPOINT_EVERY, None)
    assert first.seconds == BOOT_SECONDS
    problem = budget_problem(0.01, cost, first)
    assert problem is not None and problem.startswith("cluster.max_cost: $0.01 buys 0.3 min"), problem
    assert "no earlier run timed its steps" in problem
    fix = re.search(r"Fix: set it to ([0-9.]+) or more", problem)
    assert fix, problem
    assert budget_problem(float(fix[1]), cost, first) is None
    assert budget_problem(float(fix[1]) - 0.01, cost, first) is not None


def test_an_earlier_runs_step_time_lengthens_the_first_interval() -> None:
    first = FirstCheckpoint.estimate(CHECKPOINT_EVERY, 0.5)
    assert first.seconds == BOOT_SECONDS + CHECKPOINT_EVERY * 0.5
    assert "then 200 steps at the 0.5 s each its last run took" in first.basis


def test_an_unpriced_node_cannot_be_capped_and_a_free_target_is_not() -> None:
    unpriced = HourlyCost({"chief": 0.5, "worker": None}, unpriced=("x9.huge in us-east-1",))
    problem = budget_problem(100.0, unpriced, FirstCheckpoint.estimate(CHECKPOINT_EVERY, None))
    assert problem is not None and "no price for x9.huge in us-east-1" in problem and "Fix:" in problem
    nothing_priced = HourlyCost({"chief": None}, unpriced=("x9.huge in us-east-1",))
    assert budget_problem(100.0, nothing_priced, FirstCheckpoint.estimate(CHECKPOINT_EVERY, None)) is not None
    free = HourlyCost({"chief": 0.0, "worker": 0.0})
    assert budget_problem(0.0001, free, FirstCheckpoint.estimate(CHECKPOINT_EVERY, None)) is None


def test_checked_rate_raises_the_spec_error_plan_exits_2_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLINFRA_HOME", str(tmp_path))  # no earlier runs
    spec = _spec("cluster.max_cost=0.001")
    target = target_for("aws")
    with pytest.raises(SpecError) as refused:
        checked_rate(spec, target.hourly_cost(spec), target.name)
    assert refused.value.problems[0].startswith("cluster.max_cost: $0.001 buys")
    fine = _spec("cluster.max_cost=50")
    assert checked_rate(fine, target.hourly_cost(fine), target.name) == pytest.approx(hourly_cost(fine).known)


def test_each_node_is_told_its_budget_and_stops_by_it_not_by_max_runtime() -> None:
    """The OS shutdown that backs the watchdog up follows runs_for: tests/test_render.py."""
    spec = _spec("cluster.max_cost=2", "cluster.max_runtime=36000")
    rate = hourly_cost(spec).known
    configs = build_node_configs(
        spec,
        "r",
        store_config(spec, "s3://bucket/runs/r"),
        target_for("aws").addresses(spec),
        typed=True,
        usd_per_hour=rate,
    )
    for cfg in configs.values():
        assert cfg.budget is not None and cfg.budget.seconds == pytest.approx(2 / rate * 3600)
        assert cfg.runs_for == pytest.approx(cfg.budget.seconds + BUDGET_CHECKPOINT_SECONDS)
    unpriced = build_node_configs(
        spec, "r", store_config(spec, "s3://b/r"), target_for("aws").addresses(spec), typed=True
    )
    assert all(cfg.budget is None and cfg.runs_for == 36000 for cfg in unpriced.values())


def test_plan_says_when_the_cap_stops_the_run_before_max_runtime() -> None:
    spec = _spec("cluster.max_cost=1.5", "cluster.max_runtime=36000")
    cost = hourly_cost(spec)
    text = PlanSummary("r", spec.name, 10, 0, 0, spec, cost).text()
    minutes = 1.5 / cost.known * 60
    assert f"At cluster.max_cost ($1.5): the run checkpoints and stops after {minutes:.1f} min" in text, text
    uncapped = PlanSummary("r", spec.name, 10, 0, 0, _spec(), hourly_cost(_spec())).text()
    assert "At max_runtime (1 h): at most" in uncapped


def test_cost_so_far_is_the_plans_rate_over_the_nodes_time() -> None:
    started = time.time() - 1800
    manifest = Manifest.model_validate(
        {
            "run_id": "r",
            "name": "n",
            "target": "aws",
            "strategy": "parameter_server",
            "status": "RUNNING",
            "created": utc_now(started - 60),
            "store": {"url": "s3://b/r"},
            "spec_sha256": "0" * 64,
            "command": "dlinfra deploy",
            "started": utc_now(started),
            "plan": PlanCounts(add=1, change=0, destroy=0, usd_per_hour=2.0).model_dump(),
        }
    )
    assert manifest.usd_spent(started + 1800) == pytest.approx(1.0, abs=0.002)
    ended = manifest.model_copy(update={"finished": utc_now(started + 900)})
    assert ended.usd_spent(time.time() + 10**6) == pytest.approx(0.5, abs=0.002), "counted until it ended"
    free = manifest.model_copy(update={"plan": None})
    assert free.usd_spent(time.time()) is None


def test_status_and_runs_show_the_cost_so_far() -> None:
    from dlinfra.cli.tables import runs_table
    from dlinfra.runs.results import cost_line

    line = cost_line({"usd_spent": 0.123456, "usd_per_hour": 2.1354, "max_cost": 0.5})
    assert line == "cost: $0.1235 at $2.135/h since the nodes started; cluster.max_cost $0.5"
    assert cost_line({"usd_spent": None, "usd_per_hour": None, "max_cost": None}) is None
    row = {
        "run_id": "digits-cnn-20261124-123051-4a20",
        "status": "STOPPED",
        "age": "3m",
        "target": "aws",
        "strategy": "parameter_server",
        "eval_accuracy": None,
        "usd_spent": 0.0781,
        "resources_up": False,
        "usd_per_hour": None,
        "owner": None,
    }
    printed = io.StringIO()
    Console(width=200, file=printed, soft_wrap=True).print(runs_table([row], 200))
    [shown] = [line for line in printed.getvalue().splitlines() if row["run_id"] in line]
    assert "$0.08" in shown.split(), shown

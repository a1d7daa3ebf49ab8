"""Cost arithmetic of `dlinfra compare`, against hand-computed figures from the dated price table."""

from __future__ import annotations

import pytest

from dlinfra.runs.compare import cost_usd
from dlinfra.spec.model import RoleShape, Spec
from dlinfra.targets.aws.review import hourly_cost

NAT = 0.045


def _aws(**cluster: object) -> Spec:
    return Spec.model_validate({"target": "aws", "cluster": cluster})


def test_ps_cluster_cost_is_instance_hours_times_prices_plus_the_nat_gateway() -> None:
    spec = _aws(workers={"count": 3, "instance_type": "g4dn.xlarge"})  # chief and ps: m5.xlarge
    assert spec.roles() == {
        "chief": RoleShape(1, "m5.xlarge"),
        "worker": RoleShape(3, "g4dn.xlarge"),
        "ps": RoleShape(1, "m5.xlarge"),
    }
    # 30 minutes of 1 x 0.192 + 3 x 0.526 + 1 x 0.192 $/h = 1.962 $/h, plus the NAT gateway
    assert cost_usd(spec, "aws", 1800) == pytest.approx((1.962 + NAT) / 2)


def test_compare_and_plan_price_a_run_the_same_way() -> None:
    spec = _aws(workers={"count": 2})
    cost = hourly_cost(spec)
    assert cost.extras == {"NAT gateway": NAT} and cost.total == pytest.approx(0.192 * 2 + 0.526 * 2 + NAT)
    assert cost_usd(spec, "aws", 3600) == pytest.approx(cost.total)
    no_nat = Spec.model_validate({"target": "aws", "aws": {"egress": "public_ip"}})
    assert hourly_cost(no_nat).extras == {}


def test_mirrored_cluster_pays_only_for_workers() -> None:
    spec = Spec.model_validate(
        {
            "target": "aws",
            "strategy": "multi_worker_mirrored",
            "cluster": {"workers": {"count": 2}},
            "aws": {"egress": "none"},
        }
    )
    assert spec.roles() == {"worker": RoleShape(2, "g4dn.xlarge")}
    assert cost_usd(spec, "aws", 3600) == pytest.approx(2 * 0.526)


def test_local_runs_are_free_and_unknown_prices_are_not_guessed() -> None:
    assert cost_usd(Spec(), "local", 3600) == 0.0
    assert cost_usd(_aws(ps={"instance_type": "x9.unpriced"}), "aws", 3600) is None
    assert cost_usd(_aws(), "aws", None) is None

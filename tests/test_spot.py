"""Spot interruptions without a cluster: the spec's two forms, the node's IMDSv2 client against the
loopback metadata stand-in (EC2's metadata service cannot exist here), the chief's notice relay on a
real file store, the capacity fallback's decisions, and the tfvars an on-demand fallback applies."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dlinfra.errors import DlinfraError
from dlinfra.node import spot
from dlinfra.runs.compare import cost_usd, node_hours
from dlinfra.runs.layout import RunStore
from dlinfra.runs.manifest import Heal, Manifest
from dlinfra.runs.records import Notice
from dlinfra.runs.store_url import open_store
from dlinfra.spec.loading import Overrides, load_spec
from dlinfra.targets.aws import review, tfvars
from dlinfra.targets.aws.healing import check_heal_plan
from dlinfra.targets.aws.spot import decide, is_capacity_error, left_for_notice
from dlinfra.terraform import PlannedChange, planned_changes
from metadata_stand_in import MetadataStandIn
from support import Cli, node_configs, prepare_aws_review


def _spec(*sets: str, target: str = "local"):
    return load_spec(None, Overrides(target=target, sets=list(sets)))


# ---------------------------------------------------------------- spec


@pytest.mark.parametrize(
    "form",
    [
        ("cluster.workers.spot=true",),  # the original shorthand
        ("cluster.workers.spot.enabled=true",),
        ("cluster.workers.spot={enabled: true, fallback: on_demand}",),
    ],
)
def test_spot_shorthand_and_mapping_are_the_same_spec(form: tuple[str, ...]) -> None:
    spec = _spec(*form)
    assert spec.cluster.workers.spot.enabled and spec.cluster.workers.spot.fallback == "on_demand"
    assert spec.roles()["worker"].spot and not spec.roles()["chief"].spot


def test_spot_false_shorthand_still_means_on_demand() -> None:
    spec = _spec("cluster.workers.spot=false")
    assert not spec.cluster.workers.spot.enabled and not spec.roles()["worker"].spot


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["cluster.workers.spot.fallback=sometimes"],
            "cluster.workers.spot.fallback (from --set cluster.workers.spot.fallback): Input should be "
            "'on_demand', 'wait' or 'fail'",
        ),
        (["cluster.workers.spot=maybe"], "cluster.workers.spot (from --set cluster.workers.spot): must be"),
        (["cluster.workers.spot.price_per_hour=0.2"], "price_per_hour needs price_as_of"),
    ],
)
def test_bad_spot_input_exits_2_naming_the_field(cli: Cli, sets: list[str], message: str) -> None:
    result = cli("validate", *(a for s in sets for a in ("--set", s)))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Fix:" in result.stderr and "Traceback" not in result.stderr


def test_a_bad_fallback_in_a_file_names_the_field_and_line(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "experiment.yaml"
    spec.write_text("cluster:\n  workers:\n    spot:\n      enabled: true\n      fallback: cheapest\n")
    result = cli("validate", str(spec))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "experiment.yaml:5: cluster.workers.spot.fallback" in result.stderr
    assert "'on_demand', 'wait' or 'fail'" in result.stderr


def test_render_marks_only_spot_nodes_to_watch_and_every_node_of_a_spot_cluster() -> None:
    configs = node_configs(_spec("cluster.workers.spot=true"), "r-1", "file:///tmp/s", "local")
    assert {n: c.spot for n, c in configs.items()} == {
        "chief-0": False,
        "worker-0": True,
        "worker-1": True,
        "ps-0": False,
    }
    assert all(c.spot_in_cluster for c in configs.values())
    plain = node_configs(_spec(), "r-1", "file:///tmp/s", "local")
    assert not any(c.spot or c.spot_in_cluster for c in plain.values())


# ---------------------------------------------------------------- the node's side


def test_metadata_endpoint_override_order() -> None:
    assert spot.metadata_endpoint("worker-0", {}) == "http://169.254.169.254"
    assert spot.metadata_endpoint("worker-0", {spot.ENDPOINT_ENV: "http://[fd00:ec2::254]/"}) == (
        "http://[fd00:ec2::254]"
    )
    both = {spot.ENDPOINT_ENV: "http://a", spot.NODE_ENDPOINT_ENV: "http://b/{node}"}
    assert spot.metadata_endpoint("worker-3", both) == "http://b/worker-3"


def test_imdsv2_client_takes_a_token_first_and_404_means_no_notice() -> None:
    with MetadataStandIn() as imds:
        client = spot.Metadata(f"{imds.url}/worker-0")
        assert client.instance_action() is None and client.rebalance() is None
        assert imds.requests[0] == ("PUT", "worker-0", "latest/api/token")
        imds.interrupt("worker-0")
        action, when = client.instance_action()  # type: ignore[misc]
        assert action == "terminate" and 100 < when - time.time() <= 121
        other = spot.Metadata(f"{imds.url}/worker-1")
        assert other.instance_action() is None, "only the noticed node's instance answers"


def test_an_expired_token_is_renewed_once() -> None:
    with MetadataStandIn() as imds:
        client = spot.Metadata(f"{imds.url}/worker-0")
        client.token()
        imds.tokens.clear()  # the service forgot it: 401
        assert client.instance_action() is None
        assert [r[0] for r in imds.requests] == ["PUT", "GET", "PUT", "GET"]


def test_the_chief_relays_a_notice_acted_on_once_as_a_flag_its_trainer_consumes(tmp_path: Path) -> None:
    store = RunStore(open_store((tmp_path / "store").as_uri()))
    work = tmp_path / "work"
    work.mkdir()
    relay = spot.NoticeRelay(store, work)
    store.put_notice(Notice(node="worker-1", kind="rebalance", noticed=1.0))
    assert not relay.relay() and not spot.checkpoint_requested(work), "a rebalance only logged"
    store.put_notice(Notice(node="worker-0", kind="interruption", noticed=2.0, acted=True))
    assert relay.relay()
    assert spot.checkpoint_requested(work) and not spot.checkpoint_requested(work), "consumed once"
    assert not relay.relay(), "a notice seen is not flagged again"
    assert [n.node for n in store.notices()] == ["worker-1", "worker-0"]


def test_a_node_waits_for_a_checkpoint_newer_than_its_ask_or_for_the_runs_end(tmp_path: Path) -> None:
    """What a noticed node and the budget's watchdog wait for before they stop (spot.checkpoint_since)."""
    store = RunStore(open_store((tmp_path / "store").as_uri()))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "ckpt-100.index").write_bytes(b"i")
    store.put_checkpoint(100, ckpt)  # taken before the ask: not the one asked for
    asked = time.time() + 0.01
    time.sleep(0.02)
    assert spot.checkpoint_since(store, asked, time.time() + 0.3) == "late"
    (ckpt / "ckpt-200.index").write_bytes(b"i")
    store.put_checkpoint(200, ckpt)
    assert spot.checkpoint_since(store, asked, time.time() + 30) == "stored"
    store.write_marker("STOPPED", reason="budget")
    assert spot.checkpoint_since(store, asked, time.time() + 30) == "ended"


def test_a_notice_seen_while_the_store_is_out_is_told_once_it_is_back_and_the_node_then_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage longer than the store's retries (found by bench_chaos.py: a notice told to a store
    that failed was kept as told, and the node never left). A real moto server, stopped and started
    on its port; the notice keeps the time it was first seen."""
    from dlinfra.errors import StoreError
    from dlinfra.runs.s3_store import S3Store
    from stoppable_moto import StoppableMoto
    from support import FAKE_CREDS, s3_client

    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    moto = StoppableMoto()
    s3_client(moto.endpoint).create_bucket(Bucket="notices")
    store = RunStore(S3Store("s3://notices/run", moto.endpoint, retry_for=0.5))
    cfg = node_configs(_spec("cluster.workers.spot=true"), "run", "s3://notices/run")["worker-0"]
    stopped: list[bool] = []
    with MetadataStandIn() as imds:
        monkeypatch.setenv(spot.NODE_ENDPOINT_ENV, imds.node_template())
        watch = spot.SpotWatch(cfg, store, lambda: stopped.append(True))
        watch.metadata.token()  # the instance's session, which the stand-in's notice is for
        imds.interrupt("worker-0")
        moto.down()
        try:
            with pytest.raises(StoreError):
                watch.check()
            assert watch.notice is None and not stopped, "not told: not acted on"
            seen = watch._seen["interruption"]
        finally:
            moto.up()
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        (ckpt / "ckpt-7.index").write_bytes(b"i")
        store.put_checkpoint(7, ckpt)  # the chief's checkpoint, newer than the notice
        watch.check()
    try:
        assert watch.notice is not None and watch.notice.noticed == seen
        assert [(n.node, n.noticed, n.acted) for n in store.notices()] == [("worker-0", seen, True)]
        assert stopped == [True] and watch.leaving.is_set()
    finally:
        moto.stop()


# ---------------------------------------------------------------- the watcher's side


def test_a_node_that_left_is_replaced_once_per_notice() -> None:
    left = Notice(node="worker-0", kind="interruption", noticed=5.0, acted=True, left=9.0)
    waiting = Notice(node="worker-1", kind="interruption", noticed=6.0, acted=True)  # still checkpointing
    rebalance = Notice(node="worker-1", kind="rebalance", noticed=1.0, left=None)
    instances = {"worker-0": "i-0", "worker-1": "i-1"}
    assert list(left_for_notice([left, waiting, rebalance], instances, [])) == ["worker-0"]
    healed = Heal(node="worker-0", old="i-0", new="i-9", time="t", reason="interrupted", noticed=5.0)
    assert left_for_notice([left], instances, [healed]) == {}


WORKER_0 = 'module.role["worker"].aws_instance.this["worker-0"]'


def test_the_heal_reads_its_plan_from_the_plans_own_events() -> None:
    """Lines as `terraform plan -json` writes them (TF 1.11): the planned_change events, nothing else."""
    lines = [
        '{"@level":"info","@message":"Terraform 1.11.4","terraform":"1.11.4","type":"version"}',
        '{"@message":"module.network.aws_vpc.this[0]: Drift detected (update)","change":{"resource":'
        '{"addr":"module.network.aws_vpc.this[0]"},"action":"update"},"type":"resource_drift"}',
        '{"@message":"x: Plan to create","change":{"resource":{"addr":"'
        + WORKER_0.replace('"', '\\"')
        + '","resource_type":"aws_instance"},"action":"create"},"type":"planned_change"}',
        "Warning: not JSON",
        '{"@message":"Plan: 1 to add","changes":{"add":1},"type":"change_summary"}',
    ]
    assert planned_changes("\n".join(lines)) == [PlannedChange(WORKER_0, "create")]


@pytest.mark.parametrize(
    "changes",
    [
        [PlannedChange(WORKER_0, "create")],
        [PlannedChange(WORKER_0, "replace")],  # a failed attempt left it tainted
        [PlannedChange(WORKER_0, "create"), PlannedChange("module.network.aws_security_group.x", "update")],
    ],
)
def test_a_heal_plan_may_only_create_the_nodes_it_replaces(changes: list[PlannedChange]) -> None:
    check_heal_plan(changes, ["worker-0"])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (PlannedChange("module.network.aws_subnet.cluster[0]", "delete"), "delete module.network.aws_subnet"),
        (PlannedChange("module.network.aws_vpc.this[0]", "replace"), "replace module.network.aws_vpc"),
        (PlannedChange(WORKER_0.replace("worker-0", "worker-1"), "create"), 'create module.role["worker"]'),
        (PlannedChange(WORKER_0, "delete"), "delete module.role"),
    ],
)
def test_a_heal_plan_that_touches_anything_else_stops_the_heal(change: PlannedChange, named: str) -> None:
    with pytest.raises(DlinfraError, match="healing stopped") as refused:
        check_heal_plan([PlannedChange(WORKER_0, "create"), change], ["worker-0"])
    assert named in str(refused.value) and "worker-0" in str(refused.value)


@pytest.mark.parametrize(
    ("error", "capacity"),
    [
        ("Error: creating EC2 Instance: InsufficientInstanceCapacity: We currently do not have", True),
        ("api error SpotMaxPriceTooLow: Your Spot request price of 0.1 is lower than", True),
        ("Error: capacity-not-available: There is no Spot capacity available", True),
        ("InvalidParameterValue: Address 10.42.1.128 is in use", False),
    ],
)
def test_capacity_errors_are_told_from_other_apply_errors(error: str, capacity: bool) -> None:
    assert is_capacity_error(error) is capacity


def test_fallback_on_demand_and_fail_decide_at_the_first_capacity_error() -> None:
    error = "InsufficientInstanceCapacity"
    on_demand = decide("on_demand", ["worker-1"], error, 1, 0.0, 300)
    assert on_demand.action == "on_demand" and "worker-1" in on_demand.message
    fail = decide("fail", ["worker-1"], error, 1, 0.0, 300)
    assert fail.action == "fail"
    assert "worker-1" in fail.message and "Fix: set cluster.workers.spot.fallback: on_demand or wait" in (
        fail.message
    )


def test_fallback_wait_backs_off_within_heal_timeout_then_fails() -> None:
    error = "SpotMaxPriceTooLow"
    waits = [decide("wait", ["worker-0"], error, n, 0.0, 300).wait for n in (1, 2, 3, 4, 5, 6)]
    assert waits == [10, 20, 40, 80, 120, 120]
    assert decide("wait", ["worker-0"], error, 3, 250.0, 300).action == "retry"  # 250 + 40 <= 300
    late = decide("wait", ["worker-0"], error, 3, 270.0, 300)
    assert late.action == "fail" and "within aws.heal_timeout (300s" in late.message
    assert "worker-0" in late.message and "Fix:" in late.message


def test_on_demand_fallback_tfvars_move_only_that_node(home: Path) -> None:
    spec = _spec("cluster.workers.spot=true", "storage.url=s3://results-b/runs", target="aws")
    prepared = prepare_aws_review(spec)
    variables = tfvars.stack_tfvars(prepared)
    moved = tfvars.on_demand(variables, ["worker-1"])
    workers = moved["roles"]["worker"]
    assert workers["spot"] is True and workers["nodes"]["worker-1"]["spot"] is False
    assert "spot" not in workers["nodes"]["worker-0"], "the others keep the role's spot"
    assert (
        workers["nodes"]["worker-1"]["private_ip"]
        == variables["roles"]["worker"]["nodes"]["worker-1"]["private_ip"]
    )
    assert {k: v for k, v in moved.items() if k != "roles"} == {
        k: v for k, v in variables.items() if k != "roles"
    }
    assert all("spot" not in node for node in variables["roles"]["worker"]["nodes"].values()), "input kept"
    assert tfvars.on_demand_nodes(moved) == ["worker-1"] and tfvars.on_demand_nodes(variables) == []


# ---------------------------------------------------------------- cost


def test_the_plan_shows_the_worst_case_and_a_spot_estimate_only_from_a_dated_price() -> None:
    unknown = _spec("cluster.workers.spot=true", "aws.endpoint_url=http://127.0.0.1:9", target="aws")
    line = review.spot_line(unknown, review.hourly_cost(unknown))
    assert line is not None and "worst case" in line and "no spot price is known" in line
    priced = _spec(
        "cluster.workers.spot={enabled: true, price_per_hour: 0.2, price_as_of: 2026-11-01}", target="aws"
    )
    cost = review.hourly_cost(priced)
    line = review.spot_line(priced, cost)
    assert line is not None and "as of 2026-11-01" in line and f"worst case ${cost.known:.2f}/hour" in line
    assert review.spot_line(_spec(target="aws"), cost) is None


def _manifest(heals: list[Heal]) -> Manifest:
    return Manifest.model_validate(
        {
            "run_id": "r",
            "name": "n",
            "target": "aws",
            "strategy": "parameter_server",
            "status": "DONE",
            "created": "2026-11-01T00:00:00+00:00",
            "started": "2026-11-01T00:00:00+00:00",
            "finished": "2026-11-01T02:00:00+00:00",
            "store": {"url": "s3://b/r"},
            "spec_sha256": "0",
            "command": "deploy",
            "heals": [h.model_dump() for h in heals],
        }
    )


def test_compare_splits_spot_and_on_demand_hours_and_never_guesses_a_spot_price() -> None:
    priced = _spec(
        "cluster.workers.spot={enabled: true, price_per_hour: 0.2, price_as_of: 2026-11-01}", target="aws"
    )
    moved = Heal(node="worker-1", old="i-1", new="i-2", time="2026-11-01T01:00:00+00:00", on_demand=True)
    # 2 workers for 2 h, one moved on demand after 1 h; chief and ps on demand throughout
    assert node_hours(priced, _manifest([moved]), 7200) == (5.0, 3.0)
    on_demand_cost = cost_usd(priced, "aws", 7200)
    worker = review.hourly_cost(priced).per_role["worker"] / 2  # type: ignore[operator]
    spot_cost = cost_usd(priced, "aws", 7200, _manifest([moved]))
    assert spot_cost == pytest.approx(on_demand_cost - 3.0 * (worker - 0.2))  # type: ignore[operator]
    unpriced = _spec("cluster.workers.spot=true", target="aws")
    assert cost_usd(unpriced, "aws", 7200, _manifest([])) is None

"""`versions` in a run's manifest (runs/versions.py): what the nodes ran, never the CLI's own."""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

from dlinfra.environment.installed import installed, node_versions
from dlinfra.runs import versions
from dlinfra.runs.manifest import EnvironmentPin, Manifest

PIN = EnvironmentPin(
    file="env-cpu.lock",
    sha256="ab" * 32,
    uri="file:///s/code/env-cpu.lock",
    platform="Python 3.11 on linux/x86_64",
    index="https://pypi.org/simple",
    packages={"tensorflow-cpu": "2.15.1", "keras": "2.15.0", "numpy": "1.26.4", "six": "1.16.0"},
)


def manifest(**fields: object) -> Manifest:
    base = {
        "run_id": "r",
        "name": "n",
        "target": "local",
        "strategy": "parameter_server",
        "status": "DONE",
        "created": "2026-12-02T00:00:00+00:00",
        "store": {"url": "file:///s"},
        "spec_sha256": "0" * 64,
        "command": "dlinfra deploy",
    }
    return Manifest.model_validate(base | fields)


def test_until_nodes_report_the_record_says_what_the_lock_plans_not_the_cli_s_tensorflow() -> None:
    planned = versions.planned({"cpu": PIN})
    assert planned["source"] == "planned" and planned["tensorflow"] == "2.15.1", planned
    assert planned["keras"] == "2.15.0" and planned["python"] == "3.11" and planned["lock"] == PIN.sha256
    assert planned["tensorflow"] != metadata.version("tensorflow-cpu")  # this CLI runs 2.21
    assert "planned by the lock" in versions.shown(planned)
    gpu = PIN.model_copy(
        update={"packages": {"tensorflow": "2.15.1", "keras": "2.15.0"}, "sha256": "cd" * 32}
    )
    both = versions.planned({"cpu": PIN, "gpu": gpu})
    assert both["tensorflow"] == "2.15.1" and both["lock"] == f"{'ab' * 32} / {'cd' * 32}"
    assert both["numpy"] == "- / 1.26.4"  # the GPU lock pins none: said, not hidden


def test_a_node_reads_its_versions_from_the_environment_it_runs_in() -> None:
    ran = node_versions(installed(), "ef" * 32)
    assert ran["tensorflow"] == metadata.version("tensorflow-cpu") and ran["keras"] == metadata.version(
        "keras"
    )
    assert ran["python"] == platform.python_version() and ran["lock"] == "ef" * 32
    assert ran["numpy"] == metadata.version("numpy")


def test_what_the_nodes_ran_replaces_the_plan_per_node_only_where_they_differ() -> None:
    m = manifest(versions=versions.planned({"cpu": PIN}))
    node = {"tensorflow": "2.15.1", "keras": "2.15.0", "python": "3.11.9", "lock": PIN.sha256}
    summary, each = versions.reported(m, {"chief-0": node, "worker-0": dict(node), "ps-0": None})
    assert summary["source"] == "nodes" and summary["python"] == "3.11.9" and each == {}
    assert "numpy" not in summary and "(what the nodes ran)" in versions.shown(summary)
    odd = node | {"python": "3.11.4"}
    summary, each = versions.reported(m, {"chief-0": node, "worker-0": odd})
    assert summary["python"] == "3.11.4 / 3.11.9" and each == {"chief-0": node, "worker-0": odd}
    assert versions.reported(m, {"chief-0": None}) == (m.versions, {})  # none reported: still planned


def test_a_rerun_names_what_its_nodes_ran_differently() -> None:
    before = {"source": "nodes", "dlinfra": "0.1", "tensorflow": "2.15.1", "python": "3.11.9", "lock": "a"}
    after = before | {"dlinfra": "0.2", "python": "3.11.4"}
    assert versions.changes(before, after) == ["python 3.11.9 → 3.11.4"]
    assert versions.changes(before, dict(before)) == []
    assert versions.changes(before | {"source": "planned"}, after) == []  # the original never reported


def test_a_rerun_s_record_names_what_changed_against_its_original(home: Path) -> None:
    from dlinfra.runs.run import Run
    from dlinfra.spec.model import Spec

    ran = {"source": "nodes", "tensorflow": "2.15.1", "python": "3.11.9", "lock": "a"}
    original = Run.create(Spec())
    original.update_manifest(versions=ran)
    rerun = Run.create(Spec())
    rerun.update_manifest(rerun_of=original.id)
    assert versions.rerun_changes(rerun, ran | {"python": "3.11.4"}) == ["python 3.11.9 → 3.11.4"]
    assert versions.rerun_changes(rerun, ran) == []
    assert versions.rerun_changes(original, ran) is None  # no rerun
    rerun.update_manifest(rerun_of="gone-20260101-000000-0000")
    assert versions.rerun_changes(rerun, ran) is None  # its original is not on this machine


def test_show_says_what_running_nodes_report_before_the_watcher_records_it(home: Path) -> None:
    from dlinfra.runs.records import NodeState
    from dlinfra.runs.reports import run_details
    from dlinfra.runs.run import Run
    from dlinfra.spec.model import Spec

    run = Run.create(Spec())
    run.update_manifest(nodes=["chief-0", "worker-0"], versions=versions.planned({"cpu": PIN}))
    assert "planned by the lock" in run_details(run.id)["versions"]
    ran = {"tensorflow": "2.15.1", "keras": "2.15.0", "python": "3.11.9", "lock": PIN.sha256}
    now = 1.0e9
    state = NodeState(node="chief-0", role="chief", index=0, state="training", started=now,
                      first_started=now, heartbeat=now, versions=ran)  # fmt: skip
    run.store().put_status(state)
    shown = run_details(run.id)["versions"]
    assert shown.startswith("tensorflow 2.15.1, keras 2.15.0, python 3.11.9") and "nodes ran" in shown

"""Run ids, node names and run records as input: a path that would leave DLINFRA_HOME, a node the
run does not have, or a corrupt record each exit 2 with the name and a fix (never a traceback)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dlinfra.runs.run import Run
from dlinfra.spec.model import Spec
from support import Cli


@pytest.fixture
def recorded(home: Path) -> Run:
    """A run as `deploy` records it once its nodes are known: run dir, spec lock, manifest."""
    run = Run.create(Spec())
    run.update_manifest(nodes=["chief-0", "worker-0", "worker-1", "ps-0"])
    return run


@pytest.mark.parametrize(
    "args",
    [
        ["show", "../../../etc"],
        ["status", "../x"],
        ["logs", "/etc/passwd"],
        ["show", "digits-cnn-20261122-074449-713b/../../x"],
    ],
    ids=["show-up", "status-up", "logs-absolute", "valid-prefix-then-up"],
)
def test_a_run_id_that_is_a_path_is_refused(cli: Cli, args: list[str]) -> None:
    result = cli(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not found: a run id looks like" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("node", ["../../x", "/etc/passwd", "worker-9"])
def test_logs_of_a_node_the_run_does_not_have_names_the_nodes_it_has(
    cli: Cli, recorded: Run, node: str
) -> None:
    for flags in ([], ["--console"], ["--stacks"]):
        result = cli("logs", recorded.id, "--node", node, *flags)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"has no node '{node}'" in result.stderr
        assert "chief-0, worker-0, worker-1, ps-0" in result.stderr


@pytest.mark.parametrize(
    ("record", "content", "commands"),
    [
        ("manifest.json", b"{not json", ("show", "status", "compare")),
        ("manifest.json", b"\xff\xfe\x00", ("show", "status", "compare")),
        ("spec.lock.yaml", b"cluster: [\n", ("rerun --allow-unpinned", "compare")),
        ("spec.lock.yaml", b"cluster: {workers: {count: -1}}\n", ("rerun --allow-unpinned", "compare")),
    ],
    ids=["manifest-not-json", "manifest-not-utf8", "lock-not-yaml", "lock-invalid"],
)
def test_a_corrupt_record_is_named_and_nothing_starts(
    cli: Cli, home: Path, recorded: Run, record: str, content: bytes, commands: tuple[str, ...]
) -> None:
    (recorded.dir / record).write_bytes(content)
    for command in commands:
        result = cli(*command.split(), recorded.id)
        assert result.returncode == 2, result.stdout + result.stderr
        assert record in result.stderr and "Fix: " in result.stderr
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert [p.name for p in (home / "runs").iterdir()] == [recorded.id], "a rerun must not start"
    listed = cli("runs")
    assert listed.returncode == 0, listed.stderr
    if record == "manifest.json":
        assert "unreadable" in listed.stdout


IDS = [  # newest first, as list_runs gives them
    "digits-cnn-20261123-101500-39a1",
    "digits-cnn-20261123-101000-8a06",
    "resnet-20261122-090000-39a2",
]


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("@last", IDS[0]),
        ("@last~2", IDS[2]),
        ("8a06", IDS[1]),
        ("39a2", IDS[2]),
        ("digits-cnn-20261123-1015", IDS[0]),
        ("resnet", IDS[2]),
        (IDS[1], IDS[1]),
    ],
)
def test_a_short_id_names_one_run(ref: str, expected: str) -> None:
    from dlinfra.runs.run import resolve_run_ref

    assert resolve_run_ref(ref, IDS) == expected


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("digits", "ambiguous: it matches 2 runs: " + ", ".join(IDS[:2])),
        ("@last~3", "there are only 3 runs"),
        ("39a", "run '39a' not found: no run id"),  # a suffix is matched whole, never as a prefix of it
        ("@last~-1", "a run id looks like"),
        ("Digits", "a run id looks like"),
    ],
)
def test_a_short_id_that_names_no_single_run_says_why(ref: str, says: str) -> None:
    from dlinfra.errors import RunNotFound
    from dlinfra.runs.run import resolve_run_ref

    with pytest.raises(RunNotFound, match="Fix:") as caught:
        resolve_run_ref(ref, IDS)
    assert says in str(caught.value)


def test_writers_of_one_manifest_in_threads_lose_no_field(recorded: Run) -> None:
    """A heal's supervisor thread records the nodes' pids while the watcher records the heal's
    instances: each read-and-write is one step, so the last value of each field survives."""
    rounds = 60

    def pids() -> None:
        for n in range(rounds):
            recorded.update_manifest(pids={"worker-0": 1000 + n})

    def instances() -> None:
        for n in range(rounds):
            recorded.update_manifest(instances={"worker-0": f"i-{n:04d}"})

    threads = [threading.Thread(target=pids), threading.Thread(target=instances)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manifest = recorded.manifest()
    assert manifest.pids == {"worker-0": 1000 + rounds - 1}
    assert manifest.instances == {"worker-0": f"i-{rounds - 1:04d}"}
    assert manifest.nodes == ["chief-0", "worker-0", "worker-1", "ps-0"]
    assert sorted(p.name for p in recorded.dir.glob("*manifest*")) == [".manifest.json.lock", "manifest.json"]

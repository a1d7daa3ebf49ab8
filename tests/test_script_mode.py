"""Script mode's node side without a cluster: the report API, the command's variables, the synced
directories, what the bundle and the lock hold."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlinfra.environment.lock import EXTRAS, OWN_TENSORFLOW_EXTRAS, SCRIPT_EXTRAS, extras
from dlinfra.node.directory_sync import DirectorySync
from dlinfra.node.script import expand, script_environ
from dlinfra.progress import PROGRESS_FILE, read_report
from dlinfra.runs.bundle import pack_code
from dlinfra.runs.layout import SCRIPT_CHECKPOINTS, RunStore
from dlinfra.runs.store_url import open_store
from dlinfra.spec.training import TrainingSpec


def _script(code: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_report_keeps_the_newest_report_and_writes_it_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    # a burst of 1000 reports inside the half-second interval: the first is written at once, the
    # last at exit, none of those between (they would cost a file write per step)
    _script(
        "import dlinfra\nfor s in range(1, 1001): dlinfra.report(s, loss=1.0 / s, accuracy=0.5)\n",
        {PROGRESS_FILE: str(path)},
    )
    found = read_report(path)
    assert found is not None
    assert found["step"] == 1000 and found["scalars"] == {"loss": 0.001, "accuracy": 0.5}


def test_report_is_a_no_op_outside_dlinfra(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_FILE}
    done = subprocess.run(
        [sys.executable, "-c", "import dlinfra; dlinfra.report(3, loss=float('nan'))"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_non_finite_scalar_is_reported_as_null(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    _script("import dlinfra; dlinfra.report(7, loss=float('nan'))", {PROGRESS_FILE: str(path)})
    assert json.loads(path.read_text())["scalars"] == {"loss": None}


def test_the_command_expands_dlinfra_variables_only() -> None:
    variables = {"DLINFRA_MODEL_DIR": "/w/model", "DLINFRA_RUN_ID": "r-1"}
    argv = [
        "python",
        "t.py",
        "--model_dir",
        "$DLINFRA_MODEL_DIR",
        "--tag=${DLINFRA_RUN_ID}/x",
        "$HOME",
        "$DLINFRA_X",
    ]
    assert expand(argv, variables) == [
        "python", "t.py", "--model_dir", "/w/model", "--tag=r-1/x", "$HOME", "$DLINFRA_X"
    ]  # fmt: skip


def test_the_runs_environment_comes_first_on_the_scripts_path() -> None:
    env = script_environ({"DLINFRA_NODE": "worker-0"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["DLINFRA_NODE"] == "worker-0"


def test_directory_sync_sends_changed_files_and_the_checkpoint_state_last(tmp_path: Path) -> None:
    store = RunStore(open_store(f"file://{tmp_path / 'store'}"))
    local = tmp_path / "ckpt"
    (local / "ckpt-1_temp").mkdir(parents=True)
    (local / "ckpt-1_temp" / "part-0").write_text("half written")
    (local / "ckpt-1.index").write_text("index")
    (local / "ckpt-1.data-00000-of-00001").write_text("data")
    (local / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"')
    sent: list[str] = []
    put = store.put_synced
    store.put_synced = lambda prefix, rel, path: (sent.append(rel), put(prefix, rel, path))  # type: ignore[method-assign]
    sync = DirectorySync(store, local, SCRIPT_CHECKPOINTS)
    assert sync.push() == 0, "first look: nothing has settled yet"
    assert sync.push() == 3
    assert sent[-1] == "checkpoint" and "ckpt-1_temp/part-0" not in sent
    assert sync.push() == 0, "nothing changed: nothing sent again"
    # a new checkpoint half written: its data settled, its index still changing. The state file,
    # which names it, waits for the index
    (local / "ckpt-2.data-00000-of-00001").write_text("data 2")
    (local / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"')
    sync.push()
    (local / "ckpt-2.index").write_text("index 2")
    sent.clear()
    assert sync.push() == 1 and sent == ["ckpt-2.data-00000-of-00001"]
    assert sync.push() == 2 and sent[-1] == "checkpoint", "the index settled, then the state went"
    (local / "ckpt-1.index").write_text("index, rewritten")
    assert sync.push(final=True) == 1, "the writer is gone: no need to wait for it to settle"
    restored = DirectorySync(store, tmp_path / "restored", SCRIPT_CHECKPOINTS)
    assert restored.pull() == 3, "the state file and the newest checkpoint it names"
    assert (tmp_path / "restored" / "ckpt-2.index").read_text() == "index 2"
    assert (tmp_path / "restored" / "checkpoint").read_text() == 'model_checkpoint_path: "ckpt-2"'
    assert not list((tmp_path / "restored").glob(".*")), "no partial file is left"


def test_a_script_bundle_is_the_experiment_directory_without_dlinfra_home(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "data.py").write_text("x = 1\n")
    home = tmp_path / "runs-home"
    (home / "runs" / "old" / "store").mkdir(parents=True)
    (home / "runs" / "old" / "store" / "model.keras").write_bytes(b"\0" * 1000)
    bundle = pack_code(TrainingSpec(command=["python", "train.py"]), tmp_path, home)
    assert bundle is not None
    assert bundle.files == ("lib/data.py", "train.py")
    assert bundle.entrypoint == ""


@pytest.mark.parametrize(
    ("requirements", "script", "wanted"),
    [
        ([], False, EXTRAS["cpu"]),
        ([], True, SCRIPT_EXTRAS["cpu"]),  # a script without its own TensorFlow gets dlinfra's
        (["tensorflow-cpu==2.15.1"], True, OWN_TENSORFLOW_EXTRAS),
        (["TensorFlow[and-cuda]>=2.16"], True, OWN_TENSORFLOW_EXTRAS),
        (["tensorflow-cpu==2.15.1"], False, EXTRAS["cpu"]),  # a Program trains on dlinfra's loop
        (["tensorflow-datasets"], True, SCRIPT_EXTRAS["cpu"]),
    ],
)
def test_a_script_that_pins_tensorflow_gets_no_tensorflow_of_dlinfras(
    requirements: list[str], script: bool, wanted: str
) -> None:
    assert extras("cpu", requirements, script) == wanted


def test_a_script_environment_holds_the_same_beside_tensorflow_whether_or_not_it_is_pinned() -> None:
    """Issue 56: pinning TensorFlow dropped scikit-learn (the `train` extra carried it, `script` did
    not). One rule now: the script extras differ from `script` by TensorFlow's build alone."""
    import tomllib

    from dlinfra.environment.lock import TENSORFLOW_NAMES, normalize

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    declared = project["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        return {normalize(re.split(r"[\[=<>~! ]", r, maxsplit=1)[0]) for r in declared[extra]}

    own = names("script")
    for flavor in ("cpu", "gpu"):
        ours = names(SCRIPT_EXTRAS[flavor].split(",")[0]) - own
        assert ours == {"tensorboard", *(n for n in ours if n in TENSORFLOW_NAMES)}, ours
        assert "scikit-learn" not in names(SCRIPT_EXTRAS[flavor].split(",")[0]) | own
    assert "scikit-learn" in names("train")  # Program mode's stack keeps it, as docs/script.md says


def test_tensorboard_scalars_are_read_without_tensorflow_as_they_are_appended(tmp_path: Path) -> None:
    """Event files written by real TensorFlow: TF2 summaries (scalar tensors), a TF1 simple_value, an
    image (not a scalar: ignored), in the root and a subdirectory (Keras' train/ and validation/)."""
    from dlinfra.node.events import EventScalars

    writer = (
        "import sys, numpy as np, tensorflow as tf\n"
        "root = sys.argv[1]\n"
        "w = tf.summary.create_file_writer(root)\n"
        "v = tf.summary.create_file_writer(root + '/validation')\n"
        "with w.as_default():\n"
        "    for step in range(1, 31):\n"
        "        tf.summary.scalar('loss', 1.0 / step, step=step)\n"
        "    tf.summary.image('sample', np.zeros((1, 4, 4, 1), 'float32'), step=30)\n"
        "with v.as_default():\n"
        "    tf.summary.scalar('epoch_accuracy', tf.constant(0.75, tf.float64), step=3)\n"
        "w.flush(); v.flush()\n"
        "with tf.Graph().as_default():\n"
        "    w1 = tf.compat.v1.summary.FileWriter(root + '/v1')\n"
        "    value = tf.compat.v1.Summary.Value(tag='mae', simple_value=2.5)\n"
        "    w1.add_summary(tf.compat.v1.Summary(value=[value]), 7)\n"
        "    w1.flush()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", writer, str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    events = EventScalars(tmp_path)
    assert events.read()
    assert events.step == 30
    assert events.values == pytest.approx({"loss": 1 / 30, "validation/epoch_accuracy": 0.75, "v1/mae": 2.5})
    assert not events.read(), "nothing new appended: nothing new read"
    # a record half written (a writer mid-flush) is left for the next read
    log = next(tmp_path.glob("events.out.tfevents.*"))
    whole = log.read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    partial = cut / log.name
    partial.write_bytes(whole[: len(whole) - 7])
    events = EventScalars(cut)
    events.read()
    assert events.step is not None and events.step < 31
    partial.write_bytes(whole)
    events.read()
    assert events.values["loss"] == pytest.approx(1 / 30) and "sample" not in events.values


def test_the_log_tail_is_this_lifes_and_names_the_error_a_traceback_ends_with(tmp_path: Path) -> None:
    from dlinfra.node.script_log import RUNNING, last_error, log_tail

    log = tmp_path / "worker-1.log"
    log.write_text(
        f"{RUNNING}python train.py in /w\n"
        "tensorflow.python.framework.errors_impl.UnavailableError: a peer went away\n"
        "launcher: worker-1 exited with code 75: restarting it\n"
        f"{RUNNING}python train.py in /w\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "ValueError: label 11 is not below 10\n"
        "some cleanup output\n"
    )
    tail = log_tail(log)
    assert tail[0] == "Traceback (most recent call last):", "the earlier life's lost peer is not this one's"
    assert last_error(tail).splitlines()[0] == "ValueError: label 11 is not below 10"
    assert log_tail(None) == [] and last_error([]) == "it printed nothing"


def test_a_lost_peer_is_told_by_the_traceback_however_long_tensorflow_logs_after_it(tmp_path: Path) -> None:
    """bench_chaos seed 401: the ps guide's coordinator ended on UnavailableError after its ps was
    killed, then TensorFlow logged 159 lines at exit; the last 40 held no error name, and the run was
    failed as the script's own error instead of restarted."""
    from dlinfra.node.script_end import lost_a_peer
    from dlinfra.node.script_log import RUNNING, log_tail

    exit_log = [
        f"E0000 00:00:1796224730.{i:06d}    3445 context.cc:911] Failed to remove function remotely due to "
        'failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:22262: Failed to connect"}'
        for i in range(160)
    ]
    frames = ["Traceback (most recent call last):", '  File "train.py", line 120, in <module>', "    run()"]
    log = tmp_path / "chief-0.log"
    log.write_text(
        "\n".join([f"{RUNNING}python train.py in /w", *frames,
                   "tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:",
                   ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Socket closed"}',
                   *exit_log]) + "\n"
    )  # fmt: skip
    assert lost_a_peer(log_tail(log)), "the traceback's UnavailableError, 160 lines up"
    own = tmp_path / "own.log"
    own.write_text("\n".join([f"{RUNNING}python t.py", *frames, "ValueError: bad label", *exit_log]) + "\n")
    assert not lost_a_peer(log_tail(own)), "the script's own error is its own, whatever TensorFlow logs"


def test_a_multi_line_exception_keeps_its_whole_message_capped() -> None:
    from dlinfra.node.script_log import MESSAGE_LINES, last_error

    frames = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', "    fit()"]
    message = [
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:",
        "",
        "Detected at node sparse_categorical_crossentropy",
        "Received a label value of 11 which is outside the valid range of [0, 10).",
    ]
    exit_log = "I0000 00:00:1796186128.322657   12451 grpc_server.cc:9] shutting down"
    error = last_error(["earlier output", *frames, *message, exit_log])
    assert error == "\n".join(message), "from the exception's first line to its cause, TF's own log left out"

    long = last_error([*frames, "ValueError: many lines", *[f"line {i}" for i in range(100)]])
    assert len(long.splitlines()) == MESSAGE_LINES + 1 and long.endswith("(81 more lines in the node's log)")
    assert len(last_error([*frames, "ValueError: " + "x" * 5000])) < 2100


def test_a_long_failure_keeps_its_start_and_its_cause_in_the_marker(tmp_path: Path) -> None:
    """16 KB of a remote call's repeated text: the marker keeps a few KB, the first and the last
    (where TensorFlow puts the cause), and says how much it cut."""
    from dlinfra.contract import NodeConfig, StoreConfig
    from dlinfra.node.status import MAX_ERROR, NodeStatus, give_up

    store = RunStore(open_store(f"file://{tmp_path / 'store'}"))
    cfg = NodeConfig(
        run_id="r",
        role="worker",
        index=1,
        strategy="multi_worker_mirrored",
        cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        store=StoreConfig(url=f"file://{tmp_path / 'store'}"),
        training=TrainingSpec(),
        startup_timeout=10,
        heartbeat_interval=1,
        max_runtime=60,
    )
    error = "InvalidArgumentError: " + "gRPC said it again. " * 800 + "ValueError: bad record at step 5"
    give_up(cfg, store, NodeStatus(store, cfg.name, cfg.role, cfg.index, tmp_path), error, "")
    marker = store.marker()
    assert marker is not None and marker.node == "worker-1" and marker.error is not None
    assert marker.error.startswith("InvalidArgumentError: ") and marker.error.endswith("bad record at step 5")
    assert "characters cut" in marker.error and len(marker.error) < 2 * MAX_ERROR + 100


def test_a_scripts_shard_patterns_are_relative_to_its_code_so_one_names_every_nodes_own(
    tmp_path: Path,
) -> None:
    """Under parameter servers the chief's coordinator traces one pattern for every worker: relative to
    the working directory the script starts in, each worker resolves it to the share it staged."""
    from dlinfra.contract import NodeConfig, StoreConfig
    from dlinfra.node.script import staged_files
    from dlinfra.node.script_dirs import EVAL_FILES, TRAIN_FILES
    from dlinfra.spec.dataset import DatasetSpec

    def cfg(fmt: str) -> NodeConfig:
        dataset = DatasetSpec(format="tfrecord", uri="s3://data/digits") if fmt else DatasetSpec()
        return NodeConfig(
            run_id="r",
            role="worker",
            index=1,
            strategy="parameter_server",
            cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
            store=StoreConfig(url=f"file://{tmp_path / 'store'}"),
            training=TrainingSpec(dataset=dataset),
            startup_timeout=10,
            heartbeat_interval=1,
            max_runtime=60,
        )

    patterns = {}
    for node in ("worker-0", "worker-1"):
        work = tmp_path / "work" / node
        share = work / "shards" / "train"
        share.mkdir(parents=True)
        (share / f"train-{node}.tfrecord").write_bytes(b"")
        code = work / "code-0123456789ab"
        code.mkdir()
        patterns[node] = staged_files(cfg("tfrecord"), work, code)
        assert [p.name for p in code.glob(patterns[node][TRAIN_FILES])] == [f"train-{node}.tfrecord"]
    assert patterns["worker-0"] == patterns["worker-1"]
    assert patterns["worker-0"][EVAL_FILES] == "../shards/eval/*.tfrecord"
    assert staged_files(cfg(""), tmp_path, tmp_path / "code") == {}


def test_a_life_ended_before_its_agent_read_its_last_report_leaves_that_step_to_the_next(
    tmp_path: Path,
) -> None:
    """Seen in a spot test under load: the MWMS guide's owner trained all 300 steps, was restarted
    with its cluster before its agent read past step 229, and its next life restored the final
    checkpoint, trained nothing and reported nothing: the DONE run said 229 steps."""
    from dlinfra.node.script_dirs import ScriptDirs
    from dlinfra.node.script_progress import ScriptProgress, carry_last_report
    from dlinfra.node.status import NodeStatus

    store = RunStore(open_store((tmp_path / "store").as_uri()))
    work = tmp_path / "work"
    work.mkdir()
    first = NodeStatus(store, "worker-0", "worker", 0, work)
    first.update(state="running", step=229)  # what the agent last read, as the beacon published it
    store.put_status(first.state())
    _script(
        "import dlinfra\nfor s in range(1, 301): dlinfra.report(s, loss=1.0 / s)\n",
        {PROGRESS_FILE: str(ScriptDirs.progress_file(work))},
    )  # what the script reported before it was killed
    second = NodeStatus(store, "worker-0", "worker", 0, work)
    carry_last_report(second, ScriptDirs.progress_file(work))
    dirs = ScriptDirs.under(work)
    assert not dirs.progress.exists(), "each life reports afresh"
    assert ScriptProgress(second, dirs.progress).last_step == 300
    store.put_status(second.state())

    # a report behind what the agent read (a life that resumed from an earlier checkpoint) is not news
    _script("import dlinfra\ndlinfra.report(12)\n", {PROGRESS_FILE: str(dirs.progress)})
    third = NodeStatus(store, "worker-0", "worker", 0, work)
    carry_last_report(third, dirs.progress)
    assert third.fields["step"] == 300

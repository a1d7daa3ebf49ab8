"""Bad input: every malformed spec or flag exits 2 with the field path and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import Cli

# eight levels of nine-fold aliases: 9**9 values from a few hundred bytes
ALIAS_BOMB = "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
# (case id, experiment file text or None for no file, extra CLI args, text the error must contain)
CASES: list[tuple[str, str | None, list[str], str]] = [
    ("unknown-top-key", "nmae: x\n", [], "nmae"),
    ("unknown-nested-key", "cluster:\n  workers:\n    cont: 3\n", [], "cluster.workers.cont"),
    ("typo-suggests-fix", "trainng:\n  steps: 3\n", [], "did you mean 'training'"),
    ("workers-wrong-type", "cluster:\n  workers:\n    count: three\n", [], "cluster.workers.count"),
    ("workers-negative", "cluster:\n  workers:\n    count: -1\n", [], "cluster.workers.count"),
    ("workers-zero", "cluster:\n  workers:\n    count: 0\n", [], "cluster.workers.count"),
    ("workers-not-mapping", "cluster:\n  workers: many\n", [], "cluster.workers"),
    ("ps-negative", "cluster:\n  ps:\n    count: -2\n", [], "cluster.ps.count"),
    ("ps-zero-under-ps-strategy", "cluster:\n  ps:\n    count: 0\n", [], "cluster.ps.count"),
    ("port-privileged", "cluster:\n  port: 80\n", [], "cluster.port"),
    ("max-runtime-zero", "cluster:\n  max_runtime: 0\n", [], "cluster.max_runtime"),
    ("bad-strategy", "strategy: allreduce\n", [], "strategy"),
    ("bad-target", "target: gcp\n", [], "target"),
    ("name-uppercase", "name: MyRun\n", [], "name"),
    ("name-too-long", f"name: {'a' * 50}\n", [], "name"),
    ("steps-zero", "training:\n  steps: 0\n", [], "training.steps"),
    ("batch-size-string", "training:\n  batch_size: big\n", [], "training.batch_size"),
    ("learning-rate-negative", "training:\n  learning_rate: -0.1\n", [], "training.learning_rate"),
    ("optimizer-unknown", "training:\n  optimizer: adamw\n", [], "training.optimizer"),
    ("checkpoint-every-zero", "training:\n  checkpoint_every: 0\n", [], "training.checkpoint_every"),
    ("steps-per-call-zero", "training:\n  steps_per_execution: 0\n", [], "auto or a whole number of steps"),
    ("steps-per-call-word", "training:\n  steps_per_execution: fast\n", [], "training.steps_per_execution"),
    ("steps-per-call-over", "training:\n  steps_per_execution: 1001\n", [], "from 1 to 1000"),
    ("model-unknown", "training:\n  model:\n    name: vgg\n", [], "training.model.name"),
    ("layers-without-name", "training:\n  model:\n    layers: [{type: flatten}]\n", [], "training.model"),
    ("name-layers-without-list", "training:\n  model:\n    name: layers\n", [], "training.model"),
    (
        "dense-without-units",
        "training:\n  model:\n    name: layers\n    layers: [{type: dense}]\n",
        [],
        "training.model.layers.0",
    ),
    (
        "layer-type-unknown",
        "training:\n  model:\n    name: layers\n    layers: [{type: lstm}]\n",
        [],
        "training.model.layers.0.type",
    ),
    ("dataset-format-unknown", "training:\n  dataset:\n    format: mnist\n", [], "training.dataset.format"),
    ("cifar-without-uri", "training:\n  dataset:\n    format: cifar10\n", [], "training.dataset"),
    (
        "dataset-uri-scheme",
        "training:\n  dataset:\n    format: cifar10\n    uri: ftp://x/c.tgz\n",
        [],
        "training.dataset.uri",
    ),
    (
        "own-files-glob-in-directory",
        "training:\n  dataset:\n    format: tfrecord\n    uri: s3://data/*/train-*\n",
        [],
        "has a wildcard in a directory",
    ),
    (
        "own-files-eval-uri-beside-a-packed-directory",
        "training:\n  dataset:\n    format: tfrecord\n    uri: s3://data/digits\n    eval_uri: s3://data/x-*\n",
        [],
        "a packed directory names its own eval shards",
    ),
    (
        "own-files-at-the-bucket-root",
        "training:\n  dataset:\n    format: tfrecord\n    uri: s3://data/train-*\n",
        [],
        "Fix: keep the files under a prefix",
    ),
    (
        "own-files-eval-uri-no-glob",
        "training:\n  dataset:\n    format: tfrecord\n    uri: s3://data/in/train-*\n    eval_uri: s3://data/val\n",
        [],
        "eval_uri: 's3://data/val' is no glob",
    ),
    (
        "cache-for-a-set-read-into-memory",
        "training:\n  dataset:\n    format: digits\n    cache_gb: 2\n",
        [],
        "'cache_gb' streams TFRecord files; format digits is read into memory. Fix: remove it",
    ),
    (
        "cache-for-a-script",
        "training:\n  command: [python, t.py]\n  dataset:\n    format: tfrecord\n    uri: s3://data/in/train-*\n"
        "    cache_gb: 2\n",
        [],
        "a script reads $DLINFRA_TRAIN_FILES, staged whole. Fix: remove cache_gb",
    ),
    (
        "compression-of-a-packed-directory",
        "training:\n  dataset:\n    format: tfrecord\n    uri: s3://data/digits\n    compression: gzip\n",
        [],
        "'compression' is for your own files (a glob uri)",
    ),
    (
        "compression-unknown",
        "training:\n  dataset:\n    format: tfrecord\n    uri: s3://data/in/t-*\n    compression: lz4\n",
        [],
        "training.dataset.compression",
    ),
    ("dataset-sha-malformed", "training:\n  dataset:\n    sha256: abc\n", [], "training.dataset.sha256"),
    ("entrypoint-without-function", "training:\n  entrypoint: train.py\n", [], "training.entrypoint"),
    ("command-one-string", "training:\n  command: python train.py\n", [], "training.command"),
    ("command-empty", "training:\n  command: []\n", [], "training.command"),
    ("command-blank-program", "training:\n  command: ['', train.py]\n", [], "training.command"),
    ("command-missing-script", "training:\n  command: [python, nowhere.py]\n", [], "training.command"),
    (
        "command-and-entrypoint",
        "training:\n  command: [python, t.py]\n  entrypoint: t.py:build\n",
        [],
        "entrypoint and command are both set",
    ),
    ("store-url-scheme", "storage:\n  url: gs://bucket/x\n", [], "storage.url"),
    ("store-url-relative-file", "storage:\n  url: file://relative/dir\n", [], "storage.url"),
    ("store-url-bad-bucket", "storage:\n  url: s3://B_ad/x\n", [], "storage.url"),
    ("store-endpoint-not-url", "storage:\n  endpoint_url: localhost\n", [], "storage.endpoint_url"),
    ("aws-region", "aws:\n  region: mars-1\n", [], "aws.region"),
    ("aws-ami", "aws:\n  ami: ami-xyz\n", [], "aws.ami"),
    ("aws-vpc-public", "aws:\n  vpc_cidr: 8.8.0.0/16\n", [], "aws.vpc_cidr"),
    ("aws-subnet-outside-vpc", "aws:\n  subnet_cidr: 10.99.1.0/24\n", [], "aws"),
    ("aws-egress", "aws:\n  egress: vpn\n", [], "aws.egress"),
    (
        "aws-subnet-too-small",
        "target: aws\naws:\n  subnet_cidr: 10.42.1.0/28\n",
        ["--workers", "20"],
        "aws.subnet_cidr",
    ),
    ("yaml-syntax", "cluster: [\n", [], "YAML syntax error"),
    ("yaml-tab-indent", "cluster:\n\tworkers: 2\n", [], "YAML syntax error"),
    ("empty-file", "", [], "empty"),
    ("top-level-list", "- a\n- b\n", [], "top level"),
    ("flag-workers-zero", None, ["--workers", "0"], "cluster.workers.count (from --workers)"),
    ("flag-workers-not-int", None, ["--workers", "abc"], "--workers"),
    ("flag-strategy", None, ["--strategy", "ring"], "strategy (from --strategy)"),
    ("flag-target", None, ["--target", "gcp"], "target (from --target)"),
    ("flag-steps-negative", None, ["--steps", "-5"], "training.steps"),
    ("flag-set-without-equals", None, ["--set", "training.steps"], "--set"),
    ("flag-set-unknown-key", None, ["--set", "training.stepz=3"], "training.stepz"),
    ("flag-set-wrong-type", None, ["--set", "training.batch_size=huge"], "training.batch_size"),
    ("flag-endpoint", None, ["--endpoint-url", "nope"], "aws.endpoint_url"),
    ("flag-unknown", None, ["--wokers", "3"], "--wokers"),
    # credentials pasted into an experiment: refused, never echoed (tests/test_masking.py has the table)
    (
        "store-url-key-pair",
        "storage:\n  url: s3://bucket/AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
        [],
        "storage.url: looks like a credential ('s3://bucket/AKIA…')",
    ),
    (
        "dataset-uri-token",
        "training:\n  dataset:\n    format: cifar10\n    uri: https://d.example/c.tgz?token=hunter2hunter2\n",
        [],
        "'https://d.example/c.tgz?token=***'",
    ),
    (
        "flag-index-password",
        None,
        ["--set", "aws.pip_index_url=https://m.example/?password=pw"],
        "password=***",
    ),
    # GPUs against the instance catalog, mixed precision, learning-rate scaling
    ("gpus-more-than-type", "cluster:\n  workers:\n    gpus: 2\n", [], "cluster.workers.gpus"),
    (
        "gpus-on-cpu-type",
        "cluster:\n  workers:\n    instance_type: m5.xlarge\n    gpus: 1\n",
        [],
        "m5.xlarge is a CPU type",
    ),
    ("gpus-negative", "cluster:\n  workers:\n    gpus: -1\n", [], "cluster.workers.gpus"),
    ("gpus-word", "cluster:\n  workers:\n    gpus: many\n", [], "cluster.workers.gpus"),
    ("gpus-over-max", "cluster:\n  workers:\n    gpus: 17\n", [], "cluster.workers.gpus"),
    ("gpus-bool", "cluster:\n  workers:\n    gpus: true\n", [], "cluster.workers.gpus"),
    ("gpus-fraction", "cluster:\n  workers:\n    gpus: 0.5\n", [], "cluster.workers.gpus"),
    ("gpus-on-chief", "cluster:\n  chief:\n    gpus: 1\n", [], "cluster.chief.gpus"),
    (
        "gpus-auto-unknown-type-aws",
        "target: aws\ncluster:\n  workers:\n    instance_type: x9.huge\n",
        [],
        "x9.huge is not in dlinfra's instance catalog",
    ),
    (
        "gpus-auto-multi-gpu-under-ps",
        "target: aws\ncluster:\n  workers:\n    instance_type: g4dn.12xlarge\n",
        [],
        "cluster.workers.gpus",
    ),
    (
        "gpus-explicit-multi-gpu-under-ps",
        "cluster:\n  workers:\n    instance_type: g5.12xlarge\n    gpus: 2\n",
        [],
        "multi_worker_mirrored",
    ),
    ("flag-gpus-over-type", None, ["--set", "cluster.workers.gpus=4"], "(from --set cluster.workers.gpus)"),
    ("mixed-precision-local-auto", "training:\n  mixed_precision: true\n", [], "training.mixed_precision"),
    (
        "mixed-precision-cpu-type-aws",
        "target: aws\ncluster:\n  workers:\n    instance_type: c5.xlarge\n"
        "training:\n  mixed_precision: true\n",
        [],
        "training.mixed_precision",
    ),
    (
        "mixed-precision-gpus-zero",
        "target: aws\ncluster:\n  workers:\n    gpus: 0\ntraining:\n  mixed_precision: true\n",
        [],
        "training.mixed_precision",
    ),
    ("mixed-precision-not-bool", "training:\n  mixed_precision: maybe\n", [], "training.mixed_precision"),
    ("lr-scaling-unknown", "training:\n  lr_scaling: sqrt\n", [], "training.lr_scaling"),
    ("lr-scaling-under-ps", "training:\n  lr_scaling: linear\n", [], "training.lr_scaling"),
    # the input boundary (spec/input.py): sizes, duplicates, numbers
    ("duplicate-key", "name: a\ncluster: {}\nname: b\n", [], "name: given twice (lines 1 and 3)"),
    ("duplicate-nested-key", "cluster:\n  port: 2222\n  port: 2223\n", [], "cluster.port: given twice"),
    (
        "alias-bomb",
        'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + ALIAS_BOMB,
        [],
        "more than 10,000 values",
    ),
    ("huge-list", "cluster:\n  workers: [" + ",".join(["1"] * 20_000) + "]\n", [], "more than 10,000 values"),
    ("deep-nesting", "a: " + "[" * 5000 + "]" * 5000 + "\n", [], "nested deeper than 32 levels"),
    ("huge-integer", "training:\n  seed: " + "9" * 5000 + "\n", [], "training.seed: a number of 5000 digits"),
    (
        "max-runtime-inf",
        "cluster:\n  max_runtime: .inf\n",
        [],
        "cluster.max_runtime: Input should be a finite",
    ),
    ("heartbeat-timeout-inf", "cluster:\n  heartbeat_timeout: .inf\n", [], "cluster.heartbeat_timeout"),
    ("stall-timeout-nan", "cluster:\n  stall_timeout: .nan\n", [], "cluster.stall_timeout"),
    ("seed-over-32-bits", "training:\n  seed: 4294967296\n", [], "training.seed"),
    ("steps-absurd", "training:\n  steps: 100000000000\n", [], "training.steps"),
    (
        "python-tag",
        "name: !!python/object:os.system x\n",
        [],
        "the YAML tag '!!python/object:os.system' is not allowed",
    ),
    (
        "store-prefix-with-quotes",
        'storage:\n  url: "s3://bkt/a b\\"; rm -rf /"\n',
        [],
        "storage.url: needs a bucket",
    ),
    ("state-bucket-bad", "aws:\n  state_bucket: ../x\n", [], "aws.state_bucket"),
    (
        "http-dataset-without-sha",
        "training:\n  dataset:\n    format: cifar10\n    uri: http://example.com/c.tgz\n",
        [],
        "a plain-HTTP uri needs its sha256",
    ),
    ("flag-set-deep-nesting", None, ["--set", "training.steps=" + "[" * 100 + "]" * 100], "nested deeper"),
    # what the stack's own validations would refuse only after terraform init
    ("instance-type-not-ec2", "cluster:\n  ps:\n    instance_type: M5\n", [], "cluster.ps.instance_type"),
    ("tag-reserved-prefix", "aws:\n  tags:\n    'aws:team': ml\n", [], "aws.tags: tag 'aws:team'"),
    ("tag-value-bad-chars", "aws:\n  tags:\n    team: 'a*b'\n", [], "is not a tag AWS takes"),
    ("too-many-tags", "aws:\n  tags: {" + ", ".join(f"t{i}: v" for i in range(47)) + "}\n", [], "47 tags"),
    ("vpc-too-big", "aws:\n  vpc_cidr: 10.0.0.0/8\n  subnet_cidr: 10.0.1.0/24\n", [], "must be /16 to /28"),
]


def test_enough_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(("case", "text", "args", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_naming_the_field(
    cli: Cli, tmp_path: Path, home: Path, case: str, text: str | None, args: list[str], expected: str
) -> None:
    spec_args: list[str] = []
    if text is not None:
        spec = tmp_path / "experiment.yaml"
        spec.write_text(text)
        spec_args = [str(spec)]
    result = cli("validate", *spec_args, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "internal error" not in result.stderr
    assert len(result.stderr) < 8192, "one short message per problem, never the input echoed whole"
    assert not (home / "runs").exists(), "bad input must not create a run"


def test_errors_carry_file_and_line(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "exp.yaml"
    spec.write_text("name: ok\ncluster:\n  workers:\n    count: -3\n")
    result = cli("validate", str(spec))
    assert f"{spec}:4: cluster.workers.count" in result.stderr


def test_every_problem_is_reported_once_per_line(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "exp.yaml"
    spec.write_text("strategy: x\ntraining:\n  steps: 0\n  optimizer: nope\n")
    lines = [ln for ln in cli("validate", str(spec)).stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 3
    assert all("Fix:" in ln for ln in lines)


def test_missing_file_names_path_and_fix(cli: Cli, tmp_path: Path) -> None:
    result = cli("validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "nope.yaml: no such file" in result.stderr
    assert "dlinfra init" in result.stderr


def test_deploy_with_bad_input_provisions_nothing(cli: Cli, home: Path) -> None:
    result = cli("deploy", "--workers", "0")
    assert result.returncode == 2
    assert not (home / "runs").exists()


FILE_CASES: list[tuple[str, bytes | None, str]] = [
    ("latin-1", "name: café\n".encode("latin-1"), "experiment.yaml:1: not UTF-8 text (byte 0xe9)"),
    ("utf-16", "name: x\n".encode("utf-16"), "is UTF-16 text. Fix: save it as UTF-8"),
    ("over-1-mb", b"name: " + b"a" * 1_100_000 + b"\n", "over 1 MB"),
    ("a-directory", None, "is a directory. Fix: name the experiment file in it"),
]


@pytest.mark.parametrize(("case", "content", "expected"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_unreadable_files_exit_2_naming_the_file(
    cli: Cli, tmp_path: Path, case: str, content: bytes | None, expected: str
) -> None:
    spec = tmp_path / "experiment.yaml"
    if content is None:
        spec.mkdir()
    else:
        spec.write_bytes(content)
    result = cli("validate", str(spec))
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert len(result.stderr) < 8192


def test_a_long_bad_value_is_not_echoed_whole(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "experiment.yaml"
    spec.write_text("name: " + "a" * 500_000 + "\n")
    result = cli("validate", str(spec))
    assert result.returncode == 2 and "(500002 characters)" in result.stderr
    assert len(result.stderr) < 1000


def test_thousands_of_problems_print_the_first_20(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "experiment.yaml"
    spec.write_text("".join(f"key{i}: 1\n" for i in range(500)))
    lines = cli("validate", str(spec)).stderr.splitlines()
    assert len(lines) == 21 and lines[-1] == "error: ... and 480 more problems"


SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    "args",
    [
        ["--set", f"storage.url=s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@bkt/runs"],
        ["--endpoint-url", f"http://AKIAIOSFODNN7EXAMPLE:{SECRET}@127.0.0.1:5000"],
        ["--set", f"aws.pip_index_url=https://user:{SECRET}@mirror.example/simple"],
        [
            "--set",
            "training.dataset.format=cifar10",
            "--set",
            f"training.dataset.uri=https://u:{SECRET}@x.io/c.tgz",
        ],
    ],
    ids=["store-url", "endpoint", "pip-index", "dataset-uri"],
)
def test_a_url_with_credentials_is_refused_without_echoing_them(
    cli: Cli, home: Path, args: list[str]
) -> None:
    for command in ("validate", "render"):
        result = cli(command, "--target", "aws", *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert SECRET not in result.stdout + result.stderr and "AKIAIOSFODNN7EXAMPLE" not in result.stderr
        assert "Fix:" in result.stderr
    assert not home.exists() or not any(home.rglob("*.yaml")), "nothing rendered"


@pytest.mark.parametrize("bucket", ["../../x", "Bad_Bucket!", "a"])
def test_setup_refuses_a_bad_bucket_before_anything_is_written(cli: Cli, home: Path, bucket: str) -> None:
    result = cli("setup", "--bucket", bucket)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not an S3 bucket name. Fix:" in result.stderr
    assert not home.exists(), "no stack copied, no terraform init"

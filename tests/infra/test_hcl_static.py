"""Static checks of the HCL: formatting, validation, `terraform test` with mocks, checkov, docs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.terraform

INFRA = Path(__file__).resolve().parents[2] / "src" / "dlinfra" / "infra"
CONFIG_DIRS = sorted(p.parent.relative_to(INFRA).as_posix() for p in INFRA.rglob("versions.tf"))

TESTED_DIRS = [d for d in CONFIG_DIRS if any((INFRA / d / "tests").glob("*.tftest.hcl"))]
MODULE_DIRS = [d for d in CONFIG_DIRS if d.startswith("modules/")]


@pytest.fixture(scope="module")
def initialized(tmp_path_factory: pytest.TempPathFactory, make_infra_copy, terraform_in):
    """One copy of the infra tree for the module; each configuration is initialized on first use."""
    root = make_infra_copy(tmp_path_factory.mktemp("static") / "infra")
    done = {}

    def get(config_dir: str):
        if config_dir not in done:
            tf = terraform_in(root / config_dir)
            tf.init(backend=False)
            done[config_dir] = tf
        return done[config_dir]

    return get


def test_the_tree_holds_both_root_stacks_and_every_module():
    assert {"stack", "bucket", "controller"} <= set(CONFIG_DIRS)
    assert set(MODULE_DIRS) == {
        "modules/network",
        "modules/node_iam",
        "modules/instance_group",
        "modules/storage",
        "modules/controller_iam",
    }
    assert set(TESTED_DIRS) == set(CONFIG_DIRS), "every configuration needs tests/*.tftest.hcl"


def test_hcl_is_terraform_fmt_clean(tf_env: dict[str, str]):
    result = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", "-no-color", str(INFRA)],
        env=tf_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"run `terraform fmt -recursive {INFRA}`:\n{result.stdout}{result.stderr}"


# Every configuration has tests (above), and `terraform test` validates the configuration and its test
# files before it runs one: a separate `terraform validate` of each would repeat that (~10 CPU-s each).
@pytest.mark.parametrize("config_dir", TESTED_DIRS)
def test_terraform_test_validates_and_passes_with_mocked_provider(initialized, config_dir: str):
    result = initialized(config_dir).run("test", "-no-color", timeout=600)
    summary = result.stdout.strip().splitlines()[-1]
    print(f"{config_dir}: {summary}")
    assert re.search(r"Success! \d+ passed, 0 failed", summary), result.stdout


def test_stack_plan_names_the_node_whose_ip_is_outside_the_subnet(
    infra_copy: Path, moto_server, tf_cli_config: Path
):
    """`expect_failures` cannot name a precondition inside module.role; check the real message."""
    infra = infra_copy
    tf = moto_server.terraform(infra / "stack", tf_cli_config)
    tf.init()
    tfvars = {
        "run_id": "plan-check",
        "region": moto_server.region,
        "endpoint_url": moto_server.endpoint_url,
        "ami_id": "ami-0123456789abcdef0",
        "bucket": "dlinfra-results-plan-check",
        "prefix": "runs/plan-check",
        "roles": {
            "worker": {
                "instance_type": "m5.large",
                "nodes": {"worker-0": {"private_ip": "10.42.9.10", "user_data": "#cloud-config\n"}},
            }
        },
    }
    (infra / "stack" / "run.tfvars.json").write_text(json.dumps(tfvars))
    result = tf.run("plan", "-input=false", "-no-color", "-var-file=run.tfvars.json", check=False)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert "worker-0: private_ip 10.42.9.10 is not a usable address of subnet 10.42.1.0/24" in message, (
        message
    )


def test_checkov_reports_no_failed_check():
    # install.sh keeps checkov in its own venv (it pins old boto3); fall back to this interpreter.
    venv_checkov = Path(__file__).resolve().parents[2] / ".venv-checkov" / "bin" / "checkov"
    command = [str(venv_checkov)] if venv_checkov.exists() else [sys.executable, "-m", "checkov.main"]
    result = subprocess.run(
        [
            *command,
            "--directory",
            str(INFRA),
            "--framework",
            "terraform",
            "--compact",
            "--quiet",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.stdout.strip(), f"checkov printed nothing (is it installed?):\n{result.stderr[-3000:]}"
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for report in reports
        for c in report.get("results", {}).get("failed_checks", [])
    ]
    summaries = [report["summary"] for report in reports]
    print("checkov:", summaries)
    assert sum(s["failed"] for s in summaries) == 0, "\n".join(failed)
    assert sum(s["passed"] for s in summaries) > 0, "checkov scanned nothing"


def test_every_checkov_skip_says_why():
    skips = [
        (path.relative_to(INFRA), line.strip())
        for path in INFRA.rglob("*.tf")
        for line in path.read_text(encoding="utf-8").splitlines()
        if "checkov:skip" in line
    ]
    assert skips, "expected the documented skips"
    for path, line in skips:
        assert re.fullmatch(r"#checkov:skip=CKV2?_AWS_\d+:\S.{20,}", line), f"{path}: give a reason: {line}"


def _declared(config: Path, kind: str) -> set[str]:
    text = "".join(p.read_text(encoding="utf-8") for p in config.glob("*.tf"))
    return set(re.findall(rf'^{kind} "([^"]+)"', text, flags=re.MULTILINE))


@pytest.mark.parametrize("config_dir", CONFIG_DIRS)
def test_readme_tables_list_every_input_and_output(config_dir: str):
    config = INFRA / config_dir
    readme = (config / "README.md").read_text(encoding="utf-8")
    assert "## Inputs" in readme and "## Outputs" in readme
    inputs, outputs = readme.split("## Outputs", 1)
    for name in _declared(config, "variable"):
        assert f"| `{name}` |" in inputs, f"{config_dir}/README.md: input `{name}` missing"
    for name in _declared(config, "output"):
        assert f"| `{name}` |" in outputs, f"{config_dir}/README.md: output `{name}` missing"


def test_every_variable_has_description_and_type():
    for path in INFRA.rglob("variables.tf"):
        blocks = re.split(r'^variable "', path.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]
        for block in blocks:
            name = block.split('"', 1)[0]
            assert re.search(r"^\s+description\s+=", block, re.MULTILINE), f"{path}: {name} lacks description"
            assert re.search(r"^\s+type\s+=", block, re.MULTILINE), f"{path}: {name} lacks type"


def test_product_hcl_names_no_provider_mirror_and_no_credentials():
    for path in [*INFRA.rglob("*.tf"), *INFRA.rglob("*.hcl")]:
        text = path.read_text(encoding="utf-8")
        for needle in (
            "/opt/tf-plugins",
            "filesystem_mirror",
            "access_key",
            "secret_key",
            "AKIA",
            'backend "',
        ):
            assert needle not in text, f"{path.relative_to(INFRA)} contains {needle!r}"


def test_no_module_uses_count_over_a_list():
    """count is only an on/off switch (cond ? 1 : 0); collections go through for_each."""
    for path in INFRA.rglob("*.tf"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"\s*count\s*=", line):
                assert re.search(r"\?\s*1\s*:\s*0|\?\s*0\s*:\s*1", line), f"{path}: {line.strip()}"

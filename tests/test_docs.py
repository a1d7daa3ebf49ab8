"""The manual's site: it builds in strict mode (every link and anchor resolves), its generated pages
are what the code makes now, and they follow the code (a schema, CLI, module or contract change shows
in them); the README stays a short door into it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated

import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strictly_with_every_link_and_anchor_resolved(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for page in (
        "index.html",
        "reference/cli/index.html",
        "benchmarks/index.html",
        "architecture/index.html",
    ):
        assert (tmp_path / page).is_file(), page


def test_the_generated_pages_are_what_the_code_makes_now(reference: ModuleType) -> None:
    assert reference.stale() == [], "run: .venv/bin/python scripts/docs_reference.py"


def test_a_new_field_of_the_experiment_file_shows_in_its_reference(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlinfra.spec import loading

    real = loading.json_schema

    def with_a_new_field() -> dict:
        schema = real()
        schema["properties"]["brand_new"] = {"type": "integer", "default": 7, "description": "A new knob."}
        return schema

    monkeypatch.setattr(loading, "json_schema", with_a_new_field)
    assert "| `brand_new` | integer | `7` | A new knob. |" in reference.experiment_file_page()


def test_a_new_command_shows_in_the_cli_reference(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlinfra.cli import app as app_module

    app = typer.Typer(help="A stand-in app.")

    @app.command()
    def frobnicate(
        times: Annotated[int, typer.Option("--times", help="How many times.")] = 3,
    ) -> None:
        """Frobnicate the run."""

    @app.command()
    def other() -> None:
        """Another command, so that the app is a group."""

    monkeypatch.setattr(app_module, "app", app)
    page = reference.cli_page()
    assert "## `dlinfra frobnicate`" in page and "Frobnicate the run." in page
    assert "| `--times <int>` | int | `3` | How many times. |" in page


def test_a_new_module_input_and_output_show_in_the_terraform_reference(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "dlinfra"
    shutil.copytree(
        ROOT / "src" / "dlinfra" / "infra", package / "infra", ignore=shutil.ignore_patterns("tests")
    )
    network = package / "infra" / "modules" / "network"
    with (network / "variables.tf").open("a") as f:
        f.write(
            '\nvariable "brand_new" {\n  description = "A {braced} \\"quoted\\" knob."\n'
            "  type = object({\n    a = optional(number, 1)\n  })\n  default = {}\n\n"
            '  validation {\n    condition     = true\n    error_message = "never"\n  }\n}\n'
        )
    with (network / "outputs.tf").open("a") as f:
        f.write('\noutput "brand_new_id" {\n  description = "A new output."\n  value       = "x"\n}\n')
    monkeypatch.setattr(reference, "PACKAGE", package)
    page = reference.terraform_page()
    assert (
        '| `brand_new` | `object({ a = optional(number, 1) })` | `{}` | A {braced} "quoted" knob. |' in page
    )
    assert "| `brand_new_id` | A new output. |" in page
    assert page != (ROOT / "docs" / "reference" / "terraform.md").read_text()


def test_a_changed_layer_shows_in_the_layers_page(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '    "dlinfra.watching",\n' in text
    (tmp_path / "pyproject.toml").write_text(text.replace('    "dlinfra.watching",\n', ""))
    monkeypatch.setattr(reference, "ROOT", tmp_path)
    page = reference.layers_page()
    unnamed = page[page.index("Modules no floor names") :]
    assert "- `dlinfra.watching`:" in unnamed.split("\n## ")[0]


def test_the_readme_is_a_short_door_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for page in ("docs/index.md", "docs/tests.md", "docs/architecture.md", "docs/reference/cli.md"):
        assert f"]({page})" in readme, page


def test_the_manuals_pages_hold_no_dated_measurement() -> None:
    """A day's figures (`on 2026-11-27 …`) go to BENCHMARKS.md, which the pages link to; code blocks
    (an IAM policy's `"Version": "2012-10-17"`) are not prose."""
    dated = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        prose = re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.M | re.S)
        dated += [f"{page.name}: {m}" for m in re.findall(r".{0,40}\b20\d\d-\d\d-\d\d\b", prose)]
    assert dated == []

"""The shape of the package: imports point down (import-linter's contracts in pyproject.toml, each
proven to fail on a planted violation), no import circle, types check, one registry knows the targets,
one module knows the store's keys, no file outgrows a reader. Read from the source, not from a list
kept by hand, so a new module is checked the day it lands."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from dlinfra.spec.model import Spec
from dlinfra.targets import INSTANCE_TYPED, REGISTRY, target_for

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dlinfra"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """dotted module name → file, for every Python file of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every dlinfra module a file imports, at the top, inside functions, or for type checking."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dlinfra"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dlinfra"))
    return {name for name in found if name in MODULES}


MODULES = _modules()


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


# ---------------------------------------------------------------- layering: import-linter's contracts

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PYPROJECT = PACKAGE.parents[1] / "pyproject.toml"
# contract id (pyproject.toml) → (module, an import that breaks it): each planted in a copy of the package
PLANTED = {
    "floors": ("errors", "import dlinfra.spec.model"),
    "node-side": ("node/agent", "import dlinfra.targets.local"),
    "render": ("render/configs", "import dlinfra.node.agent"),
    "spec": ("spec/grammar", "import dlinfra.runs.store"),
    "cli-on-top": ("deploy", "import dlinfra.cli.console"),
    "targets-apart": ("targets/local", "import dlinfra.targets.aws.spot"),
    "no-circles": ("cli/console", "import dlinfra.cli.app"),
}


def _lint_imports(source_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(source_root))  # before the editable install's path
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(PYPROJECT), "--no-cache", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=source_root,
        timeout=300,
    )


def test_the_import_contracts_hold() -> None:
    result = _lint_imports(PACKAGE.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(PLANTED)} kept, 0 broken." in result.stdout, result.stdout


@pytest.mark.parametrize(("contract", "plant"), PLANTED.items(), ids=list(PLANTED))
def test_each_import_contract_fails_on_a_planted_violation(
    tmp_path: Path, contract: str, plant: tuple[str, str]
) -> None:
    copy = tmp_path / "dlinfra"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "infra", "*.json", "*.j2"))
    module, line = plant
    target = copy / f"{module}.py"
    target.write_text(target.read_text() + f"\n{line}  # planted\n")
    result = _lint_imports(tmp_path, "--contract", contract)
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout + result.stderr


def test_no_module_imports_itself_back_through_others() -> None:
    """No import circle anywhere: the contracts above cover siblings; this covers the whole graph."""
    import grimp

    graph = grimp.build_graph("dlinfra")
    circles = [
        f"{name} → … → {name}"
        for name in sorted(graph.modules)
        for imported in graph.find_modules_directly_imported_by(name)
        if not name.startswith(imported + ".")  # a module's own package runs first: not a circle
        and graph.chain_exists(importer=imported, imported=name)
    ]
    assert not circles


def test_types_check() -> None:
    """mypy with the pydantic plugin over src/ (configured in pyproject.toml): zero errors."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT)],
        capture_output=True,
        text=True,
        cwd=PYPROJECT.parent,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- what no linter checks


def test_only_the_registry_and_the_targets_themselves_name_a_target_module() -> None:
    """`dlinfra setup` (the aws results bucket) is the one aws-only command, so the CLI may too."""
    specific = tuple(REGISTRY.values())
    wrong = [
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if not _under(name, "dlinfra.targets", "dlinfra.cli")
        for imported in _imports(path)
        if _under(imported, *specific)
    ]
    assert not wrong


def test_no_branch_on_the_target_name_outside_the_registry() -> None:
    pattern = re.compile(r"""target\s*[!=]=\s*["'](aws|local)["']|["'](aws|local)["']\s*[!=]=\s*\w*target""")
    wrong = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for name, path in MODULES.items()
        if name != "dlinfra.targets"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not wrong


STORE_KEY = re.compile(
    r"^(status|logs|checkpoints|code|terraform|model|tensorboard)/|^(metrics|manifest|latest)\.json$"
)


def _string_parts(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants, and the leading literal text of f-strings, with their line numbers."""
    inside_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            out.append((node.lineno, str(node.values[0].value)))
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings
        ):
            out.append((node.lineno, node.value))
    return sorted(out)


def test_no_store_key_is_spelled_outside_the_layout_module() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for name, path in MODULES.items()
        if not name.startswith("dlinfra.runs.layout")
        for line, text in _string_parts(ast.parse(path.read_text()))
        if STORE_KEY.search(text)
    ]
    assert not wrong


def test_the_key_check_catches_what_it_looks_for() -> None:
    """The check above is only worth something if it sees keys the way code spells them."""
    code = 'a = store.get_json("metrics.json")\nb = f"status/{node}.json"\nc = f"{x}/model"\n'
    assert [t for _, t in _string_parts(ast.parse(code)) if STORE_KEY.search(t)] == [
        "metrics.json",
        "status/",
    ]


def test_no_source_file_outgrows_a_reader() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long


def test_every_target_the_spec_accepts_is_registered_and_implements_the_protocol() -> None:
    accepted = typing.get_args(Spec.model_fields["target"].annotation)
    assert set(accepted) == set(REGISTRY)
    for name in REGISTRY:
        target = target_for(name)
        assert target.name == name
        assert target.uses_instance_types is INSTANCE_TYPED[name], name
        for method in ("addresses", "node_install", "preflight", "plan", "provision", "start", "teardown"):
            assert callable(getattr(target, method)), f"{name} lacks {method}"


def test_every_spec_command_takes_the_same_override_flags() -> None:
    """Declared once (cli/options.py): the same flags, spelled and documented alike, everywhere."""
    import typer.core
    import typer.main

    from dlinfra.cli.app import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]

    def flags(name: str) -> dict[str, str | None]:
        params = commands[name].params
        return {
            p.opts[0]: p.help
            for p in params
            if isinstance(p, typer.core.TyperOption) and p.opts[0] != "--help"
        }

    full = flags("validate")
    assert {"--workers", "--ps", "--strategy", "--steps", "--target", "--endpoint-url", "--set"} <= set(full)
    for name in ("render", "deploy"):
        assert {k: v for k, v in flags(name).items() if k in full} == full, name
    assert {k: v for k, v in flags("plan").items() if k in full} == {
        k: v for k, v in full.items() if k != "--target"
    }
    rerun = flags("rerun")
    assert {k: rerun[k] for k in ("--target", "--workers", "--endpoint-url")} == {
        k: full[k] for k in ("--target", "--workers", "--endpoint-url")
    }

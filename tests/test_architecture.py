"""The shape of the package: imports point down, one registry knows the targets, one module knows
the store's keys, no file outgrows a reader. Read from the source with `ast`, not from a list kept
by hand, so a new module is checked the day it lands."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from dlinfra.spec import Spec
from dlinfra.targets import REGISTRY, target_for

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


# (who, what they must never import, why)
LAYERS = [
    (
        ("dlinfra.render",),
        ("dlinfra.node.agent", "dlinfra.node.status", "dlinfra.node.supervision"),
        "the renderer writes the node contract (node.config), it never runs a node",
    ),
    (
        ("dlinfra.node", "dlinfra.training"),
        (
            "dlinfra.render",
            "dlinfra.targets",
            "dlinfra.deploy",
            "dlinfra.prepare",
            "dlinfra.cli",
            "dlinfra.run",
            "dlinfra.reports",
            "dlinfra.compare",
            "dlinfra.rerun",
        ),
        "the node side knows nothing of targets, runs or the CLI",
    ),
    (
        ("dlinfra.targets",),
        ("dlinfra.cli", "dlinfra.deploy", "dlinfra.reports", "dlinfra.compare", "dlinfra.rerun"),
        "a target is driven by the flow; it never drives it",
    ),
    (
        (
            "dlinfra.prepare",
            "dlinfra.run",
            "dlinfra.layout",
            "dlinfra.records",
            "dlinfra.store",
            "dlinfra.spec",
        ),
        ("dlinfra.targets", "dlinfra.deploy", "dlinfra.cli"),
        "what every target shares sits below the targets",
    ),
]


@pytest.mark.parametrize(("owners", "forbidden", "why"), LAYERS, ids=[w for _, _, w in LAYERS])
def test_imports_point_down(owners: tuple[str, ...], forbidden: tuple[str, ...], why: str) -> None:
    wrong = [
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if _under(name, *owners)
        for imported in sorted(_imports(path))
        if _under(imported, *forbidden)
    ]
    assert not wrong, f"{why}: {wrong}"


def test_nothing_outside_the_cli_imports_it() -> None:
    wrong = [
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if not _under(name, "dlinfra.cli", "dlinfra.__main__")
        for imported in _imports(path)
        if _under(imported, "dlinfra.cli")
    ]
    assert not wrong


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
        if name != "dlinfra.layout"
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

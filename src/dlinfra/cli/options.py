"""Options shared between commands, each declared once.

The spec-override flags live in one table; `with_overrides` adds the ones a command takes to its
signature and hands them to it as one `Overrides`, so every command spells and documents them alike.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

SpecArg = Annotated[
    Path | None, typer.Argument(help="Experiment YAML (default: the built-in digits example).")
]
RunArg = Annotated[
    str | None,
    typer.Argument(
        help="Run id, a unique prefix, its 4-hex suffix, @last or @last~N (default: the newest run)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="aws: apply without asking.")]
RefreshLockOpt = Annotated[
    bool,
    typer.Option(
        "--refresh-lock",
        help="Resolve the environment anew (the newest releases the requirements allow) instead of the "
        "lock this machine resolved for the same requirements, dlinfra, platform and index.",
    ),
]
KeepOpt = Annotated[bool, typer.Option("--keep", help="aws: keep the stack after the run.")]
EmulateOpt = Annotated[
    str | None,
    typer.Option(
        "--emulate-instances",
        metavar="[process|vm]",
        help="aws + endpoint: boot instances' user-data as local processes (process, the default: fast) "
        "or as qemu VMs from a local image (vm: real cloud-init and systemd).",
    ),
]

EMULATIONS = ("process", "vm")


def with_emulation_default(argv: list[str]) -> list[str]:
    """A bare `--emulate-instances` means `=process`. Click's optional option values would take
    the next flag (`--emulate-instances --keep`) as the value, so the default is spelled out here."""
    out = []
    for i, arg in enumerate(argv):
        following = argv[i + 1] if i + 1 < len(argv) else None
        bare = arg == "--emulate-instances" and following not in EMULATIONS
        out.append("--emulate-instances=process" if bare else arg)
    return out


# Overrides field → its flag. Help names the spec field each one sets.
OVERRIDE_OPTIONS: dict[str, Any] = {
    "workers": Annotated[int | None, typer.Option("--workers", help="cluster.workers.count")],
    "ps": Annotated[int | None, typer.Option("--ps", help="cluster.ps.count")],
    "strategy": Annotated[
        str | None, typer.Option("--strategy", help="parameter_server | multi_worker_mirrored")
    ],
    "steps": Annotated[int | None, typer.Option("--steps", help="training.steps")],
    "target": Annotated[str | None, typer.Option("--target", help="local | aws")],
    "endpoint_url": Annotated[
        str | None, typer.Option("--endpoint-url", help="aws.endpoint_url (moto, LocalStack)")
    ],
    "sets": Annotated[
        list[str] | None, typer.Option("--set", help="Any field: --set training.batch_size=256")
    ],
}
ALL_OVERRIDES = tuple(OVERRIDE_OPTIONS)
EndpointOpt = OVERRIDE_OPTIONS["endpoint_url"]  # also `dlinfra setup`'s, which takes no spec


def with_overrides(*names: str) -> Callable[[F], F]:
    """Give a command the named override flags; it receives them as `overrides: Overrides`."""
    unknown = set(names) - set(OVERRIDE_OPTIONS)
    if unknown:
        raise ValueError(f"no override options {sorted(unknown)}")

    def wrap(fn: F) -> F:
        # Evaluated here, not by `eval_str`: `Overrides` itself is imported only when a command runs.
        own = [
            p.replace(
                annotation=eval(p.annotation, fn.__globals__)
                if isinstance(p.annotation, str)
                else p.annotation
            )
            for p in inspect.signature(fn).parameters.values()
            if p.name != "overrides"
        ]
        flags = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=OVERRIDE_OPTIONS[name]
            )
            for name in names
        ]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            from dlinfra.spec.loading import Overrides

            given = {name: kwargs.pop(name) for name in names}
            overrides = Overrides(**{k: v for k, v in given.items() if v is not None})
            return fn(**kwargs, overrides=overrides)

        params = [*own, *flags]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return wrap

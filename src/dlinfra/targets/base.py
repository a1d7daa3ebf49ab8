"""What a target is: where a run's nodes run. The deploy flow drives every target the same way:

    preflight → prepare (the run, its user-data) → plan → provision → start → watch → teardown

A target decides where nodes listen, what they install, how they are started and supervised,
what they cost, and what is left to tear down. It never drives the flow and never prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dlinfra.contract import NodeConfig
    from dlinfra.prepare import NodeInstall, Prepared
    from dlinfra.render.addresses import AddressPlan
    from dlinfra.runs.layout.controller import ControllerStore
    from dlinfra.runs.run import Run
    from dlinfra.spec.model import Spec
    from dlinfra.spec.pricing import HourlyCost

Log = Callable[[str], None]


@dataclass(frozen=True)
class TargetOptions:
    """How the caller wants the target to behave; `log` receives progress lines."""

    log: Log = lambda line: None
    # cloud targets on an emulator: boot instances as local processes ("process") or qemu VMs ("vm")
    emulate_instances: str | None = None


@dataclass(frozen=True)
class Review:
    """What a person sees before anything is created, and whether they must say yes."""

    text: str
    markdown: str
    needs_approval: bool
    plan_file: Path | None = None
    counts: tuple[int, int, int] | None = None  # resources to add, change, destroy (cloud targets)
    details: str = ""  # the tool's own plan output, for a reviewer who wants every attribute


class Cluster(Protocol):
    """A started run's nodes, as their target supervises them; the store tells everything else."""

    def poll(self) -> dict[str, int | None]:
        """Heal what the target can heal (restart a process, replace an instance); return the exit
        codes of nodes it knows have ended (None: still running)."""
        ...

    def exit_codes(self) -> dict[str, int | None]: ...

    def stop(self) -> None: ...


@runtime_checkable
class Replaces(Protocol):
    """A cluster whose nodes are machines of their own, which it can swap for fresh ones."""

    def replace_straggler(self, name: str) -> None:
        """Replace node `name`'s machine at its next poll, as a lost one is (cluster.straggler)."""
        ...


class Target(Protocol):
    name: ClassVar[str]
    # Creates resources that outlive the node processes (instances, networks): the deploy flow
    # tears them down after the run unless asked to keep them.
    leaves_resources: ClassVar[bool]
    uses_instance_types: ClassVar[bool]  # the spec's instance types (and their prices) apply
    user_data_limit: ClassVar[int | None]  # bytes of user-data its machines accept (None: no limit)
    options: TargetOptions

    @property
    def own_machines(self) -> bool:
        """Each node on a machine of its own, not processes (or VMs) sharing this one: what makes
        preflight's figures worth comparing (cluster.preflight's default)."""
        ...

    def addresses(self, spec: Spec) -> AddressPlan:
        """Where every node listens, known before any node exists."""
        ...

    def node_install(self, spec: Spec, pinned_wheel: Path | None = None) -> NodeInstall:
        """The dlinfra the nodes run (`pinned_wheel`: a rerun's original wheel) and the platform
        their environment is locked for."""
        ...

    def capacity(self, spec: Spec) -> list[str]:
        """Refuse (DlinfraError) a cluster the target's machines cannot hold; return warnings about one
        they hold at a cost. Reads no tools or credentials: `dlinfra validate` asks it too."""
        ...

    def preflight(self, spec: Spec) -> None:
        """Fail on anything that would stop the run (tools, credentials, limits) before it exists."""
        ...

    def plan(self, prepared: Prepared) -> Review: ...

    def provision(self, prepared: Prepared, review: Review) -> None:
        """Create what the review showed (after approval, when it needed one)."""
        ...

    def start(self, prepared: Prepared) -> Cluster: ...

    def attach(self, prepared: Prepared) -> Cluster:
        """The nodes of a run started earlier (`deploy --detach`), to watch them again."""
        ...

    def teardown(self, run: Run) -> str:
        """Remove whatever the run left (after a run, and for `dlinfra destroy`); says what it did."""
        ...

    def controller(self, spec: Spec) -> ControllerStore | None:
        """The account's controller a detached run of `spec` is handed to (None: none is there)."""
        ...

    def ready_for_controller(self, run: Run) -> None:
        """Make the run actable from the bucket alone (its state moved there) before the hand-over."""
        ...

    def wake_controller(self, spec: Spec, store: ControllerStore) -> bool:
        """Start the controller if it is not running, once the hand-over is written (it looks for
        hand-overs again after saying it stops, so one of the two always sees the other). Whether
        it was started here."""
        ...

    def settle(
        self, spec: Spec, configs: dict[str, NodeConfig], locks: Callable[[], dict[str, str]]
    ) -> tuple[Spec, str | None]:
        """What the spec leaves to the target until its nodes (`configs`) and their environment
        (`locks`: flavor → lock digest, resolved when asked) are known, decided before anything is
        rendered (aws: egress auto); and a line saying what it decided."""
        ...

    def hourly_cost(self, spec: Spec) -> HourlyCost: ...

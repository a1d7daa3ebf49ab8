"""`dlinfra compare`: recorded runs side by side, the way the thesis compared configurations.

Per run: target, roles x instance types, strategy, global steps/s and examples/s (mean ± sd over
progress intervals), the share of step time spent waiting on input, training and wall time, eval
accuracy, and cost: the wall time of the run x the target's hourly cost (the same estimate
`dlinfra plan` shows, NAT gateway included). Local runs cost nothing.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.runs.cells import mean_sd, num
from dlinfra.runs.manifest import Manifest
from dlinfra.runs.run import Run, list_runs, short_labels
from dlinfra.spec.catalog import catalog
from dlinfra.spec.model import Spec
from dlinfra.targets import target_for

COLUMNS = (
    "run",
    "status",
    "target",
    "roles",
    "strategy",
    "global steps/s",
    "examples/s",
    "predicted",
    "input wait",
    "train s",
    "wall s",
    "accuracy",
    "cost $",
)


def _seconds(manifest: Manifest) -> float | None:
    if not manifest.started or not manifest.finished:
        return None
    span = datetime.fromisoformat(manifest.finished) - datetime.fromisoformat(manifest.started)
    return span.total_seconds()


def node_hours(spec: Spec, manifest: Manifest, wall_seconds: float | None) -> tuple[float, float]:
    """(on-demand, spot) node-hours: spot roles' nodes ran on spot, except replacements that fell back
    to on-demand capacity, from their heal on."""
    if wall_seconds is None:
        return 0.0, 0.0
    hours = wall_seconds / 3600
    shapes = spec.roles().values()
    spot_nodes = sum(shape.count for shape in shapes if shape.spot)
    end = datetime.fromisoformat(manifest.finished) if manifest.finished else None
    moved = sum(
        max(0.0, (end - datetime.fromisoformat(h.time)).total_seconds()) / 3600
        for h in manifest.heals
        if h.on_demand and end is not None
    )
    on_demand = (sum(shape.count for shape in shapes) - spot_nodes) * hours + moved
    return on_demand, max(0.0, spot_nodes * hours - moved)


def cost_usd(
    spec: Spec, target: str, wall_seconds: float | None, manifest: Manifest | None = None
) -> float | None:
    """Wall hours x the target's hourly cost, spot hours at the spec's dated spot price; None when a
    price is unknown (never guessed)."""
    kind = target_for(target)
    cost = kind.hourly_cost(spec)
    if cost.total is None or wall_seconds is None:
        return None
    workers = spec.roles()["worker"]
    if not workers.spot or manifest is None or not kind.uses_instance_types:
        return cost.total * wall_seconds / 3600
    _, spot_hours = node_hours(spec, manifest, wall_seconds)
    price = spec.cluster.workers.spot.price_per_hour
    if spot_hours and price is None:
        return None
    worker_on_demand = (cost.per_role["worker"] or 0.0) / workers.count
    # every node at on-demand prices, less what each spot hour saved
    return cost.total * wall_seconds / 3600 - spot_hours * (worker_on_demand - (price or 0.0))


def row(run: Run) -> dict[str, Any]:
    manifest = run.manifest()
    spec = run.spec()
    metrics = run.store().metrics() if manifest.status == "DONE" else None
    wall = _seconds(manifest)
    typed = target_for(manifest.target).uses_instance_types
    predicted = run.store().sizing() or {}
    return {
        "run": run.id,
        "status": manifest.status,
        "target": manifest.target,
        "roles": ", ".join(
            f"{shape.count}x{role} {shape.instance_type}" if typed else f"{shape.count}x{role}"
            for role, shape in spec.roles().items()
        ),
        "strategy": spec.strategy,
        "workers": spec.cluster.workers.count,
        "ps": spec.cluster.ps.count if spec.strategy == "parameter_server" else 0,
        "global_steps_per_sec": metrics.global_steps_per_sec.model_dump()
        if metrics and metrics.global_steps_per_sec
        else None,
        "examples_per_sec": metrics.examples_per_sec.model_dump()
        if metrics and metrics.examples_per_sec
        else None,
        # the sizing advisor's examples/s for this shape, made when the run deployed (sizing.record)
        "predicted_examples_per_s": predicted.get("predicted_examples_per_s"),
        "predicted_bound": predicted.get("bound"),
        "steady_examples_per_sec": metrics.steady_examples_per_sec() if metrics else None,
        "input_wait": metrics.input_wait if metrics else None,
        "train_seconds": metrics.train_seconds if metrics else None,
        "wall_seconds": wall,
        "eval_accuracy": metrics.eval_accuracy if metrics else None,
        "scalars": metrics.scalars if metrics else {},  # its eval metrics, or a script's, by name
        "cost_usd": cost_usd(spec, manifest.target, wall, manifest),
        **_spot_columns(spec, manifest, wall, typed),
        "price_table": catalog().prices_as_of,
        "series": [(t, eps) for t, _, eps in metrics.examples_per_sec_series] if metrics else [],
    }


def cells(r: dict[str, Any]) -> list[str]:
    """One run's row as text cells, in COLUMNS order: the terminal's table and the report page's."""
    return [
        r["run"],
        str(r["status"]),
        r["target"],
        r["roles"],
        r["strategy"],
        mean_sd(r["global_steps_per_sec"], "{:.1f}"),
        mean_sd(r["examples_per_sec"], "{:.0f}"),
        num(r.get("predicted_examples_per_s"), "{:.0f}"),
        num(r.get("input_wait"), "{:.0%}"),
        num(r["train_seconds"], "{:.1f}"),
        num(r["wall_seconds"], "{:.0f}"),
        num(r["eval_accuracy"], "{:.4f}"),
        _cost(r),
    ]


def _cost(r: dict[str, Any]) -> str:
    """Dollars, and where spot ran, the on-demand and spot node-hours behind them."""
    cell = num(r["cost_usd"], "{:.4f}")
    if not r.get("spot_hours"):
        return cell
    cell = "?" if r["cost_usd"] is None else cell  # never a guessed spot price
    note = "" if r.get("spot_price") else ", no spot price"
    return f"{cell} (on-demand {r['on_demand_hours']:.2f} h, spot {r['spot_hours']:.2f} h{note})"


def _spot_columns(spec: Spec, manifest: Manifest, wall: float | None, typed: bool) -> dict[str, Any]:
    if not typed or not any(shape.spot for shape in spec.roles().values()):
        return {"on_demand_hours": None, "spot_hours": None, "spot_price": None}
    on_demand, spot = node_hours(spec, manifest, wall)
    price = spec.cluster.workers.spot
    known = f"${price.price_per_hour}/h as of {price.price_as_of}" if price.price_per_hour else None
    return {"on_demand_hours": on_demand, "spot_hours": spot, "spot_price": known}


def compare(refs: list[str]) -> list[dict[str, Any]]:
    """Rows of the runs `refs` name (ids, short ids, @last~N), each with a short label."""
    runs = [Run.open(ref) for ref in refs]
    rows = [row(run) for run in runs]
    for r, label in zip(rows, short_labels([r["run"] for r in rows]), strict=True):
        r["label"] = label
    # the first question when two runs disagree: did they run the same packages?
    first = runs[0].manifest() if runs else None
    for r, run in zip(rows, runs, strict=True):
        r["packages_vs_first"] = lock_changes(first, run.manifest()) if first else []
    return rows


def last_runs(count: int) -> list[str]:
    """The ids of the `count` newest runs, oldest first (the order they were made in)."""
    if count < 1:
        raise DlinfraError(f"--last {count}: compare at least 1 run. Fix: --last 2")
    newest = [run.id for run in list_runs()[:count]]
    if not newest:
        raise DlinfraError("--last: there are no runs yet. Fix: start one with `dlinfra deploy`")
    return newest[::-1]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """examples/s over time per run: where a parameter-server bottleneck shows as a flat ceiling."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for r in rows:
        if not r["series"]:
            continue
        t0 = r["series"][0][0]
        ax.plot(
            [t - t0 for t, _ in r["series"]],
            [eps for _, eps in r["series"]],
            label=f"{r['label']} ({r['roles']})",
        )
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("examples/s")
    ax.set_title("Throughput over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def scaling_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """examples/s against workers, one line per strategy and ps count: measured (solid) and the sizing
    advisor's prediction for each run (dashed), the thesis's scaling figure for your own runs."""
    plt = _pyplot()
    series: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["steady_examples_per_sec"]:
            series.setdefault((r["strategy"], r["ps"]), []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for (_, ps), runs in sorted(series.items()):
        runs.sort(key=lambda r: r["workers"])
        name = f"{ps} ps" if ps else "all-reduce"
        line = ax.plot(
            [r["workers"] for r in runs],
            [r["steady_examples_per_sec"] for r in runs],
            "o-",
            label=f"{name}, measured",
        )[0]
        predicted = [r for r in runs if r["predicted_examples_per_s"]]
        if predicted:
            ax.plot(
                [r["workers"] for r in predicted],
                [r["predicted_examples_per_s"] for r in predicted],
                "--",
                color=line.get_color(),
                label=f"{name}, predicted",
            )
    ax.set_xlabel("workers")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("examples/s")
    ax.set_title("Throughput against workers")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise DlinfraError("a plot needs matplotlib. Fix: pip install 'dlinfra[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def lock_changes(old: Manifest, new: Manifest) -> list[str]:
    """What a refreshed lock changed, package by package: "name a → b", "+name b", "-name a"."""
    changes = []
    for flavor in sorted(set(old.environment) | set(new.environment)):
        a = old.environment[flavor].packages if flavor in old.environment else {}
        b = new.environment[flavor].packages if flavor in new.environment else {}
        prefix = f"{flavor}: " if len(new.environment) > 1 else ""
        changes += package_diff(a, b, prefix)
    return changes


def package_diff(a: dict[str, str], b: dict[str, str], prefix: str = "") -> list[str]:
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in b:
            out.append(f"{prefix}-{name} {a[name]}")
        elif name not in a:
            out.append(f"{prefix}+{name} {b[name]}")
        elif a[name] != b[name]:
            out.append(f"{prefix}{name} {a[name]} \u2192 {b[name]}")
    return out

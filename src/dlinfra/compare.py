"""`dlinfra compare`: recorded runs side by side, the way the thesis compared configurations.

Per run: target, roles x instance types, strategy, global steps/s and examples/s (mean ± sd over
progress intervals), training and wall time, eval accuracy, and cost: instance-hours (wall time of
the run x instances per role) x the dated on-demand price table. Local runs cost nothing.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from dlinfra.deploy import run_store
from dlinfra.errors import DlinfraError
from dlinfra.pricing import ON_DEMAND_USD_PER_HOUR, PRICE_TABLE_DATE
from dlinfra.run import Run
from dlinfra.spec import Spec

COLUMNS = (
    "run",
    "status",
    "target",
    "roles",
    "strategy",
    "global steps/s",
    "examples/s",
    "train s",
    "wall s",
    "accuracy",
    "cost $",
)


def role_counts(spec: Spec) -> dict[str, tuple[int, str]]:
    """role → (count, instance type) of the cluster the spec describes."""
    c = spec.cluster
    roles = {"worker": (c.workers.count, c.workers.instance_type)}
    if spec.strategy == "parameter_server":
        roles = {"chief": (1, c.chief.instance_type), **roles, "ps": (c.ps.count, c.ps.instance_type)}
    return roles


def _seconds(manifest: dict[str, Any]) -> float | None:
    if not manifest.get("started") or not manifest.get("finished"):
        return None
    span = datetime.fromisoformat(manifest["finished"]) - datetime.fromisoformat(manifest["started"])
    return span.total_seconds()


def cost_usd(spec: Spec, target: str, wall_seconds: float | None) -> float | None:
    """Instance-hours x on-demand price; 0 for local runs; None when a type has no price."""
    if target == "local":
        return 0.0
    if wall_seconds is None:
        return None
    per_hour = 0.0
    for count, instance_type in role_counts(spec).values():
        if instance_type not in ON_DEMAND_USD_PER_HOUR:
            return None
        per_hour += count * ON_DEMAND_USD_PER_HOUR[instance_type]
    return per_hour * wall_seconds / 3600


def row(run: Run) -> dict[str, Any]:
    manifest = run.manifest()
    spec = run.spec()
    metrics = (run_store(run).get_json("metrics.json") or {}) if manifest.get("status") == "DONE" else {}
    target = manifest.get("target", spec.target)
    roles = role_counts(spec)
    wall = _seconds(manifest)
    return {
        "run": run.id,
        "status": manifest.get("status"),
        "target": target,
        "roles": ", ".join(
            f"{n}x{role} {'local' if target == 'local' else itype}" for role, (n, itype) in roles.items()
        ),
        "strategy": spec.strategy,
        "global_steps_per_sec": metrics.get("global_steps_per_sec"),
        "examples_per_sec": metrics.get("examples_per_sec"),
        "train_seconds": metrics.get("train_seconds"),
        "wall_seconds": wall,
        "eval_accuracy": metrics.get("eval_accuracy"),
        "cost_usd": cost_usd(spec, target, wall),
        "price_table": PRICE_TABLE_DATE,
        "series": [(t, eps) for t, _, eps in metrics.get("examples_per_sec_series", [])],
    }


def compare(run_ids: list[str]) -> list[dict[str, Any]]:
    return [row(Run.open(run_id)) for run_id in run_ids]


def _mean_sd(stat: dict[str, float] | None, fmt: str) -> str:
    return "-" if not stat else f"{fmt.format(stat['mean'])} ± {fmt.format(stat['sd'])}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def cells(r: dict[str, Any]) -> list[str]:
    """One run as the table's text cells, in COLUMNS order."""
    return [
        r["run"],
        str(r["status"]),
        r["target"],
        r["roles"],
        r["strategy"],
        _mean_sd(r["global_steps_per_sec"], "{:.1f}"),
        _mean_sd(r["examples_per_sec"], "{:.0f}"),
        _num(r["train_seconds"], "{:.1f}"),
        _num(r["wall_seconds"], "{:.0f}"),
        _num(r["eval_accuracy"], "{:.4f}"),
        _num(r["cost_usd"], "{:.4f}"),
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    lines.append(f"\nCost: instance-hours x on-demand prices of {PRICE_TABLE_DATE} (src/dlinfra/pricing.py).")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """examples/s over time per run: where a parameter-server bottleneck shows as a flat ceiling."""
    try:
        import matplotlib
    except ImportError:
        raise DlinfraError("--plot needs matplotlib. Fix: pip install 'dlinfra[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for r in rows:
        if not r["series"]:
            continue
        t0 = r["series"][0][0]
        ax.plot(
            [t - t0 for t, _ in r["series"]],
            [eps for _, eps in r["series"]],
            label=f"{r['run']} ({r['roles']})",
        )
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("examples/s")
    ax.set_title("Throughput over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

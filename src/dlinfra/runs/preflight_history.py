"""Each instance type's preflight history: a uniformly slow cluster has no odd node for its peers to
show, so each type's figures are also judged against what earlier runs measured on it.

The first runs on a type set its baseline (the median of the last KEPT runs, once there are
MIN_RUNS); later runs are judged against it by the chief (runs.preflight.judge). The CLI or the
controller reads the history into the run's store before the nodes start, and adds the run's
figures once its preflight passed with no flag: nodes can read and write only their run's prefix.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from dlinfra.contract import NodeConfig, StoreConfig
from dlinfra.runs.layout import RunStore
from dlinfra.runs.layout.history import TypeHistory
from dlinfra.runs.preflight import baselines
from dlinfra.spec.model import Spec

MIN_RUNS = 2
KEPT = 20


def baseline(runs: list[dict[str, Any]]) -> dict[str, float]:
    """figure → the median over the kept runs, once there are enough of them."""
    if len(runs) < MIN_RUNS:
        return {}
    names = {name for run in runs for name in run["figures"]}
    return {n: statistics.median(r["figures"][n] for r in runs if n in r["figures"]) for n in sorted(names)}


def _history(spec: Spec) -> TypeHistory | None:
    url = spec.storage.url
    if not url:
        return None
    store = StoreConfig.for_run(spec, url)
    return TypeHistory.under(url, store.endpoint_url, store.region)


def snapshot(spec: Spec, configs: dict[str, NodeConfig], store: RunStore) -> None:
    """Before the nodes start: the baselines of the types the checked nodes run on."""
    types = sorted({c.instance_type for c in configs.values() if c.preflight and c.instance_type})
    history = _history(spec) if types else None
    if history is not None:
        store.put_preflight_history({t: b for t in types if (b := baseline(history.runs(t)))})


def record(spec: Spec, store: RunStore, run_id: str) -> None:
    """After the run: its figures per type, if its last round passed with nothing flagged."""
    last = store.preflight_rounds()
    if not last or (history := _history(spec)) is None:
        return
    found, verdict = store.preflight_round(last)
    if verdict is None or verdict.flagged or verdict.action != "train":
        return
    for kind, figures in baselines(list(found.values())).items():
        runs = [r for r in history.runs(kind) if r["run_id"] != run_id]
        history.put_runs(kind, [*runs, {"run_id": run_id, "time": time.time(), "figures": figures}][-KEPT:])

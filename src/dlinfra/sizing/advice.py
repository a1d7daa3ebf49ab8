"""From predictions to advice: the scaling curve around a spec, its knee, and a cheaper shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dlinfra.sizing.model_size import ModelSize
from dlinfra.sizing.predict import Point

KNEE_GAIN = 0.10  # a worker that adds less than this share of throughput is past the knee
NEAR_BEST = 0.10  # configurations within this share of the best throughput count as as good
MAX_PS = 4


@dataclass(frozen=True)
class Advice:
    spec: Point
    curve: list[Point]  # workers 1..2N (and under parameter servers, 1..4 ps)
    compute_known: bool
    past_knee: str | None = None  # why the spec's last worker is wasted, or None
    better: Point | None = None  # the cheapest configuration within NEAR_BEST of the best
    assumptions: list[str] = field(default_factory=list)
    size: ModelSize | None = None

    @property
    def best(self) -> Point:
        return max(self.curve, key=lambda p: p.examples_per_s)


def advise(
    at: Callable[[int, int], Point],
    workers: int,
    ps: int,
    compute_known: bool,
    assumptions: list[str],
    warn: bool = True,
) -> Advice:
    """`at(workers, ps)` predicts one configuration; `ps` is 0 under multi_worker_mirrored. `warn`:
    the shape is a choice that costs (not a local cluster sharing one machine to try the plumbing)."""
    shapes = [(w, p) for p in (range(1, MAX_PS + 1) if ps else (0,)) for w in range(1, 2 * workers + 1)]
    curve = [at(w, p) for w, p in shapes]
    spec = at(workers, ps)
    advice = Advice(spec, curve, compute_known, assumptions=assumptions)
    if not (warn and compute_known) or workers < 2:
        return advice  # links alone bound from above: where the knee falls depends on the compute
    fewer = at(workers - 1, ps)
    gain = spec.examples_per_s / fewer.examples_per_s - 1
    if gain >= KNEE_GAIN:
        return advice
    why = (
        f"past the knee: worker {workers} adds {gain:.0%} throughput "
        f"({fewer.examples_per_s:,.0f} -> {spec.examples_per_s:,.0f} examples/s), bound: {spec.bound}"
    )
    return Advice(spec, curve, compute_known, why, _cheapest_near_best(curve), assumptions)


def _cheapest_near_best(curve: list[Point]) -> Point:
    best = max(p.examples_per_s for p in curve)
    good = [p for p in curve if p.examples_per_s >= (1 - NEAR_BEST) * best]
    # no prices (local): fewest nodes; then the faster
    return min(good, key=lambda p: (p.usd_per_hour or 0.0, p.workers + p.ps, -p.examples_per_s))

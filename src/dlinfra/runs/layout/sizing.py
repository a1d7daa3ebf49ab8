"""`<storage.url>/sizing/`: what the sizing advisor learns, shared by every experiment that stores
there (the results bucket on aws, DLINFRA_HOME/sizing for local runs without a storage.url):

    sizing/profiles/<model>/<device>.json   a model's measured step (`dlinfra profile`, or a run)
    sizing/runs/<model>.json                each run's measured throughput beside its prediction

`<model>` is a digest of what sets a step's work (the model, its input, the batch, the precision);
`<device>` an instance type, or `local-<cpu>` for this machine.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from dlinfra.errors import StoreError
from dlinfra.runs.store import Store
from dlinfra.runs.store_url import open_store

SIZING = "sizing"
KEPT_RUNS = 100


class _Record(BaseModel):
    # dlinfra's own records: more keys are fine (an older or newer dlinfra wrote them)
    model_config = ConfigDict(extra="allow")


class _Profile(_Record):
    # over a day is no measurement (1e300 overflowed the advisor)
    step_seconds: float = Field(gt=0, le=86_400, allow_inf_nan=False)
    parameters: int = Field(ge=0)
    trainable: int = Field(ge=0)
    gradient_elements: int | None = Field(None, ge=0)
    variables: list[Annotated[int, Field(ge=0)]] = []


class _Run(_Record):
    run_id: str
    workers: int = Field(ge=1)
    ps: int | None = Field(None, ge=0)
    examples_per_s: float = Field(ge=0, allow_inf_nan=False)
    predicted_examples_per_s: float | None = Field(None, ge=0, allow_inf_nan=False)


class _Runs(_Record):
    runs: list[_Run] = []


class _Prediction(_Record):
    """A run's own `sizing.json`: the advisor's figures for its shape, made when it deployed."""

    model: str
    device: str
    strategy: str
    workers: int = Field(ge=1)
    parameter_bytes: int | None = Field(None, ge=0)
    gradient_bytes: int | None = Field(None, ge=0)


def checked(found: Any, shape: type[_Record], uri: str) -> dict[str, Any] | None:
    """`found` (a JSON object read from `uri`) as `shape` has it, keys it lacked still absent; None
    when there is none. A StoreError (exit 2) names the object, the field and the fix."""
    if found is None or found in ([], {}):  # none yet, or emptied: what either always meant here
        return None
    try:
        return TypeAdapter(shape).validate_python(found).model_dump(exclude_unset=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        why = "Input should be a JSON object" if first["type"] == "model_type" else first["msg"]
        raise StoreError(
            f"{uri}: {field}: {why}, so this sizing record is not one dlinfra wrote. Fix: delete it "
            "(the next profile, run or deploy records it anew), or restore it from a copy"
        ) from None


def prediction(found: Any, uri: str) -> dict[str, Any] | None:
    return checked(found, _Prediction, uri)


class SizingHistory:
    """Each object is read through its shape: the history is a bucket's, which anyone with write
    access (or a hand edit, or an older dlinfra) may have left in another form."""

    def __init__(self, store: Store):
        self.store = store

    @classmethod
    def under(cls, storage_url: str, endpoint_url: str | None, region: str | None) -> SizingHistory:
        return cls(open_store(f"{storage_url.rstrip('/')}/{SIZING}", endpoint_url, region))

    @property
    def uri(self) -> str:
        return self.store.uri("")

    def profile(self, model: str, device: str) -> dict[str, Any] | None:
        return self._read(f"profiles/{model}/{device}.json", _Profile)

    def put_profile(self, model: str, device: str, record: dict[str, Any]) -> None:
        self.store.put_json(f"profiles/{model}/{device}.json", record)

    def runs(self, model: str) -> list[dict[str, Any]]:
        """Oldest first."""
        found = self._read(f"runs/{model}.json", _Runs)
        return list(found["runs"]) if found else []

    def add_run(self, model: str, record: dict[str, Any]) -> None:
        kept = [r for r in self.runs(model) if r.get("run_id") != record.get("run_id")]
        self.store.put_json(f"runs/{model}.json", {"model": model, "runs": [*kept, record][-KEPT_RUNS:]})

    def _read(self, key: str, shape: type[_Record]) -> dict[str, Any] | None:
        return checked(self.store.get_json(key), shape, self.store.uri(key))

"""The model an experiment trains: a built-in one by name, or a declarative list of layers
(hyperparameters as code, versioned with the experiment)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from dlinfra.spec.input import StrictModel

PositiveInt = Annotated[int, Field(ge=1)]

LayerType = Literal[
    "dense", "conv2d", "max_pool2d", "flatten", "dropout", "batch_norm", "global_avg_pool2d", "reshape"
]
_LAYER_REQUIRES: dict[str, tuple[str, ...]] = {
    "dense": ("units",),
    "conv2d": ("filters",),
    "dropout": ("rate",),
    "reshape": ("target_shape",),
}


class LayerSpec(StrictModel):
    """One layer of a declarative model (hyperparameters as code, versioned with the experiment)."""

    type: LayerType
    units: PositiveInt | None = None
    filters: PositiveInt | None = None
    kernel_size: PositiveInt = 3
    pool_size: PositiveInt = 2
    strides: PositiveInt = 1
    padding: Literal["same", "valid"] = "same"
    activation: Literal["relu", "tanh", "sigmoid", "gelu", "linear"] | None = None
    rate: float | None = Field(None, ge=0, lt=1)
    target_shape: list[PositiveInt] | None = None

    @model_validator(mode="after")
    def _required_fields(self) -> LayerSpec:
        missing = [f for f in _LAYER_REQUIRES.get(self.type, ()) if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type} layer needs {', '.join(missing)}")
        return self


class ModelSpec(StrictModel):
    name: Literal["cnn", "resnet20", "mlp", "layers"] = Field(
        "cnn", description="Built-in model, or 'layers' for the declarative list below."
    )
    hidden_units: list[PositiveInt] = Field([128, 64], description="MLP hidden layer sizes.")
    layers: list[LayerSpec] | None = Field(None, description="Declarative model (name: layers).")

    @model_validator(mode="after")
    def _layers_match_name(self) -> ModelSpec:
        if self.name == "layers" and not self.layers:
            raise ValueError("name 'layers' needs a non-empty 'layers' list")
        if self.name != "layers" and self.layers:
            raise ValueError("'layers' is only used with name: layers")
        return self

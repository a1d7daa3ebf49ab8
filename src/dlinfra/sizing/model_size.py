"""A built-in model's size and arithmetic from the spec alone, without TensorFlow.

The sizing advisor answers in `plan` and `validate`, which must not pay TensorFlow's import (seconds)
to count weights. Keras's rules are followed layer by layer (a test holds every built-in and layer
type to Keras's own count): a Dense layer acts on the last axis, Conv2D and BatchNormalization on
the channels, pooling strides by its size. A program's own model (`training.entrypoint`, a script)
is not known here: `dlinfra profile` measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlinfra.spec.dataset import DatasetSpec
from dlinfra.spec.layers import LayerSpec, ModelSpec

FLOAT32 = 4
# a training step: the forward pass, then gradients with respect to activations and to weights
TRAIN_FLOPS_PER_FORWARD = 3

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ModelSize:
    parameters: int  # every variable's elements: what a parameter-server worker reads each step
    trainable: int  # the gradient's elements: what it sends back, and what an all-reduce sums
    forward_flops: int  # per example
    # each variable's elements in the order the model makes them: parameter servers take variables
    # whole, in turn, so one big kernel loads one ps (empty: unknown, taken as split evenly)
    variables: tuple[int, ...] = ()

    @property
    def parameter_bytes(self) -> int:
        return FLOAT32 * self.parameters  # mixed precision keeps float32 variables

    @property
    def gradient_bytes(self) -> int:
        return FLOAT32 * self.trainable

    def step_flops(self, batch: int) -> int:
        return TRAIN_FLOPS_PER_FORWARD * self.forward_flops * batch


def input_of(dataset: DatasetSpec) -> tuple[Shape, int] | None:
    """The examples' shape and class count, or None where only the user's code knows (files)."""
    if dataset.format == "digits":
        return (8, 8, 1), 10
    if dataset.format == "cifar10":
        return (32, 32, 3), 10
    if dataset.format in ("synthetic", "tfrecord"):
        return tuple(dataset.shape), dataset.classes
    return None


class _Counter:
    def __init__(self, shape: Shape):
        self.shape = shape
        self.parameters = self.trainable = self.flops = 0
        self.variables: list[int] = []

    def weights(self, *trainable: int, frozen: tuple[int, ...] = ()) -> None:
        self.trainable += sum(trainable)
        self.parameters += sum(trainable) + sum(frozen)
        self.variables += [*trainable, *frozen]

    def dense(self, units: int, bias: bool = True) -> None:
        inputs = self.shape[-1]
        self.weights(inputs * units, *([units] if bias else []))
        self.flops += 2 * inputs * units * math.prod(self.shape[:-1])
        self.shape = (*self.shape[:-1], units)

    def conv(
        self, filters: int, kernel: int, strides: int = 1, padding: str = "same", bias: bool = True
    ) -> None:
        height, width, channels = self._image("conv2d")
        out = (_spatial(height, kernel, strides, padding), _spatial(width, kernel, strides, padding))
        self.weights(kernel * kernel * channels * filters, *([filters] if bias else []))
        self.flops += 2 * kernel * kernel * channels * filters * out[0] * out[1]
        self.shape = (*out, filters)

    def pool(self, size: int, padding: str) -> None:
        height, width, channels = self._image("max_pool2d")
        self.shape = (_spatial(height, size, size, padding), _spatial(width, size, size, padding), channels)

    def batch_norm(self) -> None:
        channels = self.shape[-1]
        # gamma and beta learn; the moving mean and variance do not
        self.weights(channels, channels, frozen=(channels, channels))
        self.flops += 2 * math.prod(self.shape)

    def flatten(self) -> None:
        self.shape = (math.prod(self.shape),)

    def global_pool(self) -> None:
        self.shape = (self._image("global_avg_pool2d")[2],)

    def _image(self, layer: str) -> tuple[int, int, int]:
        if len(self.shape) != 3:
            raise ValueError(f"a {layer} layer needs height, width and channels (got {self.shape})")
        return self.shape[0], self.shape[1], self.shape[2]


def _spatial(size: int, kernel: int, strides: int, padding: str) -> int:
    out = math.ceil(size / strides) if padding == "same" else (size - kernel) // strides + 1
    if out < 1:
        raise ValueError(f"a window of {kernel} does not fit a side of {size} with padding {padding}")
    return out


def size_of(model: ModelSpec, shape: Shape, classes: int) -> ModelSize:
    """What `training.models.build(model, shape, classes)` makes; ValueError if it cannot be built."""
    count = _Counter(shape)
    if model.name == "cnn":
        count.conv(32, 3)
        count.conv(64, 3)
        count.pool(2, "valid")
        count.flatten()
        count.dense(128)
    elif model.name == "resnet20":
        _resnet20(count)
    elif model.name == "mlp":
        count.flatten()
        for units in model.hidden_units:
            count.dense(units)
    else:
        for layer in model.layers or []:
            _layer(count, layer)
        if len(count.shape) > 1:
            count.flatten()
    count.dense(classes)
    return ModelSize(count.parameters, count.trainable, count.flops, tuple(count.variables))


def _resnet20(count: _Counter) -> None:
    def conv_bn(filters: int, strides: int = 1) -> None:
        count.conv(filters, 3, strides, bias=False)
        count.batch_norm()

    conv_bn(16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage > 0 and block == 0 else 1
            entering = count.shape
            conv_bn(filters, strides)
            conv_bn(filters)
            if strides != 1 or entering[-1] != filters:
                after = count.shape
                count.shape = entering  # the shortcut's 1x1 convolution reads the block's input
                count.conv(filters, 1, strides, bias=False)
                count.shape = after
    count.global_pool()


def _layer(count: _Counter, layer: LayerSpec) -> None:
    match layer.type:
        case "dense":
            count.dense(layer.units or 0)
        case "conv2d":
            count.conv(layer.filters or 0, layer.kernel_size, layer.strides, layer.padding)
        case "max_pool2d":
            count.pool(layer.pool_size, layer.padding)
        case "flatten":
            count.flatten()
        case "batch_norm":
            count.batch_norm()
        case "global_avg_pool2d":
            count.global_pool()
        case "reshape":
            target = tuple(layer.target_shape or ())
            if math.prod(target) != math.prod(count.shape):
                raise ValueError(f"reshape to {target} from {count.shape}: the sizes differ")
            count.shape = target
        case "dropout":
            pass

"""Built-in models (small CNN, CIFAR-style ResNet-20, MLP) and the declarative `layers:` model.

All output logits; the loss applies the softmax.
"""

from __future__ import annotations

from typing import Any

from dlinfra.spec.layers import LayerSpec, ModelSpec


def build(spec: ModelSpec, input_shape: tuple[int, ...], classes: int) -> Any:
    import keras

    inputs = keras.Input(shape=input_shape)
    if spec.name == "cnn":
        x = _cnn(inputs)
    elif spec.name == "resnet20":
        x = _resnet20(inputs)
    elif spec.name == "mlp":
        x = keras.layers.Flatten()(inputs)
        for units in spec.hidden_units:
            x = keras.layers.Dense(units, activation="relu")(x)
    else:
        x = inputs
        for layer in spec.layers or []:
            x = _layer(layer)(x)
        if len(x.shape) > 2:
            x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=spec.name)


def _cnn(x: Any) -> Any:
    import keras

    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(128, activation="relu")(x)


def _resnet20(x: Any) -> Any:
    """He et al. 2016, CIFAR variant: 3 stages x 3 basic blocks, 16/32/64 filters."""
    import keras
    from keras import layers

    def conv_bn(y: Any, filters: int, strides: int = 1, relu: bool = True) -> Any:
        y = layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False)(y)
        y = layers.BatchNormalization()(y)
        return layers.ReLU()(y) if relu else y

    x = conv_bn(x, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = conv_bn(x, filters, strides)
            y = conv_bn(y, filters, relu=False)
            if strides != 1 or shortcut.shape[-1] != filters:
                shortcut = layers.Conv2D(filters, 1, strides=strides, use_bias=False)(shortcut)
            x = layers.ReLU()(keras.layers.add([y, shortcut]))
    return layers.GlobalAveragePooling2D()(x)


def _layer(spec: LayerSpec) -> Any:
    from keras import layers

    match spec.type:
        case "dense":
            return layers.Dense(spec.units, activation=spec.activation)
        case "conv2d":
            return layers.Conv2D(
                spec.filters,
                spec.kernel_size,
                strides=spec.strides,
                padding=spec.padding,
                activation=spec.activation,
            )
        case "max_pool2d":
            return layers.MaxPooling2D(spec.pool_size, padding=spec.padding)
        case "flatten":
            return layers.Flatten()
        case "dropout":
            return layers.Dropout(spec.rate)
        case "batch_norm":
            return layers.BatchNormalization()
        case "global_avg_pool2d":
            return layers.GlobalAveragePooling2D()
        case "reshape":
            return layers.Reshape(tuple(spec.target_shape or ()))
    raise ValueError(f"unknown layer type {spec.type!r}")

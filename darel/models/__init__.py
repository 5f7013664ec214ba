"""Model builders. Register new architectures in ``MODELS`` (see ``resnet.py``)."""

from __future__ import annotations

from darel.models.resnet import (
    MODELS,
    STEMS,
    BasicBlock,
    LayerFactory,
    ResNet,
    build_model,
    count_parameters,
    resnet18,
)

__all__ = [
    "MODELS",
    "STEMS",
    "BasicBlock",
    "LayerFactory",
    "ResNet",
    "build_model",
    "count_parameters",
    "resnet18",
]

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

# Imported for its side effect too: it registers "resnet18_hc" in MODELS.
from darel.models.hypercomplex import (  # noqa: E402
    ALGEBRAS,
    HyperBatchNorm2d,
    HyperConv2d,
    HyperLayerFactory,
    HyperLinear,
    PRODUCT_PATHS,
    ResNet18HC,
    algebra_square,
    count_macs_per_image,
    resnet18_hc,
    set_product_path,
)

__all__ = [
    "ALGEBRAS",
    "MODELS",
    "PRODUCT_PATHS",
    "STEMS",
    "BasicBlock",
    "HyperBatchNorm2d",
    "HyperConv2d",
    "HyperLayerFactory",
    "HyperLinear",
    "LayerFactory",
    "ResNet",
    "ResNet18HC",
    "algebra_square",
    "build_model",
    "count_macs_per_image",
    "count_parameters",
    "resnet18",
    "resnet18_hc",
    "set_product_path",
]

"""ResNet18 built from a pluggable layer factory.

The topology (stem, four stages of two BasicBlocks, pooling, head) is written once.
Every layer that holds weights is requested from a ``LayerFactory``, so a
hypercomplex variant only has to supply another factory: the wiring, strides and
residual connections stay identical and cannot drift between the two models.

Module and parameter names follow the usual ResNet naming (``conv1``, ``bn1``,
``layer1.0.conv1``, ``layer2.0.downsample.0`` …, ``fc``) so that parameter lists
can be compared with other implementations name by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

RESNET18_BLOCKS_PER_STAGE = (2, 2, 2, 2)
STEMS = ("cifar", "imagenet")


@dataclass(frozen=True)
class LayerFactory:
    """Creates the weight-holding layers of a network; the default is real-valued.

    A subclass (e.g. a hypercomplex one) overrides these methods and is responsible
    for initialising what it creates.
    """

    def conv(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int) -> nn.Module:
        layer = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)
        # fan_out keeps the variance of gradients stable through the ReLU network.
        nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
        return layer

    def bn(self, channels: int) -> nn.Module:
        layer = nn.BatchNorm2d(channels)
        nn.init.ones_(layer.weight)
        nn.init.zeros_(layer.bias)
        return layer

    def act(self) -> nn.Module:
        return nn.ReLU(inplace=True)

    def linear(self, in_features: int, out_features: int) -> nn.Module:
        return nn.Linear(in_features, out_features)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 projection when shapes change)."""

    def __init__(self, layers: LayerFactory, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = layers.conv(in_channels, out_channels, 3, stride, 1)
        self.bn1 = layers.bn(out_channels)
        self.act1 = layers.act()
        self.conv2 = layers.conv(out_channels, out_channels, 3, 1, 1)
        self.bn2 = layers.bn(out_channels)
        self.act2 = layers.act()
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                layers.conv(in_channels, out_channels, 1, stride, 0),
                layers.bn(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act2(out + shortcut)


class ResNet(nn.Module):
    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        width: int,
        stem: str,
        blocks_per_stage: tuple[int, ...],
        layers: LayerFactory,
    ) -> None:
        super().__init__()
        if stem not in STEMS:
            raise ValueError(f"unknown stem {stem!r}; expected one of {STEMS}")
        self.stem = stem
        if stem == "cifar":
            # Small images: keep full resolution into stage 1 (no stride, no max-pool).
            self.conv1 = layers.conv(in_channels, width, 3, 1, 1)
        else:
            self.conv1 = layers.conv(in_channels, width, 7, 2, 3)
        self.bn1 = layers.bn(width)
        self.act1 = layers.act()
        self.maxpool: nn.Module = (
            nn.Identity() if stem == "cifar" else nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        )

        channels = width
        for stage_index, n_blocks in enumerate(blocks_per_stage):
            stage_width = width * 2**stage_index
            first_stride = 1 if stage_index == 0 else 2
            blocks = []
            for block_index in range(n_blocks):
                stride = first_stride if block_index == 0 else 1
                blocks.append(BasicBlock(layers, channels, stage_width, stride))
                channels = stage_width
            self.add_module(f"layer{stage_index + 1}", nn.Sequential(*blocks))
        self.n_stages = len(blocks_per_stage)

        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = layers.linear(self.head_features(channels), num_classes)

    def head_features(self, channels: int) -> int:
        """Features entering the classifier; a variant that widens them overrides this."""
        return channels

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled, flattened features before the classifier."""
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        for stage_index in range(self.n_stages):
            x = getattr(self, f"layer{stage_index + 1}")(x)
        return torch.flatten(self.avgpool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def resnet18(
    num_classes: int,
    in_channels: int = 3,
    width: int = 64,
    stem: str = "cifar",
    layers: LayerFactory | None = None,
) -> ResNet:
    """ResNet18 (BasicBlock, [2, 2, 2, 2]); ``width`` is the channel count of stage 1."""
    for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; expected one of {STEMS}")
    return ResNet(num_classes, in_channels, width, stem, RESNET18_BLOCKS_PER_STAGE, layers or LayerFactory())


MODELS: dict[str, Callable[..., nn.Module]] = {"resnet18": resnet18}


def build_model(name: str, num_classes: int, in_channels: int = 3, width: int = 64, **kwargs) -> nn.Module:
    """Build a registered model by name; extra keyword arguments go to its builder."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}") from None
    return builder(num_classes=num_classes, in_channels=in_channels, width=width, **kwargs)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)

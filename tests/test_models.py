from __future__ import annotations

import pytest
import torch
from torch import nn

from darel.models import MODELS, build_model, count_parameters, resnet18


@pytest.mark.parametrize("size", [32, 16])
def test_forward_shape(size: int) -> None:
    model = resnet18(num_classes=7, in_channels=3, width=8)
    out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, 7)


def test_single_channel_input() -> None:
    model = resnet18(num_classes=10, in_channels=1, width=4)
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 10)


def test_width_scaling_is_roughly_quadratic() -> None:
    narrow = count_parameters(resnet18(num_classes=10, width=8))
    wide = count_parameters(resnet18(num_classes=10, width=16))
    # Convolutions dominate and scale with width^2; BN and the head scale linearly.
    assert 3.5 < wide / narrow < 4.05


def test_backward_reaches_every_parameter() -> None:
    model = resnet18(num_classes=5, width=4)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_cifar_stem_keeps_resolution() -> None:
    model = resnet18(num_classes=10, width=8, stem="cifar")
    assert isinstance(model.conv1, nn.Conv2d)
    assert model.conv1.kernel_size == (3, 3)
    assert model.conv1.stride == (1, 1)
    assert model.conv1.padding == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    # Stage 1 sees the full input resolution.
    stage1 = model.layer1(model.act1(model.bn1(model.conv1(torch.randn(1, 3, 32, 32)))))
    assert stage1.shape[-2:] == (32, 32)


def test_imagenet_stem() -> None:
    model = resnet18(num_classes=10, width=8, stem="imagenet")
    assert model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 1


def test_init() -> None:
    model = resnet18(num_classes=10, width=8)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)
    # Kaiming normal, fan_out, ReLU gain: std = sqrt(2 / (out_channels * k * k)).
    conv = model.layer4[0].conv2
    expected = (2.0 / (conv.out_channels * 9)) ** 0.5
    assert conv.weight.std().item() == pytest.approx(expected, rel=0.1)


def test_imagenet_parameter_count_matches_reference() -> None:
    assert count_parameters(resnet18(num_classes=1000, stem="imagenet")) == 11_689_512


def test_cifar_parameter_count() -> None:
    # The widely quoted size of the CIFAR-100 ResNet18 (3x3 stem, no max-pool).
    assert count_parameters(resnet18(num_classes=100, stem="cifar")) == 11_220_132


def test_registry() -> None:
    assert "resnet18" in MODELS
    model = build_model("resnet18", num_classes=3, in_channels=1, width=4)
    assert model(torch.randn(1, 1, 16, 16)).shape == (1, 3)
    with pytest.raises(ValueError, match="resnet18"):
        build_model("resnet1000", num_classes=3, in_channels=1, width=4)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_classes": 0},
        {"num_classes": 10, "width": 0},
        {"num_classes": 10, "in_channels": -1},
        {"num_classes": 10, "stem": "tiny"},
    ],
)
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        resnet18(**kwargs)


def _shapes(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def test_matches_torchvision_shapes() -> None:
    models = pytest.importorskip("torchvision.models")
    reference = _shapes(models.resnet18(num_classes=100))
    ours_imagenet = _shapes(resnet18(num_classes=100, stem="imagenet"))
    assert [s for _, s in ours_imagenet] == [s for _, s in reference]
    assert [n for n, _ in ours_imagenet] == [n for n, _ in reference]

    ours_cifar = _shapes(resnet18(num_classes=100, stem="cifar"))
    assert len(ours_cifar) == len(reference)
    for (name, ours_shape), (ref_name, ref_shape) in zip(ours_cifar, reference):
        assert name == ref_name
        if name == "conv1.weight":
            assert ours_shape == (64, 3, 3, 3) and ref_shape == (64, 3, 7, 7)
        else:
            assert ours_shape == ref_shape, name

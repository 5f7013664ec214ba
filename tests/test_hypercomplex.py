from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from darel.models import MODELS, build_model, count_parameters, resnet18
from darel.models.hypercomplex import (
    ALGEBRAS,
    HyperBatchNorm2d,
    HyperConv2d,
    HyperLayerFactory,
    HyperLinear,
    ResNet18HC,
    algebra_square,
    block_kernel,
    count_macs_per_image,
    hyper_product,
    naive_hyper_product,
    resnet18_hc,
    set_product_path,
)

ALGEBRA_NAMES = sorted(ALGEBRAS)


def _value_and_grads(layer: nn.Module, path: str, x: torch.Tensor, upstream: torch.Tensor):
    """Output of ``layer.<path>(x)`` and the gradients of <output, upstream> w.r.t. x, W_a, W_b."""
    x = x.detach().clone().requires_grad_(True)
    out = getattr(layer, path)(x)
    grads = torch.autograd.grad((out * upstream).sum(), (x, layer.weight_a, layer.weight_b))
    return out.detach(), grads


def _assert_paths_agree(layer: nn.Module, x: torch.Tensor, other_path: str = "naive_forward") -> None:
    torch.manual_seed(1)
    upstream = torch.randn_like(layer(x))
    fast, fast_grads = _value_and_grads(layer, "forward", x, upstream)
    slow, slow_grads = _value_and_grads(layer, other_path, x, upstream)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-10)
    for name, g_fast, g_slow in zip(("input", "W_a", "W_b"), fast_grads, slow_grads):
        torch.testing.assert_close(g_fast, g_slow, rtol=0, atol=1e-10, msg=f"gradient w.r.t. {name}")


# --- the product --------------------------------------------------------------------


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
@pytest.mark.parametrize("kernel_size,stride,padding", [(3, 1, 1), (3, 2, 1), (1, 2, 0)])
def test_conv_efficient_path_matches_definition(algebra: str, kernel_size: int, stride: int, padding: int) -> None:
    torch.manual_seed(0)
    layer = HyperConv2d(6, 10, kernel_size, stride, padding, algebra=algebra).double()
    _assert_paths_agree(layer, torch.randn(3, 6, 9, 9, dtype=torch.float64))


def test_complex_gauss_path_matches_definition() -> None:
    torch.manual_seed(0)
    layer = HyperConv2d(8, 4, 3, 1, 1, algebra="complex").double()
    x = torch.randn(2, 8, 7, 7, dtype=torch.float64)
    torch.testing.assert_close(layer.gauss_forward(x), layer.naive_forward(x), rtol=0, atol=1e-10)
    _assert_paths_agree(layer, x, other_path="gauss_forward")
    with pytest.raises(ValueError, match="dual"):
        HyperConv2d(2, 2, 1, algebra="dual").gauss_forward(torch.zeros(1, 2, 1, 1))


def _set_scalar_weights(layer: nn.Module, w_a: float, w_b: float) -> None:
    with torch.no_grad():
        layer.weight_a.fill_(w_a)
        layer.weight_b.fill_(w_b)


def _by_hand(a: float, b: float, w_a: float, w_b: float, square: int) -> tuple[float, float]:
    # (a + b e)(w_a + w_b e) = a w_a + a w_b e + b w_a e + b w_b e², with e² = square.
    return a * w_a + b * w_b * square, a * w_b + b * w_a


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_conv_on_single_numbers_is_the_algebra_product(algebra: str) -> None:
    """One hypercomplex channel, 1x1 kernel, 1x1 image: the layer multiplies two numbers."""
    square = ALGEBRAS[algebra]
    layer = HyperConv2d(2, 2, 1, algebra=algebra).double()
    _set_scalar_weights(layer, 5.0, 7.0)
    x = torch.tensor([2.0, 3.0], dtype=torch.float64).reshape(1, 2, 1, 1)
    expected = torch.tensor(_by_hand(2.0, 3.0, 5.0, 7.0, square), dtype=torch.float64)
    torch.testing.assert_close(layer.naive_forward(x).flatten(), expected, rtol=0, atol=0)
    torch.testing.assert_close(layer(x).flatten(), expected, rtol=0, atol=1e-12)
    # Concrete values: e² = -1 is (2+3i)(5+7i) = -11+29i; dual 10 + 29e; double 31 + 29e.
    assert tuple(layer.naive_forward(x).flatten().tolist()) == {"complex": (-11.0, 29.0), "dual": (10.0, 29.0),
                                                                "double": (31.0, 29.0)}[algebra]


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_product_matches_the_matrix_representation(algebra: str) -> None:
    """Independent check: a + b e acts like the real 2x2 matrix [[a, s b], [b, a]]."""
    square = ALGEBRAS[algebra]
    torch.manual_seed(3)
    a, b, w_a, w_b = torch.randn(4, dtype=torch.float64).tolist()

    def as_matrix(re: float, hy: float) -> torch.Tensor:
        return torch.tensor([[re, square * hy], [hy, re]], dtype=torch.float64)

    product = as_matrix(a, b) @ as_matrix(w_a, w_b)
    layer = HyperConv2d(2, 2, 1, algebra=algebra).double()
    _set_scalar_weights(layer, w_a, w_b)
    x = torch.tensor([a, b], dtype=torch.float64).reshape(1, 2, 1, 1)
    out = layer.naive_forward(x).flatten()
    torch.testing.assert_close(out, product[:, 0], rtol=0, atol=1e-12)
    if algebra == "complex":
        z = complex(a, b) * complex(w_a, w_b)
        torch.testing.assert_close(out, torch.tensor([z.real, z.imag], dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_linear_efficient_path_matches_definition(algebra: str) -> None:
    torch.manual_seed(0)
    layer = HyperLinear(12, 6, algebra=algebra).double()
    _assert_paths_agree(layer, torch.randn(5, 12, dtype=torch.float64))
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    layer(x).sum().backward()
    assert layer.bias.grad is not None and torch.all(layer.bias.grad == 5)


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_linear_on_single_numbers(algebra: str) -> None:
    layer = HyperLinear(2, 2, algebra=algebra).double()
    _set_scalar_weights(layer, 5.0, 7.0)
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([0.5, -0.25]))
    x = torch.tensor([[2.0, 3.0]], dtype=torch.float64)
    real, hyper = _by_hand(2.0, 3.0, 5.0, 7.0, ALGEBRAS[algebra])
    expected = torch.tensor([[real + 0.5, hyper - 0.25]], dtype=torch.float64)
    torch.testing.assert_close(layer.naive_forward(x), expected, rtol=0, atol=0)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)


def test_init_matches_real_conv_output_scale() -> None:
    """Complex/double: each output part has the variance a real conv of the same size gives."""
    torch.manual_seed(0)
    x = torch.randn(4, 64, 12, 12)
    with torch.no_grad():
        real_var = torch.stack([nn.functional.conv2d(x, _kaiming_real(64, 64)).var() for _ in range(4)]).mean()
        for algebra in ("complex", "double"):
            hyper_var = torch.stack([HyperConv2d(64, 64, 3, algebra=algebra)(x).var() for _ in range(4)]).mean()
            assert 0.85 < hyper_var / real_var < 1.15, algebra


def _kaiming_real(in_channels: int, out_channels: int) -> torch.Tensor:
    weight = torch.empty(out_channels, in_channels, 3, 3)
    return nn.init.kaiming_normal_(weight, mode="fan_out", nonlinearity="relu")


def test_split_batch_norm_and_factory_layers() -> None:
    bn = HyperBatchNorm2d(6)
    x = torch.randn(8, 6, 4, 4) * torch.arange(1, 7).reshape(1, 6, 1, 1) + 3
    out = bn(x)
    # Every real channel, i.e. each part of each hypercomplex channel, is normalised on its own.
    torch.testing.assert_close(out.mean(dim=(0, 2, 3)), torch.zeros(6), rtol=0, atol=1e-5)
    factory = HyperLayerFactory("double")
    assert isinstance(factory.conv(4, 8, 3, 1, 1), HyperConv2d)
    assert isinstance(factory.bn(8), HyperBatchNorm2d)
    assert isinstance(factory.act(), nn.ReLU)
    assert type(factory.linear(8, 3)) is nn.Linear


# --- ResNet18-HC --------------------------------------------------------------------


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_resnet18_hc_forward_and_backward(algebra: str) -> None:
    torch.manual_seed(0)
    model = build_model("resnet18_hc", num_classes=5, in_channels=3, width=8, algebra=algebra)
    assert isinstance(model, ResNet18HC) and model.conv1.in_channels == 6
    out = model(torch.randn(4, 3, 16, 16))
    assert out.shape == (4, 5)
    assert model.features(torch.randn(2, 3, 16, 16)).shape == (2, 64)
    nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 3])).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_resnet18_hc_is_registered_and_takes_grey_images() -> None:
    assert MODELS["resnet18_hc"] is resnet18_hc
    model = resnet18_hc(num_classes=10, in_channels=1, width=4, stem="imagenet")
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match=r"\(N, 1, H, W\)"):
        model(torch.randn(2, 2, 32, 32))


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
@pytest.mark.parametrize("width", [8, 64])
def test_parameter_count_against_resnet18(algebra: str, width: int) -> None:
    """Each HC conv holds 2 kernels of (out/2)(in/2)k² = half a real conv's weights, except
    the stem: it reads 2·C_in real channels, so its (w/2)(C_in)k²·2 equals the real stem.
    BN (same real channel counts) and the real head are identical."""
    real = resnet18(num_classes=100, width=width)
    hyper = resnet18_hc(num_classes=100, width=width, algebra=algebra)
    convs_after_stem = sum(m.weight.numel() for name, m in real.named_modules()
                           if isinstance(m, nn.Conv2d) and name != "conv1")
    assert count_parameters(hyper) == count_parameters(real) - convs_after_stem // 2
    if width == 64:
        assert count_parameters(real) == 11_220_132
        assert count_parameters(hyper) == 5_641_380  # ratio 0.5028


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_short_training_run_lowers_the_loss(algebra: str) -> None:
    torch.manual_seed(0)
    labels = torch.arange(32) % 2
    images = torch.randn(32, 3, 16, 16)
    images[labels == 1, 0, 4:12, 4:12] += 1.5  # a learnable signal: a bright square in channel 0
    model = resnet18_hc(num_classes=2, width=8, algebra=algebra)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(20):
        loss = nn.functional.cross_entropy(model(images), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < 0.5 * sum(losses[:3]) / 3, losses


# --- cost accounting ----------------------------------------------------------------


def test_flops_of_single_layers() -> None:
    real_macs = 16 * 8 * 9 * 10 * 10  # out * in * k² * output positions
    assert count_macs_per_image(nn.Conv2d(8, 16, 3, padding=1), (8, 10, 10)) == real_macs
    for algebra, quarters in (("dual", 3), ("double", 2), ("complex", 4)):
        layer = HyperConv2d(8, 16, 3, 1, 1, algebra=algebra)
        assert count_macs_per_image(layer, (8, 10, 10)) == real_macs * quarters // 4
        assert count_macs_per_image(layer, (8, 10, 10), naive=True) == real_macs
    model = nn.Sequential(nn.Flatten(), HyperLinear(8, 4, "double"), nn.Linear(4, 3))
    assert count_macs_per_image(model, (8, 1, 1)) == 8 * 4 // 2 + 4 * 3


def test_flops_of_resnets() -> None:
    real = resnet18(num_classes=100, width=64)
    assert count_macs_per_image(real, (3, 32, 32)) == 555_468_800  # the familiar 0.56 GMAC
    hyper = resnet18_hc(num_classes=100, width=8, algebra="dual")
    naive = count_macs_per_image(hyper, (3, 16, 16), naive=True)
    assert count_macs_per_image(hyper, (3, 16, 16)) < naive
    assert hyper.training  # the count leaves the mode as it was


# --- errors -------------------------------------------------------------------------


def test_unknown_algebra() -> None:
    assert algebra_square("complex") == -1 and algebra_square("dual") == 0 and algebra_square("double") == 1
    for make in (lambda: algebra_square("quaternion"), lambda: HyperConv2d(2, 2, 1, algebra="quaternion"),
                 lambda: HyperLinear(2, 2, algebra="quaternion"), lambda: HyperLayerFactory("quaternion"),
                 lambda: resnet18_hc(10, algebra="quaternion")):
        with pytest.raises(ValueError, match="quaternion.*complex.*double.*dual"):
            make()


@pytest.mark.parametrize("make", [
    lambda: HyperConv2d(3, 4, 3),
    lambda: HyperConv2d(4, 3, 3),
    lambda: HyperLinear(3, 4),
    lambda: HyperBatchNorm2d(3),
    lambda: resnet18_hc(10, width=3),
])
def test_odd_channel_count(make) -> None:
    with pytest.raises(ValueError, match="got 3.*two equal parts"):
        make()


def test_wrong_input_channels() -> None:
    with pytest.raises(ValueError, match=r"\(N, 4, H, W\)"):
        HyperConv2d(4, 4, 3)(torch.zeros(1, 2, 5, 5))


# --- product paths: split (fewest products) and block (no activation copies) ----------


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
@pytest.mark.parametrize("path", ["split", "block"])
@pytest.mark.parametrize("kernel_size,stride,padding", [(3, 1, 1), (3, 2, 1), (1, 2, 0), (7, 2, 3)])
def test_every_path_matches_definition(algebra: str, path: str, kernel_size: int, stride: int, padding: int) -> None:
    torch.manual_seed(0)
    layer = HyperConv2d(6, 10, kernel_size, stride, padding, algebra=algebra, path=path).double()
    x = torch.randn(3, 6, 11, 11, dtype=torch.float64)
    _assert_paths_agree(layer, x)
    _assert_paths_agree(layer, x.contiguous(memory_format=torch.channels_last))


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_block_kernel_is_the_matrix_representation(algebra: str) -> None:
    """1x1 kernels: block_kernel is the 2x2 real matrix of multiplying by W_a + W_b e."""
    square = ALGEBRAS[algebra]
    w_a, w_b = torch.tensor([[[[5.0]]]]), torch.tensor([[[[7.0]]]])
    expected = torch.tensor([[5.0, square * 7.0], [7.0, 5.0]])
    assert torch.equal(block_kernel(w_a, w_b, square).flatten(1), expected)
    with pytest.raises(ValueError, match="e²"):
        block_kernel(w_a, w_b, 2)


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_block_product_for_linear_layers(algebra: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 12, dtype=torch.float64)
    w_a, w_b = torch.randn(2, 3, 6, dtype=torch.float64)
    square = ALGEBRAS[algebra]
    torch.testing.assert_close(hyper_product(x, w_a, w_b, square, F.linear, block=True),
                               naive_hyper_product(x, w_a, w_b, square, F.linear), rtol=0, atol=1e-12)


def test_auto_path_is_split_on_cpu_and_settable() -> None:
    x = torch.zeros(1, 4, 3, 3)
    for algebra in ("dual", "double"):
        layer = HyperConv2d(4, 4, 3, 1, 1, algebra=algebra)
        assert layer.path == "auto" and not layer.uses_block(x)
    assert HyperConv2d(4, 4, 3, 1, 1, algebra="complex", path="split").uses_block(x)  # complex: always one call
    model = resnet18_hc(num_classes=3, width=8, algebra="dual")
    assert set_product_path(model, "block") is model
    convs = [m for m in model.modules() if isinstance(m, HyperConv2d)]
    assert convs and all(m.path == "block" and m.uses_block(x) for m in convs)
    with pytest.raises(ValueError, match="product path"):
        HyperConv2d(4, 4, 3, path="fused")
    with pytest.raises(ValueError, match="product path"):
        set_product_path(model, "fused")


@pytest.mark.parametrize("algebra", ALGEBRA_NAMES)
def test_block_path_makes_no_activation_copies(algebra: str) -> None:
    """Forward and backward of the block path: every operation but the convolution itself
    (and views, which copy nothing) only touches weight-sized tensors: no slice, sum,
    difference or concatenation of an activation. (The dual split path dispatches three
    such passes: the concatenation, the slice's zero-filled gradient and the sum of the
    two input gradients; double's split path twelve.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    layer = HyperConv2d(16, 16, 3, 1, 1, algebra=algebra, path="block")
    x = torch.randn(2, 16, 16, 16, requires_grad=True)
    upstream = torch.randn(2, 16, 16, 16)
    weight_size = layer.weight_a.numel() * 4
    seen: list[tuple[str, int]] = []

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            if not func.is_view:
                seen.append((str(func), max((t.numel() for t in tensors), default=0)))
            return out

    with Largest():
        layer(x).backward(upstream)
    convolutions = {"aten.convolution.default", "aten.convolution_backward.default"}
    assert {name for name, _ in seen} & convolutions == convolutions
    activation_ops = [name for name, size in seen if size > weight_size and name not in convolutions]
    assert not activation_ops, activation_ops

"""Second-order hypercomplex layers and the hypercomplex ResNet18 (ResNet18-HC).

A second-order hypercomplex number is x = a + b·e with real a, b and a unit e whose
square is a fixed real s. Three algebras exist up to scaling:

    complex  e² = -1      dual  e² = 0      double (split-complex)  e² = +1

and the product of an input by a weight follows from distributing and using e² = s:

    (a + b e)(W_a + W_b e) = (a W_a + s · b W_b) + (a W_b + b W_a) e

Storage convention used by every layer here: a feature map with C hypercomplex
channels is an ordinary real tensor with 2C channels, the two parts concatenated along
the channel dimension, ``[a | b]``. All channel counts given to the layers are these
REAL counts, so they must be even. Because of this layout, batch norm and ReLU applied
per real channel are exactly the "split" versions that treat each part on its own, and
the hypercomplex ResNet can reuse the real topology of ``resnet.py`` unchanged.

Cost of one layer, in units of one "quarter product" (a real convolution or matmul
between one part of the input and one weight kernel, i.e. out/2 x in/2 channels):

    naive definition     4   (a W_a, b W_b, a W_b, b W_a)
    dual                 3   (a W_a, and [a | b] against [W_b | W_a] in one call)
    double               2   (diagonal basis a ± b, where the product decouples)
    complex              4   (one stacked call; see ``HyperConv2d`` for why not Gauss's 3)

Every algebra can also run as ONE real product with the 2x2 block kernel
[[W_a, s W_b], [W_b, W_a]] (``block_kernel``): it reads the stored [a | b] and writes
[real | hyper] directly, so no activation is sliced, combined or concatenated, at the
price of 4 quarter products (for dual one of them multiplies a block of zeros).
``HyperConv2d`` picks between the two paths (see ``PRODUCT_PATHS``).

A real layer of the same real size costs 4 quarter products; its weights are twice as
many as the hypercomplex layer's two kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from darel.models.resnet import MODELS, RESNET18_BLOCKS_PER_STAGE, STEMS, LayerFactory, ResNet

ALGEBRAS: dict[str, int] = {"complex": -1, "dual": 0, "double": 1}

# Real products (each between one input part and one kernel) that the efficient path
# runs per layer, by algebra; the naive definition always runs 4.
QUARTER_PRODUCTS: dict[str, int] = {"complex": 4, "dual": 3, "double": 2}
NAIVE_QUARTER_PRODUCTS = 4

# A real bilinear operation (convolution with fixed stride/padding, or a matmul) that
# maps (input with the channel/feature axis at dim 1, weight with (out, in, ...)) to output.
RealProduct = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def algebra_square(name: str) -> int:
    """The value of e² for the named algebra (-1, 0 or +1)."""
    try:
        return ALGEBRAS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown hypercomplex algebra {name!r}; known algebras: {sorted(ALGEBRAS)}") from None


PRODUCT_PATHS = ("auto", "split", "block")


def _check_path(path: str) -> str:
    if path not in PRODUCT_PATHS:
        raise ValueError(f"product path must be one of {PRODUCT_PATHS}, got {path!r}")
    return path


def set_product_path(model: nn.Module, path: str) -> nn.Module:
    """Set ``path`` on every HyperConv2d of ``model`` (benchmarks compare the paths); returns it."""
    _check_path(path)
    for module in model.modules():
        if isinstance(module, HyperConv2d):
            module.path = path
    return model


def _check_even(what: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 2 or value % 2:
        raise ValueError(
            f"{what} must be an even positive integer, got {value!r}: the hypercomplex layers split "
            "the real channels into two equal parts [a | b]"
        )
    return value


# --- the product, written once for convolutions and linear layers ----------------------


def naive_hyper_product(x: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, square: int,
                        product: RealProduct) -> torch.Tensor:
    """The definition, literally: four real products, then combine with e² = ``square``."""
    a, b = x.chunk(2, dim=1)
    real = product(a, weight_a) + square * product(b, weight_b)
    hyper = product(a, weight_b) + product(b, weight_a)
    return torch.cat([real, hyper], dim=1)


def complex_product_gauss(x: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor,
                          product: RealProduct) -> torch.Tensor:
    """Complex product with three real products (Gauss's trick); kept for the benchmark.

    k1 = (a + b) W_a,  k2 = a (W_b - W_a),  k3 = b (W_a + W_b)
    real = k1 - k3 = a W_a - b W_b,   hyper = k1 + k2 = a W_b + b W_a
    """
    a, b = x.chunk(2, dim=1)
    k1 = product(a + b, weight_a)
    k2 = product(a, weight_b - weight_a)
    k3 = product(b, weight_a + weight_b)
    return torch.cat([k1 - k3, k1 + k2], dim=1)


def block_kernel(weight_a: torch.Tensor, weight_b: torch.Tensor, square: int) -> torch.Tensor:
    """The real kernel [[W_a, s W_b], [W_b, W_a]] (out, in, ...) of the product with e² = s.

    Applied to the stored input [a | b] it gives [a W_a + s b W_b | b W_a + a W_b], i.e.
    [real | hyper] with no activation copy. Built per forward from the two parameters
    (a weight-sized copy, negligible next to an activation).
    """
    if square == 0:
        corner = torch.zeros_like(weight_b)
    elif square == -1:
        corner = -weight_b
    elif square == 1:
        corner = weight_b
    else:
        raise ValueError(f"e² must be -1, 0 or +1, got {square!r}")
    return torch.cat([torch.cat([weight_a, corner], dim=1), torch.cat([weight_b, weight_a], dim=1)], dim=0)


def hyper_product(x: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, square: int,
                  product: RealProduct, block: bool = False) -> torch.Tensor:
    """The same value as ``naive_hyper_product`` with fewer real products (see module doc).

    ``block``: one product with ``block_kernel`` instead (the complex algebra always
    takes it).
    """
    if block:
        return product(x, block_kernel(weight_a, weight_b, square))
    if square == 0:
        # b W_b vanishes; the hyper part a W_b + b W_a is one product of the whole
        # stored input [a | b] (no copy needed) with the kernels side by side.
        a = x[:, : weight_a.shape[1]]
        real = product(a, weight_a)
        hyper = product(x, torch.cat([weight_b, weight_a], dim=1))
        return torch.cat([real, hyper], dim=1)
    if square == 1:
        # In the basis u = a + b, v = a - b the double product decouples into two
        # independent real products; the 1/2 of the way back is folded into the kernels.
        a, b = x.chunk(2, dim=1)
        p = product(a + b, (weight_a + weight_b) * 0.5)
        q = product(a - b, (weight_a - weight_b) * 0.5)
        return torch.cat([p + q, p - q], dim=1)
    if square == -1:
        # One real product with the 2x2 block kernel [[W_a, -W_b], [W_b, W_a]]: it reads
        # the stored [a | b] and writes [real | hyper] directly, with no elementwise
        # passes, which beat Gauss's three products in our measurements.
        return product(x, block_kernel(weight_a, weight_b, square))
    raise ValueError(f"e² must be -1, 0 or +1, got {square!r}")


# --- layers -----------------------------------------------------------------------------


class HyperConv2d(nn.Module):
    """Hypercomplex 2-d convolution without bias; channel counts are REAL counts ([a | b]).

    Holds two real kernels W_a, W_b of shape (out/2, in/2, k, k). The split path
    (``path="split"``) computes the algebra's product with as few real multiplications
    as it allows:

    * dual (e² = 0): two convolutions, a*W_a and [a | b]*[W_b | W_a] (3 quarter products);
    * double (e² = +1): two convolutions in the diagonal basis a ± b (2 quarter products);
    * complex (e² = -1): ONE convolution with the stacked kernel [[W_a, -W_b], [W_b, W_a]]
      (4 quarter products). Gauss's trick (``complex_product_gauss``) needs only 3, but
      in ``bench/hypercomplex.py`` on CPU it was no faster at 64-128 channels (within
      noise, forward + backward) and about 2x slower at 16 channels, where its extra
      elementwise passes dominate; it also keeps a + b alive for the backward. So the
      stacked call is used.

    Measured trade-off of the dual path: at 64+ channels it beats one stacked call
    (fewer MACs), but at very small widths (16 channels) its slice of ``a`` and the
    output concatenation cost more than they save.

    ``path`` (dual and double; complex always uses its block kernel):

    * ``"split"``: the paths above, fewest multiplications;
    * ``"block"``: one convolution with ``block_kernel`` = [[W_a, s W_b], [W_b, W_a]],
      no activation copies (no slice of ``a``, no a ± b, no concatenation, forward or
      backward), 4 quarter products;
    * ``"auto"`` (default): block on a CUDA device, split elsewhere. On CPU (2-core
      AMD EPYC, fp32, ``bench/hypercomplex.py``, side by side in one run) split was the
      faster everywhere: one 64-channel 3x3 layer, forward + backward, block/split
      1.03-1.26x for dual and 1.23-1.56x for double (32x32 batch 16 and 56x56 batch 4,
      i.e. the CIFAR and the 224-px stage-1 shapes, NCHW and channels-last); the whole
      ResNet18-HC training step 1.05-1.36x (dual) and 1.6-1.9x (double) at 224 px with
      the ImageNet stem and at 32 px with the CIFAR stem. A CPU convolution is
      compute-bound, so the extra quarter costs its full share. On a GPU the block
      path is the default by the issue's criterion (no concatenation copies) and by
      estimate: each avoided activation pass is memory traffic and a kernel launch,
      while the extra quarter runs on tensor cores. Not measured on a GPU yet;
      ``bench/hypercomplex.py --device cuda`` prints both paths side by side to
      confirm or flip it.

    ``multiply_accumulates`` counts the algebra's products (3 quarters for dual, 2 for
    double) whatever the path; the block path additionally multiplies a zero block
    (dual) or runs the undecoupled product (double).

    ``naive_forward`` is the literal four-convolution definition, for tests and benchmarks.

    Init: Kaiming-normal (fan_out, ReLU) on each kernel, times 1/sqrt(2). Each output part
    sums the products of both input parts (in/2 channels each), i.e. ``in`` real terms,
    as a real conv of the same real size does; Kaiming on the half-size kernel would use
    fan_out = out/2·k² and double the variance, hence the factor. With it, output (and
    backward) variance equals the real conv's for complex and double and for the dual
    hyper part; the dual real part (no b·W_b term) gets half of it.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, algebra: str = "dual", path: str = "auto") -> None:
        super().__init__()
        self.square = algebra_square(algebra)
        self.algebra = algebra
        self.path = _check_path(path)
        self.in_channels = _check_even("in_channels", in_channels)
        self.out_channels = _check_even("out_channels", out_channels)
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
            raise ValueError(f"kernel_size must be a positive integer, got {kernel_size!r}")
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        shape = (out_channels // 2, in_channels // 2, kernel_size, kernel_size)
        self.weight_a = nn.Parameter(torch.empty(shape))
        self.weight_b = nn.Parameter(torch.empty(shape))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for weight in (self.weight_a, self.weight_b):
            nn.init.kaiming_normal_(weight, mode="fan_out", nonlinearity="relu")
            with torch.no_grad():
                weight.mul_(1 / math.sqrt(2))

    def _conv(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, stride=self.stride, padding=self.padding)

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"expected input (N, {self.in_channels}, H, W), got {tuple(x.shape)}")

    def uses_block(self, x: torch.Tensor) -> bool:
        """Whether ``forward`` runs the one-convolution block path for this input."""
        return self.square == -1 or self.path == "block" or (self.path == "auto" and x.is_cuda)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return hyper_product(x, self.weight_a, self.weight_b, self.square, self._conv, block=self.uses_block(x))

    def naive_forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return naive_hyper_product(x, self.weight_a, self.weight_b, self.square, self._conv)

    def gauss_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Gauss's three-product path; only meaningful for the complex algebra."""
        if self.square != -1:
            raise ValueError(f"Gauss's trick is the complex product; this layer's algebra is {self.algebra!r}")
        self._check_input(x)
        return complex_product_gauss(x, self.weight_a, self.weight_b, self._conv)

    def multiply_accumulates(self, output_positions: int, naive: bool = False) -> int:
        """Real MACs of one image's forward, given H_out·W_out (``naive``: the 4-product path)."""
        quarter = (self.out_channels // 2) * (self.in_channels // 2) * self.kernel_size**2 * output_positions
        return quarter * (NAIVE_QUARTER_PRODUCTS if naive else QUARTER_PRODUCTS[self.algebra])

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, algebra={self.algebra}, path={self.path}")


class HyperLinear(nn.Module):
    """Hypercomplex linear layer; feature counts are REAL counts laid out [a | b].

    Two real weights W_a, W_b of shape (out/2, in/2) and a bias of ``out_features``
    entries ([bias of a | bias of b], one per part). Init: uniform in ±1/sqrt(in_features)
    for weights and bias, the bound torch uses for a real nn.Linear of the same real size
    (each output part sums ``in_features`` real terms, as there).
    """

    def __init__(self, in_features: int, out_features: int, algebra: str = "dual", bias: bool = True) -> None:
        super().__init__()
        self.square = algebra_square(algebra)
        self.algebra = algebra
        self.in_features = _check_even("in_features", in_features)
        self.out_features = _check_even("out_features", out_features)
        shape = (out_features // 2, in_features // 2)
        self.weight_a = nn.Parameter(torch.empty(shape))
        self.weight_b = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.in_features)
        for param in (self.weight_a, self.weight_b, self.bias):
            if param is not None:
                nn.init.uniform_(param, -bound, bound)

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"expected input (N, {self.in_features}), got {tuple(x.shape)}")

    def _with_bias(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.bias is None else out + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self._with_bias(hyper_product(x, self.weight_a, self.weight_b, self.square, F.linear))

    def naive_forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self._with_bias(naive_hyper_product(x, self.weight_a, self.weight_b, self.square, F.linear))

    def multiply_accumulates(self, naive: bool = False) -> int:
        quarter = (self.out_features // 2) * (self.in_features // 2)
        return quarter * (NAIVE_QUARTER_PRODUCTS if naive else QUARTER_PRODUCTS[self.algebra])

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, algebra={self.algebra}, bias={self.bias is not None}"


class HyperBatchNorm2d(nn.BatchNorm2d):
    """Split batch norm: an ordinary BatchNorm2d over the 2C real channels [a | b].

    Each part of each hypercomplex channel gets its own statistics and affine weights.
    This is the simple "split" normalisation, not the whitening batch norm (2x2
    covariance per channel) of some complex-valued network papers.
    """

    def __init__(self, channels: int, **kwargs) -> None:
        super().__init__(_check_even("channels", channels), **kwargs)


# The activation is split ReLU (ReLU on each part separately); in the [a | b] storage
# that is exactly an elementwise nn.ReLU, so no separate class is needed.


@dataclass(frozen=True)
class HyperLayerFactory(LayerFactory):
    """Layers for ResNet18-HC: hypercomplex convs, split BN / ReLU, a REAL linear head.

    The topology asks for real channel counts (width w at stage 1); each is kept as the
    real size and split into two parts of w/2 hypercomplex channels, so widths must be
    even. The head is an ordinary nn.Linear on the pooled [a | b] features, i.e. the two
    parts concatenated, as the reference implementation family does.
    """

    algebra: str = "dual"

    def __post_init__(self) -> None:
        algebra_square(self.algebra)

    def conv(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int) -> nn.Module:
        return HyperConv2d(in_channels, out_channels, kernel_size, stride, padding, algebra=self.algebra)

    def bn(self, channels: int) -> nn.Module:
        return HyperBatchNorm2d(channels)

    def act(self) -> nn.Module:
        return nn.ReLU(inplace=True)

    def linear(self, in_features: int, out_features: int) -> nn.Module:
        return nn.Linear(in_features, out_features)


class ResNet18HC(ResNet):
    """ResNet18 whose convolutions are hypercomplex; it takes ordinary images.

    The image (C channels) is duplicated into both parts, so the stem convolution sees
    [image | image], i.e. C hypercomplex channels with a = b = pixel value. The pooled
    features are already [a | b] concatenated and go to the real linear head.
    """

    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 64, stem: str = "cifar",
                 algebra: str = "dual") -> None:
        layers = HyperLayerFactory(algebra)
        super().__init__(num_classes, 2 * in_channels, width, stem, RESNET18_BLOCKS_PER_STAGE, layers)
        self.image_channels = in_channels
        self.algebra = algebra

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.image_channels:
            raise ValueError(f"expected images (N, {self.image_channels}, H, W), got {tuple(x.shape)}")
        return super().features(torch.cat([x, x], dim=1))


def resnet18_hc(num_classes: int, in_channels: int = 3, width: int = 64, stem: str = "cifar",
                algebra: str = "dual") -> ResNet18HC:
    """ResNet18-HC; ``width`` is the REAL channel count of stage 1 (w/2 hypercomplex channels)."""
    for name, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    _check_even("width", width)
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; expected one of {STEMS}")
    algebra_square(algebra)
    return ResNet18HC(num_classes, in_channels, width, stem, algebra)


MODELS["resnet18_hc"] = resnet18_hc


# --- cost accounting --------------------------------------------------------------------


def count_macs_per_image(model: nn.Module, input_shape: tuple[int, ...], naive: bool = False) -> int:
    """Multiply-accumulates of conv and linear layers for one image of shape (C, H, W).

    Conventional "FLOPs" of ResNet papers (1 MAC counted once). Real nn.Conv2d / nn.Linear
    layers are counted from their output shapes via forward hooks; a HyperConv2d or
    HyperLinear runs several real products inside one module, so its MACs are computed
    analytically for the path its ``forward`` takes (``naive=True``: the four-product path).
    Batch norm, activations, pooling and the elementwise work of the product are not counted.
    """
    if len(input_shape) != 3 or not all(isinstance(d, int) and d > 0 for d in input_shape):
        raise ValueError(f"input_shape must be (C, H, W) of positive integers, got {input_shape!r}")
    total = 0

    def on_conv(module: nn.Conv2d, inputs, output: torch.Tensor) -> None:
        nonlocal total
        kernel = module.weight.shape[1] * module.weight.shape[2] * module.weight.shape[3]
        total += output[0].numel() * kernel

    def on_linear(module: nn.Linear, inputs, output: torch.Tensor) -> None:
        nonlocal total
        total += module.in_features * module.out_features

    def on_hyper_conv(module: HyperConv2d, inputs, output: torch.Tensor) -> None:
        nonlocal total
        total += module.multiply_accumulates(output.shape[-2] * output.shape[-1], naive=naive)

    def on_hyper_linear(module: HyperLinear, inputs, output: torch.Tensor) -> None:
        nonlocal total
        total += module.multiply_accumulates(naive=naive)

    hooks = []
    for module in model.modules():
        for kind, hook in ((nn.Conv2d, on_conv), (nn.Linear, on_linear),
                           (HyperConv2d, on_hyper_conv), (HyperLinear, on_hyper_linear)):
            if isinstance(module, kind):
                hooks.append(module.register_forward_hook(hook))
    first = next(model.parameters())
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, *input_shape), dtype=first.dtype, device=first.device))
    finally:
        model.train(was_training)
        for handle in hooks:
            handle.remove()
    return total

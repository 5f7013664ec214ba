"""Image data on the device: the arrays of a data set (darel.data) as tensors, and
``DeviceAugment``, which replaces a per-image CPU transform pipeline by one batched affine
resampling on the device that holds the images."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from darel.data import SAMPLE_COLUMNS, validate_split


def to_tensors(arrays: dict, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 NCHW images, int64 labels) on ``device``; uint8 keeps the transfer 4x smaller."""
    validate_split(arrays, "arrays")
    device = torch.device(device)
    images = torch.from_numpy(np.ascontiguousarray(arrays["images"])).permute(0, 3, 1, 2).contiguous()
    labels = torch.from_numpy(np.ascontiguousarray(arrays["labels"]))
    if device.type == "cuda":
        images, labels = images.pin_memory(), labels.pin_memory()
    return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


# ---------------------------------------------------------------------------
# Batched augmentation on the device



def column_tensors(arrays: dict, device: str | torch.device) -> dict[str, torch.Tensor]:
    """The split's per-sample columns (darel.data.SAMPLE_COLUMNS: the benchmark's category,
    rare, true_labels, duplicate_of) as tensors on ``device``, in the images' order; empty
    for a data set without them."""
    return {name: torch.from_numpy(np.ascontiguousarray(arrays[name])).to(device)
            for name in SAMPLE_COLUMNS if name in arrays}

class DeviceAugment:
    """Random crop (zero padding), horizontal flip and small rotation, then normalisation.

    All three geometric steps are composed into one affine matrix per sample and
    applied with a single ``affine_grid`` + ``grid_sample`` over the whole batch.
    The composition follows the usual pipeline order crop -> flip -> rotate: an
    output pixel is rotated back, mirrored, then shifted to find where it is read
    from in the input. Pixels read from outside the image are black (zero before
    normalisation), as with zero padding.

    Costs per batch: the constants (mean, std, the pixel <-> normalised scalings) are
    built once per (device, dtype) or (device, size) and cached, so a batch copies
    nothing from the host and makes no host synchronisation; the per-sample matrices
    are written entry by entry (a handful of elementwise operations, no 3x3 matrix
    products). The entries are the same float32 roundings the matrix products gave
    (every product there had a single non-zero term), so the output is bit for bit
    what the earlier matrix-product version produced.
    """

    def __init__(
        self,
        pad: int,
        hflip: bool,
        max_rotation_deg: float,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
            raise ValueError(f"pad must be a non-negative integer, got {pad!r}")
        if not 0.0 <= float(max_rotation_deg) <= 180.0:
            raise ValueError(f"max_rotation_deg must lie in [0, 180], got {max_rotation_deg!r}")
        if len(mean) != len(std) or len(mean) == 0:
            raise ValueError(f"mean {list(mean)} and std {list(std)} must be non-empty and of equal length")
        if any(s <= 0 for s in std):
            raise ValueError(f"std must be positive, got {list(std)}")
        self.pad = pad
        self.hflip = bool(hflip)
        self.max_rotation_deg = float(max_rotation_deg)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self._constants: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def is_identity(self) -> bool:
        return self.pad == 0 and not self.hflip and self.max_rotation_deg == 0.0

    def _check_images(self, images: torch.Tensor) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"expected uint8 (N, C, H, W) images, got {images.dtype} {tuple(images.shape)}")
        if images.shape[1] != len(self.mean):
            raise ValueError(f"images have {images.shape[1]} channels but mean/std have {len(self.mean)}")

    def _cached(self, key: tuple, make) -> tuple[torch.Tensor, torch.Tensor]:
        # One host-to-device copy per key for the object's lifetime, none per batch.
        value = self._constants.get(key)
        if value is None:
            value = self._constants[key] = make()
        return value

    def _mean_std(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self._cached(("mean_std", device, dtype), lambda: (
            torch.tensor(self.mean, dtype=dtype).view(1, -1, 1, 1).to(device),
            torch.tensor(self.std, dtype=dtype).view(1, -1, 1, 1).to(device)))

    def _scalings(self, device: torch.device, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        # The diagonals of diag(2/W, 2/H) (pixels -> normalised, on rows) and of
        # diag(W/2, H/2, 1) (normalised -> pixels, on columns), in float32.
        return self._cached(("scalings", device, height, width), lambda: (
            torch.tensor([2.0 / width, 2.0 / height], dtype=torch.float32).view(1, 2, 1).to(device),
            torch.tensor([width / 2.0, height / 2.0, 1.0], dtype=torch.float32).view(1, 1, 3).to(device)))

    def _normalise_unit(self, unit: torch.Tensor) -> torch.Tensor:
        mean, std = self._mean_std(unit.device, unit.dtype)
        return (unit - mean) / std

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        """Float32 normalised images without augmentation (evaluation, loss scoring)."""
        self._check_images(images)
        return self._normalise_unit(images.float() / 255.0)

    def draw(self, n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The random numbers of ``n`` samples' augmentation, on the generator's device, in
        the order rotation, flip, shift: uniform [0, 1) angle and flip draws and integer
        shifts in [-pad, pad] (each only where its step is on). The arithmetic that turns
        them into images (``from_draws``) uses no generator, so it can run inside a
        compiled graph while the draws stay outside it."""
        device = generator.device
        draws = {}
        if self.max_rotation_deg > 0:
            draws["rotation"] = torch.rand(n, generator=generator, device=device)
        if self.hflip:
            draws["flip"] = torch.rand(n, generator=generator, device=device)
        if self.pad > 0:
            # The same offsets as a random crop of the padded image.
            draws["shift"] = torch.randint(-self.pad, self.pad + 1, (n, 2), generator=generator, device=device)
        return draws

    def sample_affine(self, n: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
        """Per-sample (n, 2, 3) matrices in ``affine_grid``'s normalised coordinates, from
        fresh draws (``draw``, then ``affine_from_draws``)."""
        return self.affine_from_draws(self.draw(n, generator), n, height, width, generator.device)

    def affine_from_draws(self, draws: dict[str, torch.Tensor], n: int, height: int, width: int,
                          device: torch.device) -> torch.Tensor:
        """The matrices of ``draw``'s numbers. Built in pixel units centred on the image (so
        rotation is not skewed on non-square images), then rescaled to [-1, 1] coordinates.
        In pixel units the top two rows of shift @ mirror @ rotation are
        [[f cos, -f sin, tx], [sin, cos, ty]] (f = -1 for a flipped sample, else 1)."""
        if self.max_rotation_deg > 0:
            angles = (draws["rotation"] * 2 - 1) * math.radians(self.max_rotation_deg)
            cos, sin = torch.cos(angles), torch.sin(angles)
        else:
            cos, sin = torch.ones(n, device=device), torch.zeros(n, device=device)
        top = torch.stack([cos, -sin], dim=1)
        if self.hflip:
            top = top * torch.where(draws["flip"] < 0.5, -1.0, 1.0).unsqueeze(1)
        shifts = draws["shift"].float() if self.pad > 0 else torch.zeros(n, 2, device=device)
        matrix = torch.stack([torch.cat([top, shifts[:, :1]], 1), torch.stack([sin, cos, shifts[:, 1]], 1)], 1)
        # Pixel units -> normalised units: x_norm = x_pix / (W / 2), y_norm = y_pix / (H / 2).
        rows, columns = self._scalings(device, height, width)
        return matrix * rows * columns

    def apply_affine(self, unit_images: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Resample float images with per-sample matrices; outside the image reads as zero."""
        grid = F.affine_grid(theta.to(unit_images.device), list(unit_images.shape), align_corners=False)
        return F.grid_sample(unit_images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        self._check_images(images)  # before any draw: bad input leaves the generator where it was
        if self.is_identity:
            return self.normalise(images)
        return self.from_draws(images, self.draw(len(images), generator))

    def constants(self, device: torch.device | str, height: int, width: int) -> tuple[torch.Tensor, ...]:
        """The cached constants of a float32 batch of this size on ``device`` (mean, std and the
        two scalings), made now if they are not yet: a compiled graph that augments then reads
        them as fixed tensors instead of making them itself."""
        device = torch.device(device)
        return (*self._mean_std(device, torch.float32), *self._scalings(device, height, width))

    def from_draws(self, images: torch.Tensor, draws: dict[str, torch.Tensor]) -> torch.Tensor:
        """Augmented, normalised float32 images from uint8 ``images`` and ``draw``'s numbers
        for them: what ``__call__`` returns for the same draws, bit for bit."""
        self._check_images(images)
        if self.is_identity:
            return self.normalise(images)
        n, _, height, width = images.shape
        # The matrices on the draws' device, as sample_affine builds them on its generator's.
        theta = self.affine_from_draws(draws, n, height, width, next(iter(draws.values())).device)
        augmented = self.apply_affine(images.float() / 255.0, theta)
        return self._normalise_unit(augmented)

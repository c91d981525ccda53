"""Random image augmentations for contrastive training: two views per sample, batched, on any device.

Per-image PIL transforms cost a Python call per image per op; here one call transforms a whole float
batch N x C x H x W (values in [0, 1], e.g. `Dataset.unit_images` as a tensor) wherever it lives:
crop, rotation and flip are one `affine_grid` + `grid_sample`, blur a grouped convolution. Random
parameters are drawn from an explicit `torch.Generator` (on its own device, then moved), so the same
generator state gives the same views, and on CPU the same pixels.

Recipes (`contrastive_augmenter(channels)`):

- grayscale, CCFC's MNIST recipe (Jarvisyan/CCFC-pytorch, model.py): random resized crop, scale 0.5-1;
  rotation within +-10 degrees; Gaussian blur, sigma 0.1-2, with p = 0.5.
- RGB, SimSiam's recipe (CIFAR-10, STL-10): random resized crop, scale 0.2-1; horizontal flip p = 0.5;
  colour jitter 0.4/0.4/0.4/0.1 with p = 0.8; grayscale p = 0.2; blur off (``blur_p=0.5`` adds it).

Where this differs from torchvision's transforms, on purpose: crop, rotation and flip are resampled once
(bilinear, zeros outside the image) rather than crop-resize then rotate (nearest); colour jitter applies
brightness, contrast, saturation and hue in that fixed order (torchvision shuffles it), and shifts hue
by rotating the chroma plane in YIQ space instead of converting to HSV; the blur kernel is truncated at
3 sigma (at most the image size) with reflected borders. Normalisation (mean/std) is the model's business.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.functional import affine_grid, conv2d, grid_sample, pad

_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 draws before falling back
_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, as torchvision's rgb_to_grayscale
# RGB -> YIQ (NTSC); hue shifts rotate the (I, Q) chroma plane and map back with the inverse
_RGB_TO_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))


class AugmentError(ValueError):
    """An augmentation parameter or input batch that cannot be used."""


@dataclass(frozen=True)
class ViewAugmenter:
    """One random view per call; parameters as torchvision names them (probabilities are per sample)."""

    crop_scale: tuple[float, float] = (0.2, 1.0)  # crop area as a fraction of the image area
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop aspect ratio (width / height)
    max_rotation: float = 0.0  # degrees; the angle is uniform in [-max_rotation, max_rotation]
    flip_p: float = 0.0  # horizontal flip
    jitter: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # brightness, contrast, saturation, hue
    jitter_p: float = 0.0
    grayscale_p: float = 0.0
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)  # pixels

    def __post_init__(self) -> None:
        scale, ratio, sigma = self.crop_scale, self.crop_ratio, self.blur_sigma
        bright, contrast, saturation, hue = self.jitter
        checks = [
            (0 < scale[0] <= scale[1] <= 1, f"crop_scale must be 0 < low <= high <= 1, got {scale}"),
            (0 < ratio[0] <= ratio[1], f"crop_ratio must be 0 < low <= high, got {ratio}"),
            (0 < sigma[0] <= sigma[1], f"blur_sigma must be 0 < low <= high, got {sigma}"),
            (0 <= self.max_rotation <= 180, f"max_rotation must be 0..180 degrees, got {self.max_rotation}"),
            (min(bright, contrast, saturation) >= 0, f"jitter strengths must be >= 0, got {self.jitter}"),
            (0 <= hue <= 0.5, f"jitter hue must be in [0, 0.5], got {hue}"),
        ]
        for name in ("flip_p", "jitter_p", "grayscale_p", "blur_p"):
            p = getattr(self, name)
            checks.append((0 <= p <= 1, f"{name} must be a probability, got {p}"))
        for ok, message in checks:
            if not ok:
                raise AugmentError(message)

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A random view of every image in the batch (N x C x H x W, floats in [0, 1]), same shape."""
        self._check(images)
        views = self._crop_rotate_flip(images, generator)
        if self.jitter_p > 0 and any(self.jitter):
            views = self._colour_jitter(views, generator)
        if self.grayscale_p > 0:
            views = torch.where(
                _chance(self.grayscale_p, views, generator), _grey(views).expand_as(views), views
            )
        if self.blur_p > 0:
            views = self._blur(views, generator)
        return views

    def two_views(
        self, images: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Two independent random views per sample (the positive pair of contrastive losses)."""
        return self(images, generator), self(images, generator)

    def _check(self, images: torch.Tensor) -> None:
        if images.ndim != 4 or not images.is_floating_point():
            raise AugmentError(
                f"images must be a float N x C x H x W batch, got {tuple(images.shape)} {images.dtype}"
            )
        colour = self.jitter[2] > 0 or self.jitter[3] > 0 or self.grayscale_p > 0
        if colour and images.shape[1] != 3:
            raise AugmentError(f"saturation, hue and grayscale need 3 channels, got {images.shape[1]}")

    def _crop_rotate_flip(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Random resized crop, rotation and horizontal flip as one affine resampling per image."""
        grid = affine_grid(self._geometry(images, generator), list(images.shape), align_corners=False)
        return grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    def _geometry(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Per-image affine maps (N x 2 x 3) from output to input coordinates, both in [-1, 1]."""
        n, _, height, width = images.shape
        area = _uniform((n, _CROP_ATTEMPTS), self.crop_scale, images, generator)
        log_ratio = _uniform(
            (n, _CROP_ATTEMPTS), tuple(math.log(r) for r in self.crop_ratio), images, generator
        )
        # crop width and height as fractions of the image's
        crop_w = torch.sqrt(area * torch.exp(log_ratio) * height / width)
        crop_h = torch.sqrt(area / torch.exp(log_ratio) * width / height)
        fits = (crop_w <= 1) & (crop_h <= 1)
        first = fits.to(torch.uint8).argmax(
            dim=1, keepdim=True
        )  # the first attempt that fits, as torchvision
        found = fits.any(dim=1)
        crop_w = torch.where(
            found, crop_w.gather(1, first).squeeze(1), torch.ones_like(found, dtype=images.dtype)
        )
        crop_h = torch.where(
            found, crop_h.gather(1, first).squeeze(1), torch.ones_like(found, dtype=images.dtype)
        )
        # crop centre in normalised coordinates [-1, 1]: the crop stays inside the image
        centre_x = _uniform((n,), (-1.0, 1.0), images, generator) * (1 - crop_w)
        centre_y = _uniform((n,), (-1.0, 1.0), images, generator) * (1 - crop_h)
        angle = _uniform((n,), (-self.max_rotation, self.max_rotation), images, generator) * (math.pi / 180)
        flip = torch.where(_chance(self.flip_p, images, generator).view(n), -1.0, 1.0).to(images.dtype)
        cos, sin = torch.cos(angle), torch.sin(angle)
        # output point p -> input point centre + diag(crop_w, crop_h) R(angle) diag(flip, 1) p
        return torch.stack(
            [
                torch.stack([crop_w * cos * flip, -crop_w * sin, centre_x], dim=1),
                torch.stack([crop_h * sin * flip, crop_h * cos, centre_y], dim=1),
            ],
            dim=1,
        )

    def _colour_jitter(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Brightness, contrast, saturation and hue factors drawn per image, applied with `jitter_p`."""
        n = len(images)
        brightness, contrast, saturation, hue = self.jitter
        out = images
        if brightness > 0:
            out = (out * _factor(n, brightness, out, generator)).clamp(0, 1)
        if contrast > 0:
            mean = _grey(out).mean(dim=(1, 2, 3), keepdim=True)
            out = _blend(out, mean, _factor(n, contrast, out, generator))
        if saturation > 0:
            out = _blend(out, _grey(out), _factor(n, saturation, out, generator))
        if hue > 0:
            out = _rotate_hue(out, _uniform((n,), (-hue, hue), out, generator))
        return torch.where(_chance(self.jitter_p, images, generator), out, images)

    def _blur(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Gaussian blur with a per-image sigma: two 1-d passes of one grouped convolution each."""
        n, channels, height, width = images.shape
        radius = min(math.ceil(3 * self.blur_sigma[1]), height - 1, width - 1)
        sigma = _uniform((n, 1), self.blur_sigma, images, generator)
        offsets = torch.arange(-radius, radius + 1, device=images.device, dtype=images.dtype)
        kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
        kernel = (kernel / kernel.sum(dim=1, keepdim=True)).repeat_interleave(channels, dim=0)  # (N*C, k)
        flat = images.reshape(1, n * channels, height, width)
        flat = conv2d(
            pad(flat, (radius, radius, 0, 0), mode="reflect"), kernel[:, None, None, :], groups=n * channels
        )
        flat = conv2d(
            pad(flat, (0, 0, radius, radius), mode="reflect"), kernel[:, None, :, None], groups=n * channels
        )
        return torch.where(_chance(self.blur_p, images, generator), flat.reshape(images.shape), images)


GRAYSCALE = ViewAugmenter(crop_scale=(0.5, 1.0), max_rotation=10.0, blur_p=0.5)
RGB = ViewAugmenter(
    crop_scale=(0.2, 1.0), flip_p=0.5, jitter=(0.4, 0.4, 0.4, 0.1), jitter_p=0.8, grayscale_p=0.2
)


def contrastive_augmenter(channels: int, **overrides: Any) -> ViewAugmenter:
    """The recipe for `channels`-channel images (1: CCFC grayscale, 3: SimSiam RGB), fields overridable.

    E.g. ``contrastive_augmenter(3, blur_p=0.5)`` is SimSiam's recipe with its optional blur.
    """
    recipes = {1: GRAYSCALE, 3: RGB}
    if channels not in recipes:
        raise AugmentError(f"no augmentation recipe for {channels}-channel images; use 1 or 3 channels")
    try:
        return dataclasses.replace(recipes[channels], **overrides)
    except TypeError as exc:  # an unknown field name
        raise AugmentError(f"unknown augmentation parameter: {exc}") from None


# --------------------------------------------------------------------------- helpers


def _uniform(
    shape: tuple[int, ...], bounds: tuple[float, float], like: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Uniform draws in [low, high], drawn on the generator's device and moved to `like`'s."""
    draws = torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float64)
    low, high = bounds
    return (low + (high - low) * draws).to(device=like.device, dtype=like.dtype)


def _chance(p: float, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A per-image coin with probability p, shaped (N, 1, 1, 1) to select images with torch.where."""
    return _uniform((len(like), 1, 1, 1), (0.0, 1.0), like, generator) < p


def _factor(n: int, strength: float, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A jitter factor per image, uniform in [max(0, 1 - strength), 1 + strength], shaped (N, 1, 1, 1)."""
    return _uniform((n, 1, 1, 1), (max(0.0, 1 - strength), 1 + strength), like, generator)


def _grey(images: torch.Tensor) -> torch.Tensor:
    """Luma (N, 1, H, W); a one-channel image is its own grey."""
    if images.shape[1] == 1:
        return images
    weights = torch.tensor(_LUMA, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    return (images * weights).sum(dim=1, keepdim=True)


def _blend(images: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor * images + (1 - factor) * other, clamped: torchvision's contrast and saturation."""
    return (factor * images + (1 - factor) * other).clamp(0, 1)


def _rotate_hue(images: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Shift hue by `turns` of the colour wheel per image: rotate (I, Q) in YIQ space."""
    to_yiq = torch.tensor(_RGB_TO_YIQ, device=images.device, dtype=images.dtype)
    angle = 2 * math.pi * turns
    cos, sin = torch.cos(angle), torch.sin(angle)
    one, zero = torch.ones_like(angle), torch.zeros_like(angle)
    rotation = torch.stack(
        [
            torch.stack([one, zero, zero], 1),
            torch.stack([zero, cos, -sin], 1),
            torch.stack([zero, sin, cos], 1),
        ],
        1,
    )
    per_image = torch.linalg.inv(to_yiq) @ rotation @ to_yiq  # (N, 3, 3)
    return torch.einsum("nij,njhw->nihw", per_image, images).clamp(0, 1)

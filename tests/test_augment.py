"""Batched contrastive augmentations: shapes, ranges, reproducibility, and that each parameter is obeyed."""

from __future__ import annotations

import math

import pytest
import torch

from fedapp.datasets.augment import (
    GRAYSCALE,
    RGB,
    AugmentError,
    ViewAugmenter,
    _rotate_hue,
    contrastive_augmenter,
)

IDENTITY = ViewAugmenter(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0))


def _batch(n: int, channels: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, channels, size, size, generator=torch.Generator().manual_seed(seed))


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(("channels", "size"), [(1, 28), (3, 32), (1, 8)])
def test_views_keep_shape_dtype_and_range(channels: int, size: int) -> None:
    images = _batch(16, channels, size)
    augmenter = contrastive_augmenter(channels, blur_p=0.5)
    first, second = augmenter.two_views(images, _gen())
    for view in (first, second):
        assert view.shape == images.shape and view.dtype == images.dtype
        assert view.min() >= 0.0 and view.max() <= 1.0
    assert not torch.allclose(first, second) and not torch.allclose(first, images)
    assert (first - second).abs().flatten(1).amax(dim=1).min() > 0  # every sample's two views differ


def test_same_seed_same_views_other_seed_other_views() -> None:
    images = _batch(8, 3, 32)
    augmenter = contrastive_augmenter(3, blur_p=0.5)
    first = augmenter.two_views(images, _gen(3))
    again = augmenter.two_views(images, _gen(3))
    other = augmenter.two_views(images, _gen(4))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.allclose(first[0], other[0])


def test_double_precision_batches_stay_double() -> None:
    view = GRAYSCALE(_batch(4, 1, 28).double(), _gen())
    assert view.dtype == torch.float64


def test_no_crop_rotation_or_blur_is_the_identity() -> None:
    images = _batch(8, 1, 28)
    torch.testing.assert_close(IDENTITY(images, _gen()), images, atol=1e-5, rtol=0)


def test_certain_flip_mirrors_horizontally() -> None:
    images = _batch(8, 3, 16)
    flipped = ViewAugmenter(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=1.0)(images, _gen())
    torch.testing.assert_close(flipped, images.flip(dims=[3]), atol=1e-5, rtol=0)


def test_geometry_respects_scale_rotation_and_bounds() -> None:
    images = _batch(2000, 1, 28)
    theta = GRAYSCALE._geometry(images, _gen()).double()
    linear, centre = theta[:, :, :2], theta[:, :, 2]
    area = torch.linalg.det(linear).abs()  # crop area as a fraction of the image
    assert area.min() >= 0.5 - 1e-6 and area.max() <= 1.0 + 1e-6
    assert area.max() - area.min() > 0.4  # the whole scale range is used
    angle = torch.atan2(linear[:, 1, 0].abs(), linear[:, 1, 1]) * 180 / math.pi
    assert angle.max() <= 10.0 + 1e-4 and angle.max() > 9.0
    half_width = linear[:, 0].norm(dim=1)  # crop half-extent along x (rotation keeps the norm)
    assert (centre[:, 0].abs() + half_width).max() <= 1.0 + 1e-6  # the crop lies inside the image


def test_certain_grayscale_gives_equal_channels() -> None:
    images = _batch(4, 3, 16)
    grey = ViewAugmenter(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), grayscale_p=1.0)(images, _gen())
    luma = 0.299 * images[:, 0] + 0.587 * images[:, 1] + 0.114 * images[:, 2]
    for channel in range(3):
        torch.testing.assert_close(grey[:, channel], luma, atol=1e-5, rtol=0)


def test_brightness_scales_each_image_within_its_range() -> None:
    images = 0.1 + 0.4 * _batch(64, 3, 8)  # dark enough that 1.4x never clips
    bright = ViewAugmenter(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), jitter=(0.4, 0, 0, 0), jitter_p=1.0)
    factor = (bright(images, _gen()) / images).flatten(1)
    torch.testing.assert_close(factor.amin(dim=1), factor.amax(dim=1), atol=1e-4, rtol=0)  # one per image
    assert factor.min() >= 0.6 - 1e-4 and factor.max() <= 1.4 + 1e-4 and factor.std() > 0.1


def test_jitter_probability_leaves_other_images_untouched() -> None:
    images = _batch(400, 3, 8)
    jitter = ViewAugmenter(
        crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), jitter=(0.4, 0.4, 0.4, 0.1), jitter_p=0.8
    )
    changed = ((jitter(images, _gen()) - images).abs().flatten(1).amax(dim=1) > 1e-4).float().mean()
    assert 0.7 < changed < 0.9


def test_hue_rotation_keeps_luma_and_zero_is_identity() -> None:
    images = 0.3 + 0.4 * _batch(6, 3, 4)  # mid-range colours: no clipping
    torch.testing.assert_close(_rotate_hue(images, torch.zeros(6)), images, atol=1e-5, rtol=0)
    shifted = _rotate_hue(images, torch.full((6,), 0.1))
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    torch.testing.assert_close((shifted * weights).sum(1), (images * weights).sum(1), atol=1e-4, rtol=0)
    assert (shifted - images).abs().max() > 0.01


def test_certain_blur_spreads_a_point_and_keeps_its_mass() -> None:
    point = torch.zeros(32, 1, 21, 21)
    point[:, 0, 10, 10] = 1.0
    blurred = ViewAugmenter(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), blur_p=1.0)(point, _gen())
    torch.testing.assert_close(blurred.sum(dim=(1, 2, 3)), torch.ones(32), atol=1e-4, rtol=0)
    peaks = blurred[:, 0, 10, 10]
    assert peaks.max() < 1.0 and peaks.min() < 0.1  # sigma 0.1 barely blurs, sigma near 2 spreads widely
    torch.testing.assert_close(blurred, blurred.flip(dims=[2, 3]), atol=1e-6, rtol=0)  # symmetric kernel


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"crop_scale": (0.0, 1.0)}, "crop_scale"),
        ({"crop_scale": (0.8, 0.5)}, "crop_scale"),
        ({"crop_ratio": (2.0, 1.0)}, "crop_ratio"),
        ({"max_rotation": -1.0}, "max_rotation"),
        ({"flip_p": 1.5}, "flip_p must be a probability"),
        ({"jitter": (0.4, -0.1, 0.0, 0.0)}, "jitter strengths"),
        ({"jitter": (0.0, 0.0, 0.0, 0.7)}, "jitter hue"),
        ({"blur_sigma": (0.0, 2.0)}, "blur_sigma"),
    ],
)
def test_bad_parameters_are_rejected(fields: dict[str, object], message: str) -> None:
    with pytest.raises(AugmentError, match=message):
        ViewAugmenter(**fields)


def test_bad_inputs_and_recipes_are_rejected() -> None:
    with pytest.raises(AugmentError, match="float N x C x H x W"):
        GRAYSCALE(torch.rand(2, 28, 28), _gen())
    with pytest.raises(AugmentError, match="float N x C x H x W"):
        GRAYSCALE(torch.zeros(2, 1, 28, 28, dtype=torch.uint8), _gen())
    with pytest.raises(AugmentError, match="need 3 channels, got 1"):
        RGB(torch.rand(2, 1, 28, 28), _gen())
    with pytest.raises(AugmentError, match="no augmentation recipe for 2-channel"):
        contrastive_augmenter(2)
    with pytest.raises(AugmentError, match="unknown augmentation parameter"):
        contrastive_augmenter(1, blurr_p=0.5)


def test_recipes_match_the_papers() -> None:
    assert (GRAYSCALE.crop_scale, GRAYSCALE.max_rotation, GRAYSCALE.blur_p) == ((0.5, 1.0), 10.0, 0.5)
    assert (RGB.crop_scale, RGB.flip_p, RGB.jitter, RGB.jitter_p) == (
        (0.2, 1.0),
        0.5,
        (0.4, 0.4, 0.4, 0.1),
        0.8,
    )
    assert (RGB.grayscale_p, RGB.blur_p) == (0.2, 0.0)
    assert contrastive_augmenter(3, blur_p=0.5).blur_p == 0.5 and contrastive_augmenter(1) == GRAYSCALE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_views_match_cpu_views() -> None:
    """Random parameters come from the (CPU) generator, so only the arithmetic's device differs."""
    images = _batch(16, 3, 32)
    augmenter = contrastive_augmenter(3, blur_p=0.5)
    on_cpu = augmenter(images, _gen(5))
    on_gpu = augmenter(images.cuda(), _gen(5))
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-4, rtol=0)

"""CCFC's networks (Liu, Yan & Zhang, CCFC, Section 3.1 and 4.1): encoder f = backbone + MLP projector,
and the SimSiam bottleneck predictor h. `CCFCNet(x)` returns (z, p) = (f(x), h(f(x))).

Backbones (Section 4.1; the authors' public MNIST code fixes the conv stack):
- ``conv``: three conv layers 1 -> 64 -> 128 -> 256 (kernel 4, stride 2, padding 1, BatchNorm,
  LeakyReLU 0.2); 28 x 28 images give 256 x 3 x 3 features (MNIST, Fashion-MNIST).
- ``conv-small``: the same stack with widths 16 -> 32 -> 64, for scikit-learn's 8 x 8 `digits` (tests, CI).
- ``resnet18``: torchvision's ResNet-18 with the CIFAR stem (3 x 3 conv, stride 1, no max-pool) and no
  classifier, 512 features (CIFAR-10, STL-10).

Projector: Linear(d, hidden) + BN + ReLU -> Linear(hidden, latent) + BN(affine=False); predictor:
Linear(latent, pred_hidden) + BN + ReLU -> Linear(pred_hidden, latent) (SimSiam's bottleneck).

`build_model` / `initial_model`: the network client and server both build from `CCFCConfig` and the
clients' image shape.
"""

from __future__ import annotations

import torch
from torch import nn

from fedapp.methods.ccfc import BACKBONES, CCFCConfig  # declared with the config keys (no torch there)

CONV_WIDTHS = {"conv": (64, 128, 256), "conv-small": (16, 32, 64)}


class ConvBackbone(nn.Sequential):
    """Three stride-2 conv blocks (kernel 4, padding 1), each BatchNorm + LeakyReLU(0.2), flattened."""

    def __init__(self, in_channels: int, image_size: int, widths: tuple[int, ...]) -> None:
        layers: list[nn.Module] = []
        size, channels = image_size, in_channels
        for width in widths:
            layers += [nn.Conv2d(channels, width, 4, 2, 1), nn.BatchNorm2d(width), nn.LeakyReLU(0.2)]
            size, channels = size // 2, width
        if size < 1:
            raise ValueError(
                f"{image_size} x {image_size} images are too small for {len(widths)} conv layers"
            )
        super().__init__(*layers, nn.Flatten())
        self.out_dim = channels * size * size


class ResNet18Backbone(nn.Module):
    """torchvision's ResNet-18, CIFAR stem (3 x 3 conv, stride 1, no max-pool), classifier removed."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None)
        net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
        net.fc = nn.Identity()
        self.net = net
        self.out_dim = 512

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


class Projector(nn.Sequential):
    """Two-layer MLP projector; the output BatchNorm has no affine part (SimSiam, the authors' code)."""

    def __init__(self, in_dim: int, hidden_dim: int, latent_dim: int) -> None:
        super().__init__(
            nn.Linear(in_dim, hidden_dim),
            nn.BatchNorm1d(hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, latent_dim),
            nn.BatchNorm1d(latent_dim, affine=False),
        )


class Predictor(nn.Sequential):
    """SimSiam's bottleneck predictor h: latent -> hidden -> latent."""

    def __init__(self, latent_dim: int, hidden_dim: int) -> None:
        super().__init__(
            nn.Linear(latent_dim, hidden_dim),
            nn.BatchNorm1d(hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, latent_dim),
        )


class CCFCNet(nn.Module):
    """w = (f, h): `forward(x)` -> (z, p) with z = f(x) (representation), p = h(z) (prediction)."""

    def __init__(
        self,
        backbone: str,
        in_channels: int,
        image_size: int,
        latent_dim: int = 256,
        projector_hidden: int = 256,
        predictor_hidden: int = 16,
    ) -> None:
        super().__init__()
        self.backbone: nn.Module
        if backbone in CONV_WIDTHS:
            self.backbone = ConvBackbone(in_channels, image_size, CONV_WIDTHS[backbone])
        elif backbone == "resnet18":
            self.backbone = ResNet18Backbone(in_channels)
        else:
            raise ValueError(f"backbone must be one of {', '.join(BACKBONES[1:])}, got {backbone!r}")
        self.projector = Projector(self.backbone.out_dim, projector_hidden, latent_dim)
        self.predictor = Predictor(latent_dim, predictor_hidden)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """z = f(x): the representation that is clustered."""
        return self.projector(self.backbone(images))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encode(images)
        return z, self.predictor(z)


def default_backbone(channels: int, image_size: int) -> str:
    """`backbone = auto`: the paper's choice for the image shape (RGB -> ResNet-18, tiny -> conv-small)."""
    if channels == 3:
        return "resnet18"
    return "conv-small" if image_size < 16 else "conv"


def build_model(params: CCFCConfig, image_shape: tuple[int, int, int]) -> CCFCNet:
    """The network both sides build from the config and the clients' image shape (C, H, W)."""
    channels, height, width = image_shape
    if height != width:
        raise ValueError(f"CCFC's backbones take square images, got {height} x {width}")
    backbone = params.backbone if params.backbone != "auto" else default_backbone(channels, height)
    return CCFCNet(
        backbone,
        channels,
        height,
        latent_dim=params.latent_dim,
        projector_hidden=params.projector_hidden,
        predictor_hidden=params.predictor_hidden,
    )


def initial_model(params: CCFCConfig, image_shape: tuple[int, int, int], seed: int) -> CCFCNet:
    """The initial global model w^g (Alg. 1 line 1), drawn from `seed` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(params, image_shape)

"""SCCL's network on frozen sentence embeddings: residual adapter, contrastive head and K cluster centres."""

from __future__ import annotations

import torch
from torch import nn

from fedapp.models.fstc import ResidualAdapter

CONTRAST_DIM = 128  # SCCL's instance-CL head output


class SCCLModel(nn.Module):
    """x -> e = adapter(x); contrast(e) on the unit sphere; Student's t assignment of e to the centres."""

    def __init__(self, dim: int, k: int, *, adapter_hidden: int, alpha: float = 1.0) -> None:
        super().__init__()
        self.adapter = ResidualAdapter(dim, adapter_hidden)
        self.contrast_head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, CONTRAST_DIM))
        self.centres = nn.Parameter(torch.zeros(k, dim))
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adapter(x)

    def contrast(self, representations: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.contrast_head(representations), dim=1)

    def soft_assign(self, representations: torch.Tensor) -> torch.Tensor:
        """DEC Eq. 1: q_ik ∝ (1 + ‖e_i - μ_k‖² / α)^(-(α + 1) / 2)."""
        squared = torch.cdist(representations, self.centres) ** 2
        kernel = (1.0 + squared / self.alpha) ** (-(self.alpha + 1.0) / 2.0)
        return kernel / kernel.sum(1, keepdim=True)

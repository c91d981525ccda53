"""Losses that more than one method's client uses (kept here: clients of different methods stay apart)."""

from __future__ import annotations

import torch
from torch.nn.functional import normalize


def instance_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent (SimCLR; SCCL Eq. 1-2): each of the 2B unit vectors must pick its pair among the other 2B - 1.

    `z1[i]` and `z2[i]` are two views of sample i, already L2-normalised. The negatives are the batch's
    other samples, so nothing beyond the client's own data is needed. Gradients flow through both views.
    """
    z = torch.cat([z1, z2])
    n = z1.shape[0]
    similarity = z @ z.T / temperature
    similarity.fill_diagonal_(float("-inf"))
    positives = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z.device)
    return torch.nn.functional.cross_entropy(similarity, positives)


def info_nce_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """`instance_contrastive_loss` on raw vectors: cosine similarities / `temperature` (SimCLR's NT-Xent)."""
    return instance_contrastive_loss(normalize(z1, dim=1), normalize(z2, dim=1), temperature)

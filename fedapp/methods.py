"""The method registry: run-config `method` -> (strategy class, client class).

Classes are named by import path and imported lazily, so the ServerApp of one method never imports the
dependencies (torch, sentence-transformers) of another.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MethodSpec:
    """One runnable method. `strategy`/`client` are "module:Class"; None means centralized (no Flower)."""

    name: str
    description: str
    strategy: str | None
    client: str | None
    vertical: bool = False
    # dataset kinds this method can run on (see fedapp.datasets KINDS); horizontal vector methods take
    # images flattened and multi-view sets with their views concatenated
    modalities: tuple[str, ...] = ("vectors", "images", "multiview")

    @property
    def federated(self) -> bool:
        return self.strategy is not None


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("kmeans", "centralized k-means on the pooled data (reference; no federation)", None, None),
        MethodSpec(
            "kfed",
            "k-FED (Dennis et al. 2021): one-shot local k-means, server k-means over local centres",
            "strategies.kfed:KFedStrategy",
            "clients.kfed:KFedClient",
        ),
        MethodSpec(
            "ffcm",
            "federated fuzzy c-means (Stallmann & Wilbik 2022): membership-weighted sums each round",
            "strategies.ffcm:FFCMStrategy",
            "clients.ffcm:FFCMClient",
        ),
        MethodSpec(
            "cefmc",
            "CeFMC (vertical multi-view): H_v^(0) once, then labels + objective up, labels + C̄_v down",
            "strategies.cefmc:CeFMCStrategy",
            "clients.cefmc:CeFMCClient",
            vertical=True,
            modalities=("multiview",),
        ),
        MethodSpec(
            "cefmc-h",
            "CeFMC-H ablation: clients send their full representation H_v every round",
            "strategies.cefmc:CeFMCHStrategy",
            "clients.cefmc:CeFMCHClient",
            vertical=True,
            modalities=("multiview",),
        ),
        MethodSpec(
            "fedcmv",
            "FedCMv (Bárcena et al. 2024): vertical c-means, per-sample partial distances up",
            "strategies.fedcmv:FedCMvStrategy",
            "clients.fedcmv:FedCMvClient",
            vertical=True,
            modalities=("multiview",),
        ),
        MethodSpec(
            "fedfcmv",
            "FedFCMv (Bárcena et al. 2024): vertical fuzzy c-means, partial distances up",
            "strategies.fedcmv:FedFCMvStrategy",
            "clients.fedcmv:FedCMvClient",
            vertical=True,
            modalities=("multiview",),
        ),
    )
}


class UnknownMethodError(ValueError):
    """Raised for a method name that is not registered."""


def method_spec(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownMethodError(f"unknown method '{name}'; choose one of {sorted(METHODS)}") from None


def load_class(path: str) -> Any:
    """Import "package.module:Class"."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)

"""FedCMv / FedFCMv (Bárcena et al. 2024), the CeFMC paper's vertical baselines: config tables and the
initial-sample draw that the server and every client compute alike (so it needs no message)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.config.keys import ConfigSection, config_key


@dataclass(frozen=True)
class FedCMvConfig(ConfigSection):
    delta: float = config_key(1e-6, ge=0.0, doc="stop when the relative objective change is <= delta")


@dataclass(frozen=True)
class FedFCMvConfig(FedCMvConfig):
    fuzziness: float = config_key(
        1.1, gt=1.0, doc="fuzzifier m (the CeFMC paper's baseline runs m = 2; see README on m and dimension)"
    )


def choose_initial_samples(n_samples: int, k: int, seed: int = 0) -> np.ndarray:
    """k distinct sample indices drawn uniformly with a seeded generator (the initial global centroids)."""
    if not 1 <= k <= n_samples:
        raise ValueError(f"k must be in [1, n_samples={n_samples}], got {k}")
    return np.sort(np.random.default_rng(seed).choice(n_samples, size=k, replace=False)).astype(np.int64)

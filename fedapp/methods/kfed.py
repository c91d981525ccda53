"""k-FED (Dennis et al., ICML 2021): the keys of `[tool.flwr.app.config.kfed]`."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key
from fedapp.privacy.dp import RECORD, DPSupport


@dataclass(frozen=True)
class KFedConfig(ConfigSection):
    local_k: int = config_key(0, ge=0, doc="local k-means centres k' per client; 0 = k")
    local_restarts: int = config_key(
        0,
        ge=0,
        doc="k-means++ restarts of the local k-means, best kept (each costs one k-means); 0 = auto: "
        "10 below 50,000 local records, 1 from there (docs/scale.md)",
    )


# `local_restarts = 0`: restarts paid on small, hard clients (digits, MNIST: +0.01 NMI, +4 ACC points for
# 0.1-6 s) and cost 7x the time at 250,000 records a client with no NMI gain (docs/scale.md)
AUTO_RESTARTS, AUTO_RESTARTS_BELOW = 10, 50_000


# above this many local records k-FED's local k-means fits a seeded sample of this many, then runs exact
# Lloyd passes over every record a chunk at a time (`fedapp.maths.clustering.sampled_kmeans`): a site's
# file may be larger than memory (docs/scale.md, "Files larger than memory"); every client of the published
# baselines (MNIST, 7,000 a client; digits) is below it and keeps plain k-means
LOCAL_SAMPLE = 50_000


def local_restarts(configured: int, n_records: int) -> int:
    """The restarts a client runs: the configured number, or the size-aware default for 0."""
    return configured or (AUTO_RESTARTS if n_records < AUTO_RESTARTS_BELOW else 1)


# under DP the local step is DP-Lloyd (clients/kfed.py): `dp.lloyd-iters` releases, sent once; FSBERT-kFED too
KFED_DP = DPSupport(RECORD, lambda num_rounds, dp, params: dp.lloyd_iters)

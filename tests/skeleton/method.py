"""Piece 1 (`fedapp/methods/<m>.py` in the house) and the registry entry: the keys of `means`, its DP
schedule, and its `MethodSpec`.

`means` clusters by the server's means of the clients' means: round 1, the clients' means (and mean
squares) give the federation's mean and spread, from which k seeded centres are drawn; every later round
each client labels its records by the nearest centre and sends per-cluster sums and counts, and the server's
new centres are the federation's per-cluster means (a Lloyd step over the union of the records).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key
from fedapp.methods import MethodSpec, register
from fedapp.privacy.dp import RECORD, DPSupport

NAME = "means"


@dataclass(frozen=True)
class MeansConfig(ConfigSection):
    delta: float = config_key(0.0, ge=0.0, doc="stop when no centre moves more than this")


# under DP one release per round: the noisy moments, then the noisy per-cluster sums and counts
MEANS_DP = DPSupport(RECORD, lambda num_rounds, dp, params: num_rounds)

SPEC = register(
    MethodSpec(
        NAME,
        "the server's means of the clients' means (a test's skeleton method)",
        "tests.skeleton.strategy:MeansStrategy",
        "tests.skeleton.client:MeansClient",
        config=MeansConfig,
        secagg=True,
        dp=MEANS_DP,
    )
)

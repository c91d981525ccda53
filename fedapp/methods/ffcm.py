"""Federated fuzzy c-means (Stallmann & Wilbik 2022): the keys of `[tool.flwr.app.config.ffcm]`."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key
from fedapp.privacy.dp import RECORD, DPSupport


@dataclass(frozen=True)
class FFCMConfig(ConfigSection):
    fuzziness: float = config_key(
        1.1,
        gt=1.0,
        le=100.0,  # u^m stays a normal float64 for k <= 1000 (m ln k < 708); larger m only flattens u
        doc="fuzzifier m (m >= 1.5 collapses on high-dimensional data, see README)",
    )
    local_iters: int = config_key(1, ge=1, doc="local FCM iterations per round (1 = exactly centralized FCM)")
    delta: float = config_key(1e-6, ge=0.0, doc="stop when the relative centre shift is <= delta")
    init: str = config_key(
        "local-centres",
        choices=("local-centres", "moments"),
        doc="initial centres: k-means over local FCM centres, or seeded draws from the federated feature "
        "mean and variance (the only option with secagg)",
    )


# under DP one release per fit round: round 1 the noisy moments, then the noisy membership sums
FFCM_DP = DPSupport(RECORD, lambda num_rounds, dp, params: num_rounds)

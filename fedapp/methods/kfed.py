"""k-FED (Dennis et al., ICML 2021): the keys of `[tool.flwr.app.config.kfed]`."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key
from fedapp.privacy.dp import RECORD, DPSupport


@dataclass(frozen=True)
class KFedConfig(ConfigSection):
    local_k: int = config_key(0, ge=0, doc="local k-means centres k' per client; 0 = k")
    local_restarts: int = config_key(
        10, ge=1, doc="k-means++ restarts of the local k-means, best kept (each costs one k-means)"
    )


# under DP the local step is DP-Lloyd (clients/kfed.py): `dp.lloyd-iters` releases, sent once; FSBERT-kFED too
KFED_DP = DPSupport(RECORD, lambda num_rounds, dp, params: dp.lloyd_iters)

"""Which methods can choose k without labels (`fedapp tune`, `fedapp run` with k = 0), and in what space.

Shared by the preflight checks and the CLI's selection driver (`simulation/tune.py`), so a dry run refuses
exactly what a run would.
"""

from __future__ import annotations

from fedapp.config.run import ConfigError, RunConfig
from fedapp.methods import method_spec


def selection_space(cfg: RunConfig) -> str:
    """ "embeddings" (text methods: their sentence embeddings) or "features" (every other horizontal
    method); a one-line ConfigError for a run that cannot choose k."""
    spec = method_spec(cfg.method)
    if spec.vertical:
        raise ConfigError(
            f"k = 0 without labels: vertical method '{cfg.method}' cannot choose k yet; set k (e.g. from "
            "`fedapp tune --method kfed` on one party's view)"
        )
    if spec.own_k or not spec.federated:
        raise ConfigError(f"k = 0 without labels: method '{cfg.method}' has no federated k selection; set k")
    if cfg.secagg or cfg.dp.epsilon > 0:
        setting = "secagg=true" if cfg.secagg else f"dp.epsilon={cfg.dp.epsilon:g}"
        raise ConfigError(
            f"k = 0 without labels and {setting}: the selection's local centres are neither secure sums "
            "nor noised; set k"
        )
    return "embeddings" if "texts" in spec.modalities and "vectors" not in spec.modalities else "features"

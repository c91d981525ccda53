"""CeFMC (vertical multi-view): the keys of `[tool.flwr.app.config.cefmc]`, shared by its CeFMC-H ablation."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key


@dataclass(frozen=True)
class CeFMCConfig(ConfigSection):
    lam: float = config_key(1.0, name="lambda", ge=0.0, doc="trade-off lambda of Eq. 25 and Eq. 28")
    beta: float = config_key(-1.0, doc="beta of Eq. 28; < 0 means beta = lambda (the paper's choice)")
    delta: float = config_key(1e-6, ge=0.0, doc="stop when the relative objective change is <= delta")
    mm_factor: float = config_key(
        2.0,
        gt=0.0,
        doc="Alg. 1 coefficient on X X^T H (2 = monotone MM step; 1 = the paper's literal Alg. 1)",
    )
    h_iters: int = config_key(1, ge=1, doc="Alg. 1 iterations per round")
    pad: str = config_key(
        "zero",
        choices=("zero", "random"),
        doc="H_v(0) columns beyond rank(X_v) when k exceeds it: zero (no weight in the consensus) or "
        "random (orthonormal completion, the earlier behaviour)",
    )

    @property
    def effective_beta(self) -> float:
        """The paper sets beta = lambda unless told otherwise."""
        return self.lam if self.beta < 0 else self.beta

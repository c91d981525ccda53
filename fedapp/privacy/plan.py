"""One run's differential-privacy schedule: how many noisy releases each client makes, the noise
calibrated to them, and what summary.json says of it.

A method declares what it releases beside its code (`MethodSpec.dp`, a `fedapp.privacy.dp.DPSupport`);
`dp_plan(cfg)` turns that and the run config into a `DPPlan`, which clients and strategy alike use, so
the accountant's schedule is written once. The final report's releases (`dp.report = noise`, record-level
methods only) are part of the plan: its noise is calibrated to training and report together.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedapp.methods import method_spec
from fedapp.privacy.dp import (
    CLIENT,
    EVALUATION_NOT_COVERED,
    RECORD,
    REPORT_NOISE,
    REPORT_RELEASES,
    REPORT_WITHHOLD,
    DPConfig,
    DPSupport,
    calibrate,
    epsilon_spent,
)

if TYPE_CHECKING:
    from fedapp.config.run import RunConfig


class DPUnsupportedError(ValueError):
    """The method sends something no noise covers, so it cannot run under differential privacy."""


class DeltaError(ValueError):
    """`dp.delta` is too large for the data it protects (`check_delta`)."""


@dataclass(frozen=True)
class DPPlan:
    """The releases one client makes in a full run (training, then the final report) and their noise."""

    dp: DPConfig
    support: DPSupport
    training: int  # releases of the training rounds
    report: int  # releases of the final report (0: it withholds its statistics)
    model_release: bool  # the last round also releases the model with multiplier 2z (`DPSupport`)

    @property
    def total(self) -> int:
        return self.training + self.report

    @functools.cached_property
    def noise_multiplier(self) -> float:
        """z such that `total` Gaussian releases spend at most dp.epsilon at dp.delta."""
        return calibrate(self.dp.epsilon, self.dp.delta, self.total)

    def report_summary(self) -> dict[str, object]:
        """`privacy.dp.report`: what the final report released under DP, and its planned releases."""
        if self.report:
            released = (
                "noisy cluster sizes and per-cluster sums of the clipped records, then noisy per-cluster "
                "distance sums and the silhouette sum around the pooled means (projected into the clip "
                "ball); label-free metrics computed from them are noisy; keywords withheld"
            )
        else:
            why = (
                "dp.report = withhold" if self.dp.report == REPORT_WITHHOLD else f"unit '{self.support.unit}'"
            )
            released = f"nothing ({why}): no sizes, sums or keywords; assignments.csv stays on each node"
        return {
            "mode": self.dp.report if self.report else REPORT_WITHHOLD,
            "planned_releases": self.report,
            "released": released,
        }

    def summary(self, releases: int) -> dict[str, object]:
        """summary.json's `privacy.dp` block; `releases`: the most any client made (what actually ran)."""
        dp, z = self.dp, self.noise_multiplier
        block: dict[str, object] = {
            "unit": self.support.unit,
            "epsilon_target": dp.epsilon,
            "delta": dp.delta,
            "clip": dp.model_clip if self.support.unit == CLIENT else dp.clip,
            "noise_multiplier": z,
            "releases": releases,
            "planned_releases": self.total,
            "epsilon_spent": epsilon_spent(z, releases, dp.delta),
            "accountant": "rdp",
            "noise": "os-entropy"
            if dp.noise_seed < 0
            else f"seeded (dp.noise-seed={dp.noise_seed}: removable)",
            "not_covered": [*self.support.not_covered, *EVALUATION_NOT_COVERED],
            "report": self.report_summary(),
        }
        if self.model_release:  # the final model: also client-level on its own (`DPSupport`)
            block["model"] = {
                "unit": CLIENT,
                "clip": dp.model_clip,
                "noise_multiplier": 2 * z,
                "epsilon_spent": epsilon_spent(2 * z, 1, dp.delta),
                "releases": 1,
            }
        return block


def delta_bound(unit: str, records_per_client: Sequence[int]) -> tuple[float, str]:
    """(1 / the units one epsilon protects, what they are): a DP guarantee whose δ is not below it means
    little, since with probability δ a release may reveal one unit outright."""
    if unit == RECORD:
        return 1.0 / max(records_per_client), f"the {max(records_per_client)} records of the largest client"
    return 1.0 / len(records_per_client), f"the {len(records_per_client)} clients"


def check_delta(cfg: RunConfig, records_per_client: Sequence[int]) -> None:
    """Refuse a DP run whose `dp.delta` is not below `delta_bound` (DeltaError, one line)."""
    if not cfg.dp.enabled or not records_per_client:
        return
    bound, units = delta_bound(dp_support(cfg.method).unit, records_per_client)
    if cfg.dp.delta >= bound:
        raise DeltaError(
            f"dp.delta={cfg.dp.delta:g} is not below 1 / {units} ({bound:.3g}): with probability delta a "
            f"release may reveal one of them outright; set dp.delta below {bound:.3g} (e.g. 1e-5 or less)"
        )


def dp_support(method: str) -> DPSupport:
    """The method's `DPSupport`; DPUnsupportedError naming the methods that have one otherwise."""
    support = method_spec(method).dp
    if support is None:
        raise DPUnsupportedError(
            f"method '{method}' does not support differential privacy; use one of {sorted(dp_methods())}"
        )
    return support


def dp_methods() -> tuple[str, ...]:
    """Registered methods whose every message under DP is noised (or named as not covered)."""
    from fedapp.methods import METHODS

    return tuple(name for name, spec in METHODS.items() if spec.dp is not None)


def dp_plan(cfg: RunConfig) -> DPPlan:
    """The run's plan (dp.epsilon > 0); DPUnsupportedError for a method without `DPSupport`."""
    support = dp_support(cfg.method)
    spec = method_spec(cfg.method)
    params = cfg.params(spec.config) if spec.config is not None else None
    report = REPORT_RELEASES if cfg.dp.report == REPORT_NOISE and support.unit == RECORD else 0
    training = support.training_releases(cfg.num_rounds, cfg.dp, params)
    return DPPlan(cfg.dp, support, training, report, support.model_release(params))

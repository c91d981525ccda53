"""`fstc.marginal = adaptive | self-adaptive`: the pseudo-labels' cluster shares follow the data."""

from __future__ import annotations

import pytest
import torch

from fedapp.config.run import ConfigError, parse_run_config
from fedapp.maths.fstc import pseudo_labels, self_adaptive_shares, sinkhorn_log_plan
from fedapp.methods.fstc import FSTCConfig

TRUE_SHARES = torch.tensor([0.6, 0.3, 0.1])


def _skewed_scores(n: int = 3000, confidence: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    labels = torch.multinomial(TRUE_SHARES, n, replacement=True, generator=generator)
    scores = torch.randn(n, 3, generator=generator)
    scores[torch.arange(n), labels] += confidence
    return scores


def test_adaptive_pseudo_labels_recover_skewed_shares_and_uniform_ones_do_not() -> None:
    scores = _skewed_scores()
    uniform, _ = pseudo_labels(scores, 0.1)
    adaptive, _ = pseudo_labels(scores, 0.1, marginal_strength=0.01)
    assert (adaptive.argmax(1).bincount(minlength=3) / len(scores) - TRUE_SHARES).abs().max() <= 0.05
    assert (uniform.argmax(1).bincount(minlength=3) / len(scores) - TRUE_SHARES).abs().max() > 0.05


def test_self_adaptive_pseudo_labels_recover_skewed_shares_with_rows_met() -> None:
    scores = _skewed_scores()
    labels, result = pseudo_labels(scores, 0.1, marginal_barrier=1e-3)
    assert (labels.argmax(1).bincount(minlength=3) / len(scores) - TRUE_SHARES).abs().max() <= 0.05
    assert result.marginal_error <= 1e-6 and result.iterations < 1000  # the damped share step converges


def test_self_adaptive_shares_keep_every_one_of_a_hundred_long_tailed_clusters() -> None:
    k, n = 100, 2000
    shares = 50.0 ** (-torch.arange(k) / (k - 1))
    shares /= shares.sum()
    generator = torch.Generator().manual_seed(1)
    labels = torch.multinomial(shares, n, replacement=True, generator=generator)
    scores = torch.randn(n, k, generator=generator)
    scores[torch.arange(n), labels] += 4.0
    self_adaptive, _ = pseudo_labels(scores, 0.1, marginal_barrier=1e-3)
    uniform, _ = pseudo_labels(scores, 0.1)
    error = (self_adaptive.argmax(1).bincount(minlength=k) / n - shares).abs().max()
    assert error < (uniform.argmax(1).bincount(minlength=k) / n - shares).abs().max()
    assert self_adaptive.argmax(1).bincount(minlength=k).min() > 0


def test_self_adaptive_shares_solve_the_stationarity_condition() -> None:
    potentials = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    barrier = 1e-2
    b = self_adaptive_shares(potentials, barrier)
    assert abs(float(b.sum()) - 1) < 1e-12 and bool((b > 0).all())
    # c (1/b - 1/(1-b)) + g is the same constant h for every cluster
    h = potentials - barrier * (1 / b - 1 / (1 - b))
    assert float(h.max() - h.min()) < 1e-6
    with pytest.raises(ValueError, match="pass one"):
        sinkhorn_log_plan(
            torch.log_softmax(potentials[None, :], 1), 0.1, marginal_strength=1, marginal_barrier=1
        )


def test_a_strong_marginal_is_the_papers_equal_split() -> None:
    log_probs = torch.log_softmax(_skewed_scores(), dim=1)
    exact = sinkhorn_log_plan(log_probs, 0.1, max_iters=3000)
    strong = sinkhorn_log_plan(log_probs, 0.1, max_iters=3000, marginal_strength=1e6)
    shares = strong.log_plan.exp().sum(0) / log_probs.shape[0]
    assert torch.allclose(shares, torch.full((3,), 1 / 3, dtype=torch.float64), atol=1e-3)
    assert torch.allclose(exact.log_plan.exp().sum(0), strong.log_plan.exp().sum(0), rtol=1e-3)
    assert strong.marginal_error <= 1e-6  # every row still sums to one


def test_the_marginal_keys_parse_and_uniform_stays_the_default() -> None:
    cfg = parse_run_config({"method": "fstc", "dataset": "texts-demo", "fstc.marginal": "self-adaptive"})
    assert cfg.params(FSTCConfig).marginal == "self-adaptive" and FSTCConfig().marginal == "uniform"
    with pytest.raises(ConfigError, match="'fstc.marginal' must be one of 'uniform', 'adaptive'"):
        parse_run_config({"method": "fstc", "dataset": "texts-demo", "fstc.marginal": "learned"})


@pytest.mark.usefixtures("text_embedding_cache")
def test_an_fstc_run_with_the_adaptive_marginal_clusters_the_demo_topics(tmp_path) -> None:  # noqa: ANN001
    from fedapp.launch.resolve import build_overrides
    from simulation.runner import execute

    quick = {"fstc.local-iters": 20, "fstc.batch-size": 50, "fstc.warmup-iters": 10, "fstc.label-updates": 4}
    base = {"method": "fstc", "dataset": "texts-demo", "num-clients": 2, "num-rounds": 4, "seed": 0, **quick}
    summary = execute(
        build_overrides({**base, "fstc.marginal": "adaptive"}, tmp_path), "inprocess", quiet=True
    )
    assert summary["status"] == "converged" and summary["metrics"]["nmi"] >= 0.8


@pytest.mark.usefixtures("text_embedding_cache")
def test_fstc_replies_with_clusters_withheld_by_the_privacy_floor_are_accepted(tmp_path) -> None:  # noqa: ANN001
    from fedapp.launch.resolve import build_overrides
    from simulation.runner import execute

    quick = {"fstc.local-iters": 10, "fstc.batch-size": 50, "fstc.warmup-iters": 5, "fstc.label-updates": 2}
    base = {"method": "fstc", "dataset": "texts-demo", "num-clients": 3, "num-rounds": 3, "seed": 0, **quick}
    # 133 texts a client, 4 topics of about 33: a floor of 40 withholds every round's centres
    summary = execute(build_overrides({**base, "min-cluster-size": 40}, tmp_path), "inprocess", quiet=True)
    assert summary["status"] == "converged", summary["status_reason"]  # no reply rejected for its sizes
    assert all(len(record["accepted"]) == 3 for record in summary["participation"].values())

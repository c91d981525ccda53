"""Differential privacy (`fedapp.privacy.dp`): clipping, the noise scale, the accountant, calibration, what
the
FFCM and k-FED clients send under DP, config errors before start, and a small end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from flwr.common import Context, RecordDict

from clients.ffcm import FFCMClient, membership_sums
from clients.kfed import KFedClient, dp_lloyd
from fedapp.config.run import ConfigError, parse_run_config
from fedapp.datasets.local import load_run_dataset
from fedapp.maths.clustering import nearest_centre
from fedapp.privacy.dp import (
    RELEASES_KEY,
    PrivacyBudgetError,
    calibrate,
    clip_rows,
    epsilon_spent,
    gaussian_mechanism,
    secret_rng,
    sum_count_sensitivity,
)
from fedapp.privacy.plan import dp_methods, dp_plan
from simulation.__main__ import main
from tests.run_checks import assert_ran_through

DP = {"dp.epsilon": 2.0, "dp.delta": 1e-5, "dp.clip": 1.0}


def _context(pid: int, clients: int) -> Context:
    node = {"partition-id": pid, "num-partitions": clients}
    return Context(run_id=0, node_id=pid + 1, node_config=node, state=RecordDict(), run_config={})


# ------------------------------------------------------------------------------------------- mechanism
def test_clipping_bounds_every_norm_and_keeps_short_rows() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(scale=5.0, size=(200, 7))
    X[:3] *= 1e-3  # already inside the ball
    clipped = clip_rows(X, 1.5)
    norms = np.linalg.norm(clipped, axis=1)
    assert norms.max() <= 1.5 + 1e-12
    np.testing.assert_array_equal(clipped[:3], X[:3])
    # direction is kept: clipped rows are positive multiples of the originals
    cosine = (clipped * X).sum(1) / (norms * np.linalg.norm(X, axis=1))
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-12)


def test_noise_has_the_calibrated_scale() -> None:
    z, clip = 3.0, 2.0
    zeros = [np.zeros((200, 100)), np.zeros(20_000)]
    noisy = gaussian_mechanism(zeros, sum_count_sensitivity(clip), z, np.random.default_rng(1))
    expected = z * np.sqrt(clip**2 + 1)
    for sample in noisy:
        assert abs(sample.std() / expected - 1) < 0.03
        assert abs(sample.mean()) < 0.05 * expected


# ------------------------------------------------------------------------------------------ accountant
@pytest.mark.parametrize(("z", "releases", "delta"), [(1.1, 1, 1e-5), (4.8, 5, 1e-5), (7.0, 40, 1e-6)])
def test_epsilon_is_dp_accountings_own(z: float, releases: int, delta: float) -> None:
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), releases))
    assert epsilon_spent(z, releases, delta) == pytest.approx(accountant.get_epsilon(delta), rel=1e-12)
    assert epsilon_spent(z, 0, delta) == 0.0


@pytest.mark.parametrize("releases", [1, 5, 30])
def test_calibration_meets_the_target_and_is_monotone(releases: int) -> None:
    targets = [0.5, 1.0, 2.0, 4.0, 8.0]
    multipliers = [calibrate(eps, 1e-5, releases) for eps in targets]
    for eps, z in zip(targets, multipliers, strict=True):
        spent = epsilon_spent(z, releases, 1e-5)
        assert eps - 1e-3 <= spent <= eps
    assert all(a > b for a, b in zip(multipliers, multipliers[1:], strict=False))  # less epsilon, more noise
    assert calibrate(2.0, 1e-5, releases + 10) > calibrate(2.0, 1e-5, releases)  # more releases, more noise


# ------------------------------------------------------------------------------------ client payloads
def test_ffcm_sums_under_dp_are_noisy_and_a_huge_record_cannot_dominate() -> None:
    cfg = parse_run_config({"method": "ffcm", "dataset": "digits", "num-clients": 2, **DP})
    context = _context(0, 2)
    client = FFCMClient(context, cfg)
    centres = clip_rows(client.data.features[:10], cfg.dp.clip)
    config = {"phase": "update", "fuzziness": 1.1, "local-iters": 1, "server-round": 2}
    exact_sums, exact_mass = membership_sums(client.data.features, centres, 1.1)
    clipped_sums, clipped_mass = membership_sums(client.space, centres, 1.1)
    (sums, mass), examples, metrics = client.fit([centres], config)
    assert examples == 0 and metrics[RELEASES_KEY] == 1
    assert not np.allclose(sums, exact_sums) and not np.allclose(sums, clipped_sums)
    # the noise is what calibration says, around the clipped (not the raw) statistics
    scale = dp_plan(cfg).noise_multiplier * sum_count_sensitivity(cfg.dp.clip)
    residual = np.concatenate([(sums - clipped_sums).ravel(), mass - clipped_mass])
    assert abs(residual.std() / scale - 1) < 0.1
    # what is noised is a sum of clipped rows: no cluster's sum exceeds clip x its mass (the raw ones do)
    assert (np.linalg.norm(clipped_sums, axis=1) <= cfg.dp.clip * clipped_mass + 1e-9).all()
    assert (np.linalg.norm(exact_sums, axis=1) > 2 * cfg.dp.clip * exact_mass).all()
    # a record of norm 1e9 moves the clipped statistics by at most clip + 1 (before noise)
    huge = np.vstack([client.data.features, 1e9 * np.ones((1, centres.shape[1]))])
    with_huge = membership_sums(clip_rows(huge, cfg.dp.clip), centres, 1.1)
    change = np.sqrt(((with_huge[0] - clipped_sums) ** 2).sum() + ((with_huge[1] - clipped_mass) ** 2).sum())
    assert change <= sum_count_sensitivity(cfg.dp.clip) + 1e-9


def test_ffcm_client_refuses_more_releases_than_planned_and_unbounded_phases() -> None:
    cfg = parse_run_config({"method": "ffcm", "dataset": "digits", "num-clients": 2, "num-rounds": 2, **DP})
    client = FFCMClient(_context(1, 2), cfg)
    centres = client.space[:10]
    with pytest.raises(ValueError, match="under DP only moments"):  # refused before it is counted
        client.fit([], {"phase": "init", "fuzziness": 1.1})
    moments, _, _ = client.fit([], {"phase": "moments", "fuzziness": 1.1})
    assert [a.shape for a in moments] == [(64,), (64,), (1,)]
    assert not np.isclose(moments[2][0], client.data.n_samples)  # the count is noisy too
    client.fit([centres], {"phase": "update", "fuzziness": 1.1, "local-iters": 1})  # release 2 of 2
    with pytest.raises(PrivacyBudgetError, match="2 of 2 planned"):
        client.fit([centres], {"phase": "update", "fuzziness": 1.1, "local-iters": 1})


def test_kfed_client_under_dp_sends_noisy_dp_lloyd_centres_once() -> None:
    # a fixed draw (dp.noise-seed): with fresh entropy the rounded noisy counts sum to n now and then
    keys = {"method": "kfed", "dataset": "digits", "num-clients": 2, **DP, "dp.noise-seed": 11}
    cfg = parse_run_config(keys)
    client = KFedClient(_context(0, 2), cfg)
    (centres, counts), examples, metrics = client.fit([], {"local-k": 10})
    assert examples == 0 and metrics[RELEASES_KEY] == cfg.dp.lloyd_iters
    assert counts.dtype.kind == "i" and centres.shape[0] == counts.shape[0] >= 1
    assert np.linalg.norm(centres, axis=1).max() <= cfg.dp.clip + 1e-9
    # the noise is the release's: the same draw again gives the same reply, another draw another one,
    # and DP-Lloyd with (almost) no noise on the same rows gives counts summing to n
    (again, again_counts), _, _ = KFedClient(_context(0, 2), cfg).fit([], {"local-k": 10})
    np.testing.assert_array_equal(again_counts, counts)
    np.testing.assert_array_equal(again, centres)
    other = parse_run_config({**keys, "dp.noise-seed": 12})
    (_, other_counts), _, _ = KFedClient(_context(0, 2), other).fit([], {"local-k": 10})
    assert not np.array_equal(other_counts, counts)
    X = client.data.features
    _, exact = dp_lloyd(X, 10, cfg.dp.clip, 1e-12, cfg.dp.lloyd_iters, client.seed, np.random.default_rng(0))
    assert np.rint(exact).sum() == client.data.n_samples
    assert counts.sum() != client.data.n_samples  # this draw's noise moved the total
    with pytest.raises(PrivacyBudgetError):
        client.fit([], {"local-k": 10})


def test_dp_lloyd_with_tiny_noise_is_lloyd_on_clipped_rows_and_bounds_a_huge_record() -> None:
    rng = np.random.default_rng(0)
    means = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    X = np.concatenate([m + 0.05 * rng.normal(size=(300, 3)) for m in means])
    centres, counts = dp_lloyd(X, 3, 1.0, 1e-9, 12, seed=3, rng=np.random.default_rng(1))
    # converged Lloyd: every centre is the mean of the clipped rows nearest to it, counts are theirs
    clipped = clip_rows(X, 1.0)
    labels = nearest_centre(clipped, centres)
    np.testing.assert_allclose(counts, np.bincount(labels, minlength=3), atol=1e-6)
    for j in np.flatnonzero(counts > 0.5):
        np.testing.assert_allclose(
            centres[j], clip_rows(clipped[labels == j].mean(0)[None], 1.0)[0], atol=1e-6
        )
    assert counts.max() < 900  # the mean-plus-offsets start splits the data
    with pytest.raises(ValueError, match=">= 2 releases"):
        dp_lloyd(X, 3, 1.0, 1.0, 1, seed=3, rng=rng)
    # a record of norm 1e9 is clipped first: centres stay in the clip ball
    huge = np.vstack([X, [[1e9, 1e9, 1e9]]])
    centres_huge, _ = dp_lloyd(huge, 3, 1.0, 1e-6, 10, seed=3, rng=np.random.default_rng(1))
    assert np.linalg.norm(centres_huge, axis=1).max() <= 1.0 + 1e-9


# --------------------------------------------------------------------------------- config before start
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["dp.epsilon=-1"], "'dp.epsilon' must be >= 0"),
        (["dp.epsilon=2", "dp.delta=0"], "'dp.delta' must be in (0, 1)"),
        (["dp.epsilon=2", "dp.delta=1"], "'dp.delta' must be in (0, 1)"),
        (["dp.epsilon=2", "dp.clip=0"], "'dp.clip' must be > 0"),
        (["dp.epsilon=2", "secagg=true"], "not supported together"),
        (["dp.epsilon=2", "ffcm.local-iters=3"], "needs ffcm.local-iters=1"),
    ],
)
def test_bad_dp_values_fail_in_one_line_before_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], settings: list[str], message: str
) -> None:
    argv = ["run", "--method", "ffcm", "--dataset", "digits", "--out", str(tmp_path / "o"), "--dry-run"]
    for setting in settings:
        argv += ["--set", setting]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_dp_on_a_method_without_support_names_the_supported_ones() -> None:
    with pytest.raises(ConfigError, match="does not support differential privacy") as info:
        parse_run_config({"method": "fedcmv", "dataset": "digits-mv", "dp.epsilon": 1.0})
    assert all(name in str(info.value) for name in dp_methods())
    assert parse_run_config({"method": "kfed", **DP}).dp.epsilon == 2.0


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize("method", ["ffcm", "kfed"])
def test_small_federation_reports_the_epsilon_it_spent(tmp_path: Path, method: str) -> None:
    out = tmp_path / method
    argv = ["run", "--method", method, "--dataset", "digits", "--clients", "4", "--engine", "inprocess"]
    argv += ["--set", "num-rounds=3", "--out", str(out)]
    for key, value in DP.items():
        argv += ["--set", f"{key}={value}"]
    code = main(argv)
    summary = json.loads((out / "summary.json").read_text())
    privacy = summary["privacy"]["dp"]
    assert_ran_through(summary, code)
    assert privacy["accountant"] == "rdp" and privacy["epsilon_target"] == 2.0
    assert 0 < privacy["epsilon_spent"] <= 2.0
    assert privacy["releases"] == (3 if method == "ffcm" else parse_run_config({}).dp.lloyd_iters)
    assert privacy["epsilon_spent"] == pytest.approx(
        epsilon_spent(privacy["noise_multiplier"], privacy["releases"], 1e-5)
    )
    assert "label_free" not in summary["report"]  # withheld under DP: those sums would be exact
    assert load_run_dataset(parse_run_config({"dataset": "digits"})).n_samples > 0


# -------------------------------------------------------------------------------------------- noise seed
def test_noise_is_unseeded_by_default_and_repeats_only_with_a_noise_seed() -> None:
    fresh = parse_run_config({"method": "kfed", **DP}).dp
    assert fresh.noise_seed == -1
    assert secret_rng(fresh, 0, 1).normal() != secret_rng(fresh, 0, 1).normal()  # OS entropy
    seeded = parse_run_config({"method": "kfed", **DP, "dp.noise-seed": 7}).dp
    assert secret_rng(seeded, 0, 1).normal() == secret_rng(seeded, 0, 1).normal()
    # clients, releases and streams within a release draw different noise
    draws = {secret_rng(seeded, *key).normal() for key in [(0, 1), (1, 1), (0, 2), (0, 1, 1)]}
    assert len(draws) == 4


@pytest.mark.parametrize(
    ("method", "dataset"), [("ffcm", "digits"), ("kfed", "digits"), ("fstc", "texts-demo")]
)
def test_a_dp_run_with_a_noise_seed_repeats_and_says_its_noise_is_removable(
    tmp_path: Path, method: str, dataset: str
) -> None:
    summaries = []
    for name in ("a", "b"):
        argv = ["run", "--method", method, "--dataset", dataset, "--clients", "2", "--engine", "inprocess"]
        argv += ["--set", "num-rounds=2", "--set", "dp.noise-seed=3", "--out", str(tmp_path / name)]
        for key, value in DP.items():
            argv += ["--set", f"{key}={value}"]
        code = main(argv)
        summaries.append(json.loads((tmp_path / name / "summary.json").read_text()))
        assert_ran_through(summaries[-1], code)
    assert summaries[0]["metrics"] == summaries[1]["metrics"]
    # the released (noisy) global model itself repeats byte for byte, not only the metrics
    weights = [sorted((tmp_path / name / "model").glob("model.*[!n]"))[0] for name in ("a", "b")]
    assert (
        weights[0].suffix in (".npz", ".safetensors") and weights[0].read_bytes() == weights[1].read_bytes()
    )
    assert "removable" in summaries[0]["privacy"]["dp"]["noise"]
    with pytest.raises(ConfigError, match="noise-seed"):
        parse_run_config({"method": method, **DP, "dp.noise-seed": -2})

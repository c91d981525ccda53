"""The final report as one stage object (strategies/report.py): plain replies, SecAgg+ totals and noisy
releases feed one merge, and a checkpoint keeps the report's state."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from flwr.common import Code, EvaluateRes, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from fedapp.config.run import parse_run_config
from fedapp.metrics.label_free import cluster_sums, distance_sums, pooled_means
from fedapp.report.stages import (
    DISTANCES_KEY,
    NOISY_KEY,
    REPORT_KEY,
    ROWS_KEY,
    SCORE_KIND_KEY,
    SECURE_DONE,
    SIZES_KEY,
    STAGE_ASSIGN,
    STAGE_DISTANCES,
    SUMS_KEY,
    encode_cluster_sums,
    encode_distance_sums,
    encode_noisy,
    secure_assign_arrays,
    secure_distance_arrays,
)
from fedapp.wire import encode_array
from strategies.kfed import KFedStrategy
from strategies.report_intake import noisy_assignments, noisy_distances
from tests.flower_mocks import mock_manager, mock_proxy

K = 3
CIDS = ["c0", "c1", "c2"]


def _clients() -> list[tuple[np.ndarray, np.ndarray]]:
    """Three clients' (features, labels), every cluster on every client (no privacy floor at work)."""
    rng = np.random.default_rng(7)
    clients = []
    for n in (30, 45, 24):
        labels = np.arange(n) % K
        clients.append((rng.normal(size=(n, 4)) + 2.0 * labels[:, None], labels))
    return clients


def _strategy(tmp_path: Path) -> KFedStrategy:
    cfg = parse_run_config({"method": "kfed", "dataset": "digits", "out-dir": str(tmp_path), "k": K})
    strategy = KFedStrategy(cfg)
    strategy.final_report.asked = list(CIDS)
    return strategy


def _evaluate(cid: str, metrics: dict) -> tuple:
    return mock_proxy(cid), EvaluateRes(Status(Code.OK, ""), 0.0, 0, metrics)


def _secure(totals: list[np.ndarray], weights: list[int], metrics: list[dict]) -> list:
    """Fit replies as SecAgg+ hands them to the strategy: every one carries the weighted average."""
    average = ndarrays_to_parameters([t / sum(weights) for t in totals])
    return [
        (mock_proxy(cid), FitRes(Status(Code.OK, ""), average, n, extra))
        for cid, n, extra in zip(CIDS, weights, metrics, strict=True)
    ]


def _plain_report(tmp_path: Path) -> KFedStrategy:
    """A plain run's report of `_clients`, both stages."""
    strategy = _strategy(tmp_path)
    report = strategy.final_report
    replies = []
    for i, (x, labels) in enumerate(_clients()):
        metrics = {
            "partition-id": i,
            ROWS_KEY: len(labels),
            SCORE_KIND_KEY: "distance",
            SIZES_KEY: encode_array(np.bincount(labels, minlength=K).astype(np.int64)),
            SUMS_KEY: encode_cluster_sums(cluster_sums(x, labels, K)),
        }
        replies.append(_evaluate(CIDS[i], metrics))
    assert report.aggregate(STAGE_ASSIGN, replies, [])
    pooled = report.pooled_sums()
    means = pooled_means(pooled)
    replies = [
        _evaluate(
            CIDS[i],
            {
                "partition-id": i,
                DISTANCES_KEY: encode_distance_sums(distance_sums(x, y, means, pooled.counts)),
            },
        )
        for i, (x, y) in enumerate(_clients())
    ]
    assert report.aggregate(STAGE_DISTANCES, replies, [])
    return strategy


def test_plain_parts_their_secure_totals_and_noise_free_releases_give_one_report(tmp_path: Path) -> None:
    plain = _plain_report(tmp_path / "plain").final_report
    clients = _clients()
    weights = [len(labels) for _, labels in clients]
    parts = [cluster_sums(x, labels, K) for x, labels in clients]
    sizes = [np.bincount(labels, minlength=K) for _, labels in clients]
    pooled = plain.pooled_sums()
    means = pooled_means(pooled)
    distances = [distance_sums(x, labels, means, pooled.counts) for x, labels in clients]

    # SecAgg+: the server sees only the totals (here exact: no quantisation)
    secure = _strategy(tmp_path / "secure").final_report
    in_clear = [{"partition-id": i, ROWS_KEY: n, SCORE_KIND_KEY: "distance"} for i, n in enumerate(weights)]
    stage_one = [secure_assign_arrays(s, p, 1.0) for s, p in zip(sizes, parts, strict=True)]
    totals = [np.sum(arrays, axis=0) for arrays in zip(*stage_one, strict=True)]
    assert (
        secure.aggregate_secure(STAGE_ASSIGN, _secure(totals, weights, in_clear), [], 1.0, True)
        == SECURE_DONE
    )
    stage_two = [secure_distance_arrays(d, 1.0) for d in distances]
    totals = [np.sum(arrays, axis=0) for arrays in zip(*stage_two, strict=True)]
    identity = [{"partition-id": i} for i in range(len(CIDS))]
    assert (
        secure.aggregate_secure(STAGE_DISTANCES, _secure(totals, weights, identity), [], 1.0, True)
        == SECURE_DONE
    )

    # differential privacy with zero noise: the releases are the clients' own statistics
    noisy = _strategy(tmp_path / "noisy").final_report
    releases = [
        _evaluate(cid, {"partition-id": i, NOISY_KEY: encode_noisy(sizes=s, sums=p.sums)})
        for i, (cid, s, p) in enumerate(zip(CIDS, sizes, parts, strict=True))
    ]
    assert noisy.merge_assignments(noisy_assignments(releases, K))
    releases = [
        _evaluate(
            cid,
            {
                NOISY_KEY: encode_noisy(
                    distance_sums=d.distance_sums,
                    squared_sums=d.squared_sums,
                    silhouette_sum=d.silhouette_sum,
                )
            },
        )
        for cid, d in zip(CIDS, distances, strict=True)
    ]
    assert noisy.merge_distances(noisy_distances(releases, len(CIDS), noisy.pooled_sums().counts))

    for other in (secure, noisy):
        assert other.summary["cluster_sizes"] == plain.summary["cluster_sizes"]
        np.testing.assert_allclose(other.pooled_sums().sums, pooled.sums, rtol=1e-12)
        for key, value in plain.summary["label_free"].items():
            assert other.summary["label_free"][key] == pytest.approx(value, rel=1e-9), key
    assert secure.summary["assigned_rows"] == plain.summary["assigned_rows"] == {"0": 30, "1": 45, "2": 24}
    assert secure.summary["withheld_records"] == plain.summary["withheld_records"] == 0
    assert secure.summary["score"] == plain.summary["score"]
    assert noisy.summary["noisy"] is True and "noisy" not in plain.summary


def test_a_checkpoint_keeps_the_report(tmp_path: Path) -> None:
    strategy = _plain_report(tmp_path)
    strategy.privacy.secagg_clipped, strategy.privacy.releases = 3, 2
    state = pickle.loads(pickle.dumps(strategy.state_dict()))  # what `save_strategy` writes and reads
    restored = _strategy(tmp_path)
    restored.load_state_dict(state)
    report, before = restored.final_report, strategy.final_report
    assert report.summary == before.summary and report.reporters == before.reporters == dict(enumerate(CIDS))
    assert report.asked == before.asked
    assert sorted(report.sums) == sorted(before.sums)
    np.testing.assert_array_equal(report.pooled_sums().sums, before.pooled_sums().sums)
    assert (restored.privacy.secagg_clipped, restored.privacy.releases) == (3, 2)
    # the restored report asks the same clients for distances, with the same pooled means
    instructions = report.configure(STAGE_DISTANCES, mock_manager(CIDS))
    assert [proxy.cid for proxy, _ in instructions] == CIDS
    assert all(ins.config == {REPORT_KEY: STAGE_DISTANCES} for _, ins in instructions)
    sent = parameters_to_ndarrays(instructions[0][1].parameters)
    np.testing.assert_allclose(sent[0], pooled_means(before.pooled_sums()))


def test_secure_stages_carry_the_plain_stages_config_and_a_stage_nobody_reached_is_a_loss(
    tmp_path: Path,
) -> None:
    """Under SecAgg+ a stage's fit messages keep what its plain messages say (the chosen k: a Ray process
    that serves only the report builds its client from it; how a kept start labels), and a stage that
    SecAgg+ aggregated nothing for names every client asked in the report's problems."""
    from fedapp.app.k_selection import CHOSEN_K_KEY
    from fedapp.report.stages import SCALE_KEY

    strategy = _strategy(tmp_path)
    strategy.latest_parameters = ndarrays_to_parameters([np.zeros((K, 4))])
    strategy.k_choice.chosen = K
    manager = mock_manager(CIDS)
    plain = strategy.final_report.configure(STAGE_ASSIGN, manager)
    secure = strategy.final_report.configure_secure(STAGE_ASSIGN, manager, 0.25)
    assert plain and len(secure) == len(plain)
    for (_, ins), (_, fit) in zip(plain, secure, strict=True):
        assert fit.config == {**ins.config, SCALE_KEY: 0.25} and fit.config[CHOSEN_K_KEY] == K
    strategy.final_report.lost(STAGE_ASSIGN, "SecAgg+ aggregated nothing")
    assert strategy.final_report.problems[STAGE_ASSIGN] == sorted(CIDS)
    assert any("SecAgg+ aggregated nothing" in warning for warning in strategy.warnings)


def test_values_secagg_clipped_are_a_warning_in_the_summary(tmp_path: Path) -> None:
    """SecAgg+ clipping makes a sum wrong, not noisy: a run that clipped says so in summary.json's
    warnings, not only in the console lines of the rounds that did."""
    strategy = _plain_report(tmp_path)
    strategy.privacy.secagg_clipped = 12
    strategy.finalize()
    assert any("SecAgg+ clipped 12 uploaded values" in warning for warning in strategy.warnings)
    clean = _plain_report(tmp_path / "clean")
    clean.finalize()
    assert not any("SecAgg+ clipped" in warning for warning in clean.warnings)

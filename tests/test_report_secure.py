"""The final report under SecAgg+ (issue #31): sizes, cluster sums and distance sums reach the server only
as totals, and give the plain report's metrics within SecAgg+'s quantisation tolerance.

The maths is checked with SecAgg+'s own arithmetic (`tests.test_secagg.secagg_average`); the e2e runs
compare a secure run (Flower's SecAgg+ over the in-process DirectGrid, equal to Ray's:
tests/test_e2e_flower.py) with the plain run of the same keys and check on the wire that the report sent
no evaluate message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Code, Context, FitRes, RecordDict, Status, ndarrays_to_parameters

from clients.ffcm import FFCMClient
from fedapp.app.server_loop import WIRE_BYTES_FILE
from fedapp.config.run import parse_run_config
from fedapp.launch.resolve import build_overrides
from fedapp.metrics.label_free import (
    ClusterSums,
    cluster_sums,
    distance_sums,
    label_free_metrics,
    merge_cluster_sums,
    merge_distance_sums,
    pooled_means,
)
from fedapp.privacy.secagg import CLEAR_KEY, CLIPPED_KEY, SUM, secure_upload, sum_tolerance
from fedapp.report.stages import (
    DISTANCES_KEY,
    REPORT_KEY,
    ROWS_KEY,
    SCALE_KEY,
    SECURE_DONE,
    SECURE_RETRY,
    SIZES_KEY,
    STAGE_ASSIGN,
    STAGE_DISTANCES,
    SUMS_KEY,
    TABLE_KEY,
    assign_from_totals,
    distances_from_totals,
    secure_assign_arrays,
    secure_distance_arrays,
)
from simulation.runner import execute
from strategies.ffcm import FFCMStrategy
from tests.flower_mocks import mock_proxy
from tests.test_secagg import CLIP, FSTC_SECURE_KEYS, MAX_WEIGHT, secagg_average

K = 3


def _clients(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Three clients' (features, labels) with an offset (cancellation-prone) and unequal sizes."""
    rng = np.random.default_rng(seed)
    clients = []
    for n in (40, 75, 23):
        labels = rng.integers(0, K, n)
        clients.append((rng.normal(size=(n, 4)) + labels[:, None] + 3.0, labels))
    return clients


def _secure_totals(arrays: list[list[np.ndarray]], weights: list[int]) -> list[np.ndarray]:
    masked = [secure_upload(a, [SUM] * len(a), n, CLIP)[0] for a, n in zip(arrays, weights, strict=True)]
    return [a * sum(weights) for a in secagg_average(masked, weights)]


def test_secure_totals_give_the_plain_label_free_metrics_within_quantisation() -> None:
    clients = _clients()
    weights = [len(labels) for _, labels in clients]
    parts = [cluster_sums(x, labels, K) for x, labels in clients]
    sizes = [np.bincount(labels, minlength=K) for _, labels in clients]
    plain_sums = merge_cluster_sums(parts)
    scale = 0.25  # the public factor the server may send: the result must not depend on it
    totals = _secure_totals(
        [secure_assign_arrays(s, p, scale) for s, p in zip(sizes, parts, strict=True)], weights
    )
    secure_sizes, secure_sums = assign_from_totals(totals, K, scale)
    assert secure_sums is not None
    np.testing.assert_array_equal(secure_sizes, np.sum(sizes, axis=0))  # integers, rounded exactly
    np.testing.assert_array_equal(secure_sums.counts, plain_sums.counts)
    tolerance = sum_tolerance(CLIP, MAX_WEIGHT, len(clients))
    np.testing.assert_allclose(secure_sums.sums, plain_sums.sums, atol=tolerance / scale)

    means, counts = pooled_means(plain_sums), plain_sums.counts
    distances = [distance_sums(x, labels, means, counts) for x, labels in clients]
    totals = _secure_totals([secure_distance_arrays(d, scale) for d in distances], weights)
    secure_distances = distances_from_totals(totals, secure_sums.counts, scale)
    plain_metrics = label_free_metrics(plain_sums, merge_distance_sums(distances))
    secure_metrics = label_free_metrics(secure_sums, secure_distances)
    assert secure_metrics["cluster_sizes"] == plain_metrics["cluster_sizes"]
    for key in ("inertia", "calinski_harabasz", "davies_bouldin", "simplified_silhouette"):
        assert secure_metrics[key] == pytest.approx(plain_metrics[key], rel=1e-3), key
    assert secure_metrics["inertia"] == pytest.approx(plain_metrics["inertia"], abs=tolerance / scale)


def _strategy(tmp_path: Path) -> FFCMStrategy:
    cfg = parse_run_config(
        {"method": "ffcm", "dataset": "digits", "out-dir": str(tmp_path), "k": K, "secagg": True}
    )
    strategy = FFCMStrategy(cfg)
    strategy.final_report.asked = ["c0", "c1", "c2"]
    return strategy


def _secure_results(arrays: list[list[np.ndarray]], weights: list[int], metrics: list[dict]) -> list:
    average = ndarrays_to_parameters([a / sum(weights) for a in _secure_totals(arrays, weights)])
    return [
        (mock_proxy(f"c{i}"), FitRes(Status(Code.OK, ""), average, n, {"partition-id": i, **extra}))
        for i, (n, extra) in enumerate(zip(weights, metrics, strict=True))
    ]


def test_strategy_merges_secure_totals_and_retries_when_secagg_would_clip(tmp_path: Path) -> None:
    clients = _clients(1)
    weights = [len(labels) for _, labels in clients]
    parts = [cluster_sums(x, labels, K) for x, labels in clients]
    arrays = [
        secure_assign_arrays(np.bincount(labels, minlength=K), part, 1.0)
        for (_, labels), part in zip(clients, parts, strict=True)
    ]
    strategy = _strategy(tmp_path)
    clipped = [{ROWS_KEY: n, CLIPPED_KEY: 2 if i == 1 else 0} for i, n in enumerate(weights)]
    retry = strategy.final_report.aggregate_secure(
        STAGE_ASSIGN, _secure_results(arrays, weights, clipped), [], 1.0, False
    )
    assert retry == SECURE_RETRY and "label_free" not in strategy.final_report.summary
    fine = [{ROWS_KEY: n, CLIPPED_KEY: 0} for n in weights]
    done = strategy.final_report.aggregate_secure(
        STAGE_ASSIGN, _secure_results(arrays, weights, fine), [], 1.0, False
    )
    assert done == SECURE_DONE
    assert strategy.final_report.summary["assigned_rows"] == {"0": 40, "1": 75, "2": 23}
    assert strategy.final_report.summary["cluster_sizes"] == merge_cluster_sums(parts).counts.tolist()
    assert strategy.final_report.summary["secagg"]["attempts"] == {STAGE_ASSIGN: 2}
    pooled: ClusterSums = strategy.final_report.pooled_sums()
    means = pooled_means(pooled)
    distances = [distance_sums(x, labels, means, pooled.counts) for x, labels in clients]
    results = _secure_results([secure_distance_arrays(d, 1.0) for d in distances], weights, fine)
    assert strategy.final_report.aggregate_secure(STAGE_DISTANCES, results, [], 1.0, True) == SECURE_DONE
    plain = label_free_metrics(merge_cluster_sums(parts), merge_distance_sums(distances))
    assert strategy.final_report.summary["label_free"]["inertia"] == pytest.approx(plain["inertia"], rel=1e-4)


def test_secure_report_reply_carries_no_clients_statistics_in_the_clear(tmp_path: Path) -> None:
    """What a client sends in its secure report beyond the masked vector: identity, row count (SecAgg+'s
    weight), score kind, the floor's count and SecAgg+'s bookkeeping; no sizes, sums, distances, table."""
    keys = {"method": "ffcm", "dataset": "digits", "num-clients": 3, "k": K, "secagg": True}
    cfg = parse_run_config({**keys, "node-out-dir": str(tmp_path)})
    node = {"partition-id": 1, "num-partitions": 3}
    client = FFCMClient(
        Context(run_id=0, node_id=2, node_config=node, state=RecordDict(), run_config={}), cfg
    )
    centres = client.data.features[:K] + 0.1
    config = {REPORT_KEY: STAGE_ASSIGN, SCALE_KEY: 1.0}
    arrays, n, metrics = client.final_report.secure([centres], config)
    allowed = {"partition-id", "k", ROWS_KEY, "score-kind", "floor-withheld", CLEAR_KEY, CLIPPED_KEY}
    assert set(metrics) <= allowed and not {SIZES_KEY, SUMS_KEY, TABLE_KEY} & set(metrics)
    assert n == client.data.n_samples and metrics[CLIPPED_KEY] == 0
    assert [a.shape for a in arrays] == [(K,), (K,), (K, client.data.features.shape[1])]
    counts = np.bincount(client.predict([centres], {}), minlength=K)
    np.testing.assert_allclose(arrays[0] * n, counts)  # sizes / n: what SecAgg+ masks, never in the clear
    means = np.zeros((K, client.data.features.shape[1]))
    arrays, _, metrics = client.final_report.secure(
        [means, counts], {REPORT_KEY: STAGE_DISTANCES, SCALE_KEY: 0.5}
    )
    assert DISTANCES_KEY not in metrics and len(arrays) == 4 and arrays[3][0] == pytest.approx(1.0)


# ----------------------------------------------------------------------------------- end to end
def _run(out_dir: Path, keys: dict[str, Any], *, secagg: bool) -> dict[str, Any]:
    overrides = build_overrides({"secagg-max-weight": MAX_WEIGHT, **keys, "secagg": secagg}, out_dir)
    summary = execute(overrides, engine="inprocess", quiet=True)  # SecAgg+ over a DirectGrid
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    assert summary.get("secagg_clipped", 0) == 0
    return summary


def _report_went_through_secagg(out_dir: Path, clients: int) -> None:
    """On the wire, the report (message group 0) was SecAgg+'s four exchanges per stage, all fit
    messages: no evaluate message, i.e. no reply in the clear, carried the report or `select = best`'s
    scoring of the two candidates (three stages, each asked again at a smaller scale when SecAgg+ would
    clip)."""
    report = json.loads((out_dir / WIRE_BYTES_FILE).read_text())["0"]
    exchanges, left = divmod(report["train"]["messages"], 4 * clients)
    assert set(report) == {"train"} and left == 0 and exchanges >= 3


def _compare(plain: dict[str, Any], secure: dict[str, Any], rel: float) -> None:
    chose, chose_securely = plain["report"]["select"], secure["report"]["select"]  # `select = best`
    assert chose_securely["kept"] == chose["kept"] and "secagg" in chose_securely
    for name in ("start", "final"):  # CH from Σ‖x‖² − Σ‖S‖²/n: quantisation costs ~1e-4 relative here
        assert chose_securely["scores"][name] == pytest.approx(chose["scores"][name], rel=max(rel, 2e-3))
    assert secure["report"]["cluster_sizes"] == plain["report"]["cluster_sizes"]
    assert secure["report"]["secagg"]["largest_rounding"] < 0.1  # counts rounded to the right integer
    assert secure["report"]["assigned_rows"] == plain["report"]["assigned_rows"]
    for key in ("inertia", "calinski_harabasz", "davies_bouldin", "simplified_silhouette"):
        got, want = secure["report"]["label_free"][key], plain["report"]["label_free"][key]
        assert got == pytest.approx(want, rel=rel), key


def test_ffcm_report_under_secagg_matches_the_plain_report(tmp_path: Path) -> None:
    keys = {"method": "ffcm", "dataset": "digits", "num-clients": 3, "num-rounds": 3, "seed": 0}
    keys["ffcm.init"] = "moments"  # what SecAgg+ forces; the plain run the same
    plain = _run(tmp_path / "plain", keys, secagg=False)
    secure = _run(tmp_path / "secure", keys, secagg=True)
    # the models differ by training's quantisation too (~1e-5), the report's sums by ~1e-2 absolute
    _compare(plain, secure, rel=1e-4)
    _report_went_through_secagg(tmp_path / "secure", 3)


@pytest.mark.usefixtures("text_embedding_cache")
def test_fstc_report_under_secagg_matches_the_plain_report(tmp_path: Path) -> None:
    keys = FSTC_SECURE_KEYS  # as tests/test_secagg.py: keeps the tiny run's training noise small
    plain = _run(tmp_path / "plain", keys, secagg=False)
    secure = _run(tmp_path / "secure", keys, secagg=True)
    _compare(plain, secure, rel=1e-3)
    assert secure["report"]["keywords"] == plain["report"]["keywords"]  # term counts: in the clear, exact
    _report_went_through_secagg(tmp_path / "secure", 2)

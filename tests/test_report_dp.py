"""The final report under differential privacy (issue #31): with `dp.report = noise` its statistics are
Gaussian releases of clipped records, counted in the accountant's plan; with `withhold` (the default)
nothing of the report leaves a client; noisy totals never crash the label-free metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Code, Context, EvaluateRes, RecordDict, Status

import fedapp.privacy.uplink
from clients.kfed import KFedClient
from fedapp.config.run import parse_run_config
from fedapp.launch.resolve import build_overrides
from fedapp.privacy.dp import (
    REPORT_RELEASES,
    STATE_KEY,
    PrivacyBudgetError,
    count_releases,
    distance_sensitivity,
    sum_count_sensitivity,
)
from fedapp.report.stages import NOISY_KEY, STAGE_ASSIGN, STAGE_DISTANCES, encode_noisy
from simulation.runner import execute
from strategies.kfed import KFedStrategy
from tests.flower_mocks import mock_proxy
from tests.run_checks import assert_ran_through

LLOYD = 5  # dp.lloyd-iters default


def _run(tmp_path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    keys = {"method": "kfed", "dataset": "digits", "num-clients": 3, "seed": 0, "dp.epsilon": 2.0}
    execute(build_overrides({**keys, **overrides}, tmp_path), engine="inprocess", quiet=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert_ran_through(summary, exit_code=None)
    return summary


class _Spy:
    def __init__(self, mechanism: Any) -> None:
        self.mechanism, self.calls = mechanism, []

    def __call__(self, statistics: list[np.ndarray], sensitivity: float, z: float, rng: Any) -> Any:
        self.calls.append(([np.array(s, dtype=np.float64) for s in statistics], sensitivity, z))
        return self.mechanism(statistics, sensitivity, z, rng)


def test_noisy_report_is_released_from_clipped_records_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(fedapp.privacy.uplink.gaussian_mechanism)  # the report releases through the client's uplink
    monkeypatch.setattr(fedapp.privacy.uplink, "gaussian_mechanism", spy)
    clip = 0.5
    summary = _run(tmp_path, {"dp.report": "noise", "dp.clip": clip})
    privacy = summary["privacy"]["dp"]
    assert privacy["planned_releases"] == LLOYD + REPORT_RELEASES == privacy["releases"]
    assert 0 < privacy["epsilon_spent"] <= privacy["epsilon_target"] == 2.0
    assert privacy["report"]["mode"] == "noise" and privacy["report"]["planned_releases"] == 2
    assert any("evaluation" in item for item in privacy["not_covered"])  # contingency tables: not covered
    # per client one (sizes, sums) release and one (distance sums, squared sums, silhouette) release
    stage_one = [c for c in spy.calls if c[1] == pytest.approx(sum_count_sensitivity(clip))]
    stage_two = [c for c in spy.calls if c[1] == pytest.approx(distance_sensitivity(clip))]
    assert len(stage_one) == len(stage_two) == 3 and len(spy.calls) == 6
    assert {round(z, 9) for _, _, z in spy.calls} == {round(privacy["noise_multiplier"], 9)}
    for (sizes, sums), _, _ in stage_one:  # each cluster's sum holds `size` records of norm <= clip
        assert (np.linalg.norm(sums, axis=1) <= clip * sizes + 1e-9).all() and sizes.sum() > 0
    for (distances, squared, _), _, _ in stage_two:  # clipped records, means projected into the ball
        assert (squared <= (2 * clip) ** 2 * 10_000).all() and (distances >= 0).all()
    report = summary["report"]
    assert report["noisy"] is True and report["assigned_rows"] == {}
    assert all(size >= 0 for size in report["cluster_sizes"])
    assert "label_free" in report and math.isfinite(report["label_free"]["inertia"])
    assert "keywords" not in report


def test_withheld_report_sends_nothing_and_costs_no_release(tmp_path: Path) -> None:
    summary = _run(tmp_path, {})  # dp.report = withhold by default
    privacy = summary["privacy"]["dp"]
    assert privacy["planned_releases"] == LLOYD == privacy["releases"]
    assert privacy["report"] == {**privacy["report"], "mode": "withhold", "planned_releases": 0}
    report = summary["report"]
    assert report["cluster_sizes"] is None and "label_free" not in report and report["assigned_rows"] == {}
    for node in range(3):  # the assignments are still written, on each node
        assert (tmp_path / "nodes" / str(node) / "assignments.csv").is_file()


def test_very_noisy_report_does_not_crash(tmp_path: Path) -> None:
    summary = _run(tmp_path, {"method": "ffcm", "num-rounds": 2, "dp.epsilon": 0.05, "dp.report": "noise"})
    report = summary["report"]
    assert report["noisy"] is True and all(size >= 0 for size in report["cluster_sizes"])


def test_strategy_clamps_nonsense_noisy_totals(tmp_path: Path) -> None:
    """Negative sizes, sums of empty clusters and negative distance sums: clamped, never an exception."""
    cfg = parse_run_config(
        {"method": "kfed", "dataset": "digits", "out-dir": str(tmp_path), "k": 3, "dp.epsilon": 1.0}
    )
    cfg = parse_run_config({**cfg.to_dict(), "dp.report": "noise"})
    strategy = KFedStrategy(cfg)
    sizes = [np.array([-4.0, 30.2, 0.4]), np.array([-3.0, 12.0, 9.9])]
    sums = [np.array([[5.0, -1.0], [3.0, 2.0], [9.0, 9.0]]), np.array([[1.0, 1.0], [-2.0, 0.5], [1.0, 1.0]])]
    results = [
        (mock_proxy(f"c{i}"), EvaluateRes(Status(Code.OK, ""), 0.0, 0, {"partition-id": i, NOISY_KEY: blob}))
        for i, blob in enumerate(encode_noisy(sizes=s, sums=m) for s, m in zip(sizes, sums, strict=True))
    ]
    assert strategy.final_report.aggregate(STAGE_ASSIGN, results, [])
    assert strategy.final_report.summary["cluster_sizes"] == [0, 42, 10]
    noisy = encode_noisy(
        distance_sums=np.array([3.0, -50.0, 2.0]),
        squared_sums=np.array([1.0, 8.0, -1.0]),
        silhouette_sum=99.0,
    )
    replies = [
        (mock_proxy(f"c{i}"), EvaluateRes(Status(Code.OK, ""), 0.0, 0, {"partition-id": i, NOISY_KEY: noisy}))
        for i in range(2)
    ]
    strategy.final_report.aggregate(STAGE_DISTANCES, replies, [])
    metrics = strategy.final_report.summary["label_free"]
    assert metrics["inertia"] == pytest.approx(16.0) and metrics["simplified_silhouette"] == pytest.approx(
        1.0
    )


def test_client_refuses_a_report_release_beyond_the_plan(tmp_path: Path) -> None:
    cfg = parse_run_config({"method": "kfed", "dataset": "digits", "num-clients": 3, "dp.epsilon": 2.0})
    cfg = parse_run_config({**cfg.to_dict(), "dp.report": "noise", "node-out-dir": str(tmp_path)})
    node = {"partition-id": 0, "num-partitions": 3}
    context = Context(run_id=0, node_id=1, node_config=node, state=RecordDict(), run_config={})
    client = KFedClient(context, cfg)
    centres = client.data.features[: client.k]
    count_releases(context.state, LLOYD, LLOYD)  # training spent its releases
    for _ in range(REPORT_RELEASES):
        client.evaluate([centres], {"report": STAGE_ASSIGN})
    assert context.state[STATE_KEY]["releases"] == LLOYD + REPORT_RELEASES
    with pytest.raises(PrivacyBudgetError):
        client.evaluate([centres], {"report": STAGE_ASSIGN})

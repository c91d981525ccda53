"""k-FED and FFCM strategies driven with hand-built client replies (no Ray, no network, no data)."""

import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import (
    Code,
    EvaluateRes,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

import strategies.roster
from fedapp.config.run import RunConfig, parse_run_config
from fedapp.metrics.contingency import clustering_metrics, encode_table
from fedapp.report.ledger import mapping_nbytes, parameters_nbytes
from strategies.base import MAX_EMPTY_ROUNDS
from strategies.ffcm import FFCMStrategy
from strategies.kfed import KFedStrategy
from strategies.replies import ClientReply, consistent_replies
from strategies.roster import FederationError
from tests.flower_mocks import mock_manager, mock_proxy

FitResult = tuple[ClientProxy, FitRes]

# Three well-separated groups in 2-D; every client's local centres lie near some of them.
TRUE_CENTRES = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
LOCAL_CENTRES = [
    np.array([[0.0, 0.2], [10.0, 0.4]]),
    np.array([[0.2, 0.0], [0.0, 10.0], [10.2, 0.0]]),
    np.array([[-0.2, 10.0], [9.8, -0.4], [-0.2, -0.2], [0.0, 10.3]]),
]


def _cfg(tmp_path: Path, **overrides: Any) -> RunConfig:
    """A valid run config writing into `tmp_path`; keyword names use '_' for Flower's '-'."""
    run_config = {"out-dir": str(tmp_path), "num-clients": 3, "k": 3}
    run_config.update({key.replace("_", "-"): value for key, value in overrides.items()})
    return parse_run_config(run_config)


def _fit_res(arrays: list[np.ndarray], metrics: dict[str, Any], num_examples: int = 10) -> FitRes:
    return FitRes(
        status=Status(Code.OK, ""),
        parameters=ndarrays_to_parameters(arrays),
        num_examples=num_examples,
        metrics=metrics,
    )


def _kfed_reply(cid: str, pid: int, centres: np.ndarray, k: int = 3, **metrics: Any) -> FitResult:
    """A well-formed k-FED reply: local centres and int64 counts."""
    counts = np.full(centres.shape[0], 5, dtype=np.int64)
    return mock_proxy(cid), _fit_res([centres, counts], {"partition-id": pid, "k": k, **metrics})


def _kfed_replies() -> list[FitResult]:
    # cids deliberately not in partition-id order
    return [_kfed_reply(cid, pid, c) for cid, pid, c in zip("zab", (0, 1, 2), LOCAL_CENTRES, strict=True)]


def _sorted_rows(array: np.ndarray) -> np.ndarray:
    """Rows in lexicographic order, for comparing centre sets regardless of their order."""
    return array[np.lexsort(array.T[::-1])]


def _centres(parameters: Parameters | None) -> np.ndarray:
    assert parameters is not None
    (centres,) = parameters_to_ndarrays(parameters)
    return centres


# --------------------------------------------------------------------------------------------- k-FED
def test_kfed_configure_fit_sends_local_centres_phase_to_every_client(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, **{"kfed.local-k": 4}))
    manager = mock_manager(["c", "a", "b"])
    instructions = strategy.configure_fit(1, strategy.initialize_parameters(manager), manager)
    assert [proxy.cid for proxy, _ in instructions] == ["a", "b", "c"]
    for _, ins in instructions:
        assert ins.config == {"server-round": 1, "k": 3, "phase": "local-centres", "local-k": 4}
        assert ins.parameters.tensors == []


def test_kfed_global_centres_are_kmeans_over_local_centres(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path))
    parameters, stats = strategy.aggregate_fit(1, _kfed_replies(), [])
    assert stats == {"accepted": 3, "rejected": 0, "failures": 0}
    union = np.concatenate(LOCAL_CENTRES)
    nearest = ((union[:, None, :] - TRUE_CENTRES[None]) ** 2).sum(-1).argmin(1)
    expected = np.array([union[nearest == j].mean(0) for j in range(3)])  # unweighted (Alg. 2)
    np.testing.assert_allclose(_sorted_rows(_centres(parameters)), _sorted_rows(expected), atol=1e-9)


def test_kfed_is_one_shot(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path))
    manager = mock_manager(["a", "b", "z"])
    parameters, _ = strategy.aggregate_fit(1, _kfed_replies(), [])
    assert strategy.finished and strategy.stop_reason == "one-shot"
    assert parameters is not None
    assert strategy.configure_fit(2, parameters, manager) == []
    # the final model is still evaluated exactly once
    assert len(strategy.configure_evaluate(1, parameters, manager)) == 3
    table = encode_table(np.array([[5, 0], [0, 5], [1, 1]]))
    results = [(mock_proxy("a"), EvaluateRes(Status(Code.OK, ""), 0.0, 12, {"table": table}))]
    strategy.aggregate_evaluate(1, results, [])
    assert strategy.configure_evaluate(2, parameters, manager) == []


# ---------------------------------------------------------------------------------------------- FFCM
def test_ffcm_round_one_is_mass_weighted_kmeans_over_local_centres(tmp_path: Path) -> None:
    strategy = FFCMStrategy(_cfg(tmp_path, method="ffcm", k=2))
    assert strategy.fit_config(1)["phase"] == "init"
    results = [
        (
            mock_proxy("a"),
            _fit_res([np.array([[0.0, 0.0], [10.0, 10.0]]), np.array([3.0, 1.0])], {"partition-id": 0}),
        ),
        (
            mock_proxy("b"),
            _fit_res([np.array([[2.0, 2.0], [12.0, 12.0]]), np.array([1.0, 3.0])], {"partition-id": 1}),
        ),
    ]
    parameters, stats = strategy.aggregate_fit(1, results, [])
    assert stats["accepted"] == 2
    expected = np.array([[0.5, 0.5], [11.5, 11.5]])  # (3*0 + 1*2)/4 and (1*10 + 3*12)/4
    np.testing.assert_allclose(_sorted_rows(_centres(parameters)), expected, atol=1e-9)
    assert strategy.centres is not None
    np.testing.assert_array_equal(strategy.centres, _centres(parameters))
    assert strategy.fit_config(2)["phase"] == "update"
    assert not strategy.finished


def _ffcm_after_init(tmp_path: Path, delta: float) -> FFCMStrategy:
    """An FFCM strategy whose global centres are [[0, 0], [10, 10]], as after round 1."""
    strategy = FFCMStrategy(_cfg(tmp_path, method="ffcm", k=2, **{"ffcm.delta": delta}))
    strategy.centres = np.array([[0.0, 0.0], [10.0, 10.0]])
    return strategy


def _sums_reply(cid: str, pid: int, sums: list[list[float]], mass: list[float]) -> FitResult:
    return mock_proxy(cid), _fit_res([np.array(sums), np.array(mass)], {"partition-id": pid, "k": 2})


def test_ffcm_update_is_sum_of_sums_over_sum_of_mass(tmp_path: Path) -> None:
    strategy = _ffcm_after_init(tmp_path, delta=0.01)
    results = [
        _sums_reply("a", 0, [[1.0, 2.0], [30.0, 30.0]], [2.0, 3.0]),
        _sums_reply("b", 1, [[3.0, 0.0], [10.0, 12.0]], [2.0, 1.0]),
    ]
    parameters, _ = strategy.aggregate_fit(2, results, [])
    # ([1, 2] + [3, 0]) / (2 + 2) and ([30, 30] + [10, 12]) / (3 + 1), exact in binary floating point
    np.testing.assert_array_equal(_centres(parameters), [[1.0, 0.5], [10.0, 10.5]])
    assert strategy.shifts == [pytest.approx(0.1)]  # max |change| 1 over max |old centre| 10
    assert not strategy.finished


@pytest.mark.parametrize(("delta", "stops"), [(0.1, True), (0.099, False)])
def test_ffcm_stops_when_relative_shift_at_most_delta(tmp_path: Path, delta: float, stops: bool) -> None:
    strategy = _ffcm_after_init(tmp_path, delta=delta)
    results = [_sums_reply("a", 0, [[4.0, 2.0], [40.0, 42.0]], [4.0, 4.0])]  # shift exactly 0.1
    strategy.aggregate_fit(2, results, [])
    assert strategy.finished is stops
    manager = mock_manager(["a", "b", "c"])
    instructions = strategy.configure_fit(3, ndarrays_to_parameters([strategy.centres]), manager)
    assert (instructions == []) is stops
    if stops:
        assert "delta" in strategy.stop_reason
        assert strategy.summary()["centre_shift_per_round"] == [pytest.approx(0.1)]


def test_ffcm_update_round_rejects_sums_of_the_wrong_shape(tmp_path: Path) -> None:
    strategy = _ffcm_after_init(tmp_path, delta=0.0)
    results = [
        _sums_reply("a", 0, [[1.0, 2.0], [30.0, 30.0]], [2.0, 3.0]),
        _sums_reply("b", 1, [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], [2.0, 3.0]),  # 3 features, not 2
        _sums_reply("c", 2, [[1.0, 2.0]], [2.0]),  # 1 cluster, not 2
    ]
    parameters, stats = strategy.aggregate_fit(2, results, [])
    assert stats == {"accepted": 1, "rejected": 2, "failures": 0}
    np.testing.assert_array_equal(_centres(parameters), [[0.5, 1.0], [10.0, 10.0]])


# ---------------------------------------------------------------------------------------- robustness
def test_a_client_failure_does_not_stop_the_round(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    strategy = KFedStrategy(_cfg(tmp_path))
    failed = _fit_res([], {})
    failed.status = Status(Code.FIT_NOT_IMPLEMENTED, "no fit")
    failures: list[FitResult | BaseException] = [RuntimeError("node lost"), (mock_proxy("q"), failed)]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(1, _kfed_replies()[:2], failures)
    assert stats == {"accepted": 2, "rejected": 0, "failures": 2}
    assert _centres(parameters).shape == (3, 2)
    assert "RuntimeError: node lost" in caplog.text
    assert "node q (partition-id unknown): FIT_NOT_IMPLEMENTED" in caplog.text


BAD_KFED_REPLIES: dict[str, tuple[list[np.ndarray], dict[str, Any], str]] = {
    "nan": ([np.array([[np.nan, 0.0]]), np.array([5])], {"partition-id": 3, "k": 3}, "NaN"),
    "inf": ([np.array([[np.inf, 0.0]]), np.array([5])], {"partition-id": 3, "k": 3}, "NaN or infinite"),
    "rank": ([np.zeros((1, 2, 1)), np.array([5])], {"partition-id": 3, "k": 3}, "shape"),
    "counts-rank": ([np.zeros((1, 2)), np.array([[5]])], {"partition-id": 3, "k": 3}, "shape"),
    "too-few-arrays": ([np.zeros((1, 2))], {"partition-id": 3, "k": 3}, "expected 2 arrays"),
    "too-many-arrays": (
        [np.zeros((1, 2)), np.array([5]), np.array([1])],
        {"partition-id": 3, "k": 3},
        "arrays",
    ),
    "int-centres": ([np.zeros((1, 2), dtype=np.int64), np.array([5])], {"partition-id": 3, "k": 3}, "dtype"),
    "float-counts": ([np.zeros((1, 2)), np.array([5.0])], {"partition-id": 3, "k": 3}, "dtype"),
    "counts-mismatch": ([np.zeros((2, 2)), np.array([5])], {"partition-id": 3, "k": 3}, "counts"),
    "negative-counts": ([np.zeros((1, 2)), np.array([-5])], {"partition-id": 3, "k": 3}, "counts"),
    "no-partition-id": ([np.zeros((1, 2)), np.array([5])], {"k": 3}, "partition-id"),
    "str-partition-id": ([np.zeros((1, 2)), np.array([5])], {"partition-id": "3", "k": 3}, "partition-id"),
    "other-k": ([np.zeros((1, 2)), np.array([5])], {"partition-id": 3, "k": 4}, "k=4"),
    "other-dimension": ([np.zeros((1, 5)), np.array([5])], {"partition-id": 3, "k": 3}, "dimension"),
}


@pytest.mark.parametrize(
    "case",
    sorted(BAD_KFED_REPLIES),
)
def test_a_malformed_reply_is_rejected_and_the_others_aggregated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    arrays, metrics, reason = BAD_KFED_REPLIES[case]
    bad = (mock_proxy("bad"), _fit_res(arrays, metrics))
    good = _kfed_replies()
    reference, _ = KFedStrategy(_cfg(tmp_path / "ref")).aggregate_fit(1, good, [])
    strategy = KFedStrategy(_cfg(tmp_path))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(1, [good[0], bad, *good[1:]], [])
    assert stats == {"accepted": 3, "rejected": 1, "failures": 0}
    # named: by the partition id its valid reply gave, else its node id (and the partition id it claims)
    assert (
        "node bad (" in caplog.text or "partition-id 3: reply rejected" in caplog.text
    ) and reason in caplog.text
    np.testing.assert_array_equal(_centres(parameters), _centres(reference))


def test_a_reply_of_another_dimension_is_left_out_of_round_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    arrays, metrics, _ = BAD_KFED_REPLIES["other-dimension"]
    good = _kfed_replies()
    reference, _ = KFedStrategy(_cfg(tmp_path / "ref")).aggregate_fit(1, good, [])
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, _ = KFedStrategy(_cfg(tmp_path)).aggregate_fit(
            1, [*good, (mock_proxy("bad"), _fit_res(arrays, metrics))], []
        )
    assert "client bad: dimension 5, others 2" in caplog.text
    np.testing.assert_array_equal(_centres(parameters), _centres(reference))


def test_the_majority_filter_does_not_depend_on_arrival_order() -> None:
    """Two shapes, two replies each: the smaller wins, whichever arrived first (CCFC once kept the first)."""
    replies = [ClientReply(str(i), i, [np.zeros((3, dim))], 3) for i, dim in enumerate((7, 5, 7, 5))]
    for order in (replies, replies[::-1]):
        kept = consistent_replies(order, server_round=1)
        assert sorted(reply.cid for reply in kept) == ["1", "3"]


def test_undecodable_parameters_are_rejected(tmp_path: Path) -> None:
    garbage = FitRes(
        status=Status(Code.OK, ""),
        parameters=Parameters(tensors=[b"not a numpy array"], tensor_type="numpy.ndarray"),
        num_examples=3,
        metrics={"partition-id": 3, "k": 3},
    )
    strategy = KFedStrategy(_cfg(tmp_path))
    parameters, stats = strategy.aggregate_fit(1, [*_kfed_replies(), (mock_proxy("bad"), garbage)], [])
    assert stats["rejected"] == 1 and parameters is not None


def test_all_replies_invalid_returns_none_and_retries(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path))
    results = [
        (mock_proxy("a"), _fit_res([np.array([[np.nan, 0.0]]), np.array([1])], {"partition-id": 0, "k": 3})),
        (mock_proxy("b"), _fit_res([np.zeros((1, 2))], {"partition-id": 1, "k": 3})),
    ]
    parameters, stats = strategy.aggregate_fit(1, results, [RuntimeError("lost")])
    assert parameters is None
    assert stats == {"accepted": 0, "rejected": 2, "failures": 1}
    assert not strategy.finished
    assert strategy.aggregate_fit(1, [], []) == (None, {"accepted": 0, "rejected": 0, "failures": 0})
    manager = mock_manager(["a", "b", "c"])
    assert len(strategy.configure_fit(2, ndarrays_to_parameters([]), manager)) == 3  # the round is retried


def test_ffcm_all_replies_invalid_keeps_the_centres(tmp_path: Path) -> None:
    strategy = _ffcm_after_init(tmp_path, delta=0.0)
    before = strategy.centres.copy()
    results = [_sums_reply("a", 0, [[np.nan, 0.0], [0.0, 0.0]], [1.0, 1.0])]
    assert strategy.aggregate_fit(2, results, [])[0] is None
    np.testing.assert_array_equal(strategy.centres, before)
    assert strategy.shifts == []


@pytest.mark.parametrize("strategy_class", [KFedStrategy, FFCMStrategy])
def test_reply_order_does_not_change_the_result(tmp_path: Path, strategy_class: type) -> None:
    replies = _kfed_replies()
    if strategy_class is FFCMStrategy:  # round 1 of FFCM: local centres + membership mass
        replies = [
            (proxy, _fit_res([c, np.linspace(1.0, 2.0, c.shape[0])], {"partition-id": p, "k": 3}))
            for (proxy, _), c, p in zip(replies, LOCAL_CENTRES, (0, 1, 2), strict=True)
        ]
    outcomes = []
    for order in itertools.permutations(replies):
        strategy = strategy_class(_cfg(tmp_path, method=strategy_class.method))
        parameters, _ = strategy.aggregate_fit(1, list(order), [])
        outcomes.append(_centres(parameters))
    for centres in outcomes[1:]:
        np.testing.assert_array_equal(centres, outcomes[0])


def test_unconfigured_k_does_not_depend_on_arrival_order(tmp_path: Path) -> None:
    odd = _kfed_reply("odd", 3, np.array([[0.0, 0.0], [5.0, 5.0], [9.0, 9.0], [1.0, 1.0]]), k=4)
    outcomes = []
    for order in ([*_kfed_replies(), odd], [odd, *_kfed_replies()]):
        strategy = KFedStrategy(_cfg(tmp_path, k=0))
        parameters, stats = strategy.aggregate_fit(1, order, [])
        outcomes.append((strategy.k, stats["accepted"], _centres(parameters)))
    assert outcomes[0][:2] == outcomes[1][:2] == (3, 3)
    np.testing.assert_array_equal(outcomes[0][2], outcomes[1][2])


def test_a_rejected_reply_does_not_set_k(tmp_path: Path) -> None:
    bad = (mock_proxy("bad"), _fit_res([np.zeros((2, 2)), np.array([5])], {"partition-id": 9, "k": 7}))
    strategy = KFedStrategy(_cfg(tmp_path, k=0))
    parameters, stats = strategy.aggregate_fit(1, [bad, *_kfed_replies()], [])
    assert stats == {"accepted": 3, "rejected": 1, "failures": 0}
    assert strategy.k == 3 and parameters is not None


def test_unconfigured_k_and_a_reply_without_k_is_rejected_not_a_crash(tmp_path: Path) -> None:
    reply = (mock_proxy("a"), _fit_res([np.zeros((2, 2)), np.array([1, 1])], {"partition-id": 0}))
    assert KFedStrategy(_cfg(tmp_path, k=0)).aggregate_fit(1, [reply], []) == (
        None,
        {"accepted": 0, "rejected": 1, "failures": 0},
    )


def test_unconfigured_k_is_taken_from_the_clients(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, k=0))
    assert "k" not in strategy.fit_config(1)
    parameters, _ = strategy.aggregate_fit(1, _kfed_replies(), [])
    assert strategy.k == 3 and _centres(parameters).shape == (3, 2)


# ---------------------------------------------------------------------------------------- evaluation
TABLES = [
    np.array([[8, 1, 0], [0, 6, 2]]),
    np.array([[3, 0, 1], [1, 9, 0]]),
    np.array([[0, 0, 7], [2, 1, 0]]),
]


def _eval_res(metrics: dict[str, Any], num_examples: int = 10) -> EvaluateRes:
    return EvaluateRes(status=Status(Code.OK, ""), loss=0.0, num_examples=num_examples, metrics=metrics)


def _eval_results(tables: list[np.ndarray] = TABLES) -> list[tuple[ClientProxy, EvaluateRes]]:
    return [
        (mock_proxy(f"c{i}"), _eval_res({"table": encode_table(t), "partition-id": i}))
        for i, t in enumerate(tables)
    ]


def test_configure_evaluate_sends_the_global_model_to_every_client(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path))
    manager = mock_manager(["b", "a", "c"])
    assert strategy.configure_evaluate(1, ndarrays_to_parameters([]), manager) == []  # nothing to evaluate
    parameters = ndarrays_to_parameters([TRUE_CENTRES])
    instructions = strategy.configure_evaluate(1, parameters, manager)
    assert [proxy.cid for proxy, _ in instructions] == ["a", "b", "c"]
    for _, ins in instructions:
        np.testing.assert_array_equal(parameters_to_ndarrays(ins.parameters)[0], TRUE_CENTRES)
        assert ins.config["server-round"] == 1


def test_aggregate_evaluate_scores_the_summed_table(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, k=2))
    loss, metrics = strategy.aggregate_evaluate(1, _eval_results(), [RuntimeError("lost")])
    assert loss is None
    assert metrics == clustering_metrics(sum(TABLES))
    assert strategy.final_metrics == metrics


MALFORMED_EVAL: dict[str, dict[str, Any]] = {
    "garbage-bytes": {"table": b"\x00garbage"},
    "truncated": {"table": encode_table(np.ones((2, 3), dtype=np.int64))[:-1]},
    "wrong-shape": {"table": encode_table(np.ones((3, 3), dtype=np.int64))},
    "missing": {"partition-id": 5},
    "not-bytes": {"table": "FCT1"},
}


@pytest.mark.parametrize("case", sorted(MALFORMED_EVAL))
def test_a_malformed_table_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, k=2))
    results = _eval_results()
    results.insert(2, (mock_proxy("c1x"), _eval_res(MALFORMED_EVAL[case])))  # sorts after a valid table
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, metrics = strategy.aggregate_evaluate(1, results, [])
    assert metrics == clustering_metrics(sum(TABLES))
    assert "c1x" in caplog.text


def test_no_valid_table_returns_empty_metrics(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, k=2))
    # a wrong-shaped table on its own is still a well-formed table, so it is left out here
    malformed = [metrics for case, metrics in MALFORMED_EVAL.items() if case != "wrong-shape"]
    results = [(mock_proxy(f"c{i}"), _eval_res(metrics)) for i, metrics in enumerate(malformed)]
    assert strategy.aggregate_evaluate(1, results, []) == (None, {})
    assert strategy.aggregate_evaluate(1, [], [RuntimeError("lost")]) == (None, {})
    assert strategy.record.history == [] and not (tmp_path / "summary.json").exists()


def test_a_wrong_shaped_table_from_the_first_client_is_the_one_skipped(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, k=2))
    wrong = (mock_proxy("a-first"), _eval_res({"table": encode_table(np.ones((3, 3), dtype=np.int64))}))
    _, metrics = strategy.aggregate_evaluate(1, [wrong, *_eval_results()], [])
    assert metrics == clustering_metrics(sum(TABLES))


def test_evaluation_writes_summary_rounds_and_plot(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, k=2))
    strategy.aggregate_fit(1, [_kfed_reply("a", 0, TRUE_CENTRES[:2], k=2)], [])
    strategy.aggregate_evaluate(1, _eval_results(), [])
    summary = json.loads((tmp_path / "summary.json").read_text())
    rounds = json.loads((tmp_path / "rounds.json").read_text())
    assert (tmp_path / "metrics.png").stat().st_size > 0
    expected = clustering_metrics(sum(TABLES))
    assert summary["metrics"] == pytest.approx(expected)
    assert summary["method"] == "kfed" and summary["rounds"] == 1 and summary["k"] == 2
    assert summary["stop_reason"] == "one-shot"
    assert summary["config"]["out-dir"] == str(tmp_path)
    assert [entry["round"] for entry in rounds] == [1]
    assert rounds[0]["metrics"] == pytest.approx(expected)
    assert rounds[0]["evaluated"] == int(sum(TABLES).sum())


# -------------------------------------------------------------------------------------------- ledger
def test_ledger_records_the_bytes_sent_and_received_per_client(tmp_path: Path) -> None:
    strategy = FFCMStrategy(_cfg(tmp_path, method="ffcm", k=2))
    strategy.centres = np.array([[0.0, 0.0], [10.0, 10.0]])
    manager = mock_manager(["a", "b", "c"])
    sent = strategy.configure_fit(2, ndarrays_to_parameters([strategy.centres]), manager)
    results = [
        _sums_reply("a", 0, [[1.0, 2.0], [30.0, 30.0]], [2.0, 3.0]),
        _sums_reply("b", 1, [[3.0, 0.0], [10.0, 12.0]], [2.0, 1.0]),
    ]
    parameters, _ = strategy.aggregate_fit(2, results, [RuntimeError("c lost")])
    evaluation = strategy.configure_evaluate(2, parameters, manager)
    received = [
        (proxy, _eval_res({"table": encode_table(TABLES[i][:2])})) for i, (proxy, _) in enumerate(results)
    ]
    strategy.aggregate_evaluate(2, received, [])

    rounds = strategy.record.ledger.rounds
    assert set(rounds) == {2} and set(rounds[2]) == {"a", "b", "c"}
    for proxy, ins in sent:
        assert rounds[2][proxy.cid]["fit"]["down"] == parameters_nbytes(ins.parameters) + mapping_nbytes(
            ins.config
        )
    for proxy, res in results:
        assert rounds[2][proxy.cid]["fit"]["up"] == parameters_nbytes(res.parameters) + mapping_nbytes(
            res.metrics
        )
    assert rounds[2]["c"]["fit"]["up"] == 0  # a failed client sent nothing we received
    for proxy, res in received:
        assert rounds[2][proxy.cid]["evaluate"]["up"] == mapping_nbytes(res.metrics)
    assert {p.cid: rounds[2][p.cid]["evaluate"]["down"] for p, _ in evaluation} == {
        p.cid: parameters_nbytes(ins.parameters) + mapping_nbytes(ins.config) for p, ins in evaluation
    }

    comm = json.loads((tmp_path / "summary.json").read_text())["comm_bytes"]
    fit_down = sum(parameters_nbytes(ins.parameters) + mapping_nbytes(ins.config) for _, ins in sent)
    fit_up = sum(parameters_nbytes(res.parameters) + mapping_nbytes(res.metrics) for _, res in results)
    eval_up = sum(mapping_nbytes(res.metrics) for _, res in received)
    assert (comm["down"], comm["up"], comm["eval_up"]) == (fit_down, fit_up, eval_up)
    # c failed in fit, so it is excluded from the run: only a and b evaluate
    assert [p.cid for p, _ in evaluation] == ["a", "b"]
    assert comm["eval_down"] == 2 * (parameters_nbytes(parameters) + mapping_nbytes({"server-round": 2}))
    assert comm["total_mb"] == pytest.approx((fit_up + fit_down) / 1e6)
    assert comm["per_round"]["2"] == {"up": fit_up + eval_up, "down": fit_down + comm["eval_down"]}


def test_ledger_counts_the_evaluation_config(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path))
    evaluation = strategy.configure_evaluate(
        1, ndarrays_to_parameters([TRUE_CENTRES]), mock_manager(["a", "b", "c"])
    )
    for proxy, ins in evaluation:
        expected = parameters_nbytes(ins.parameters) + mapping_nbytes(ins.config)
        assert strategy.record.ledger.rounds[1][proxy.cid]["evaluate"]["down"] == expected


# ------------------------------------------------------------------------------------ waiting clients
@pytest.mark.parametrize("phase", ["fit", "evaluate"])
def test_too_few_clients_is_a_federation_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    monkeypatch.setattr(strategies.roster, "CLIENT_WAIT_S", 0.1)
    strategy = KFedStrategy(_cfg(tmp_path, num_clients=3))
    manager = mock_manager(["a", "b"])
    configure = strategy.configure_fit if phase == "fit" else strategy.configure_evaluate
    with pytest.raises(FederationError, match=r"num-clients=3 but only 2 client\(s\) connected after 0.1 s"):
        configure(1, ndarrays_to_parameters([TRUE_CENTRES]), manager)


def test_extra_clients_are_used_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    strategy = KFedStrategy(_cfg(tmp_path, num_clients=2))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        instructions = strategy.configure_fit(1, ndarrays_to_parameters([]), mock_manager(["a", "b", "c"]))
    assert len(instructions) == 3
    assert "3 clients connected but num-clients=2" in caplog.text


# ------------------------------------------------------------------------------------ broken clients
def test_a_run_stops_after_consecutive_rounds_without_a_valid_reply(tmp_path: Path) -> None:
    """Clients that fail every round (e.g. a missing data file) end the run instead of idling."""
    strategy = FFCMStrategy(_cfg(tmp_path, method="ffcm"))
    manager = mock_manager(["a", "b", "c"])
    nan_reply = _fit_res([np.full((3, 2), np.nan), np.ones(3)], {"partition-id": 0, "k": 3})
    for server_round in range(1, MAX_EMPTY_ROUNDS + 1):
        assert strategy.configure_fit(server_round, ndarrays_to_parameters([]), manager)
        parameters, stats = strategy.aggregate_fit(
            server_round, [(mock_proxy("a"), nan_reply)], [RuntimeError("b down"), RuntimeError("c down")]
        )
        assert parameters is None and stats["accepted"] == 0
    assert strategy.finished and "consecutive" in strategy.stop_reason
    assert strategy.configure_fit(MAX_EMPTY_ROUNDS + 1, ndarrays_to_parameters([]), manager) == []
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metrics"] == {} and "consecutive" in summary["stop_reason"]


def test_one_valid_round_resets_the_empty_round_count(tmp_path: Path) -> None:
    strategy = KFedStrategy(_cfg(tmp_path))
    bad = _fit_res([np.full((3, 2), np.nan), np.ones(3, dtype=np.int64)], {"partition-id": 0, "k": 3})
    for server_round in range(1, MAX_EMPTY_ROUNDS):
        strategy.aggregate_fit(server_round, [(mock_proxy("a"), bad)], [])
    good = _fit_res([TRUE_CENTRES, np.ones(3, dtype=np.int64)], {"partition-id": 0, "k": 3})
    parameters, _ = strategy.aggregate_fit(MAX_EMPTY_ROUNDS, [(mock_proxy("a"), good)], [])
    assert parameters is not None and strategy.stop_reason == "one-shot"


# ------------------------------------------------------------------------ dropout-rate and eval-every
@pytest.mark.parametrize(("rate", "n_dropped"), [(0.0, 0), (0.3, 3), (0.5, 5), (0.99, 9)])
def test_dropout_rate_skips_a_seeded_fraction_of_clients(tmp_path: Path, rate: float, n_dropped: int) -> None:
    cids = [f"c{i}" for i in range(10)]
    strategy = FFCMStrategy(_cfg(tmp_path, method="ffcm", **{"dropout-rate": rate, "num-clients": 10}))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters([]), mock_manager(cids))
    asked = sorted(client.cid for client, _ in instructions)
    assert len(asked) == 10 - n_dropped  # at least one client always stays
    assert strategy.record.participation[1]["dropped"] == sorted(set(cids) - set(asked))
    again = FFCMStrategy(_cfg(tmp_path, method="ffcm", **{"dropout-rate": rate, "num-clients": 10}))
    same = again.configure_fit(1, ndarrays_to_parameters([]), mock_manager(cids))
    assert sorted(client.cid for client, _ in same) == asked  # same seed and round, same draw
    if n_dropped:
        later = again.configure_fit(2, ndarrays_to_parameters([]), mock_manager(cids))
        rounds = [asked, sorted(client.cid for client, _ in later)]
        assert len(rounds[1]) == len(asked)  # the fraction is fixed, the members change with the round
        draws = {
            tuple(
                sorted(
                    c.cid for c, _ in again.configure_fit(r, ndarrays_to_parameters([]), mock_manager(cids))
                )
            )
            for r in range(3, 9)
        }
        assert len(draws) > 1


@pytest.mark.parametrize(("eval_every", "evaluated"), [(1, [1, 2, 3, 4, 5]), (2, [2, 4, 5]), (10, [5])])
def test_eval_every_evaluates_on_its_cadence_and_after_the_last_round(
    tmp_path: Path, eval_every: int, evaluated: list[int]
) -> None:
    strategy = FFCMStrategy(_cfg(tmp_path, method="ffcm", **{"eval-every": eval_every, "num-rounds": 5}))
    manager = mock_manager(["a", "b", "c"])
    model = ndarrays_to_parameters([np.zeros((3, 2))])
    asked = [r for r in range(1, 6) if strategy.configure_evaluate(r, model, manager)]
    assert asked == evaluated
    strategy.finished = True  # a method that stops early is evaluated in the round it stops
    assert strategy.configure_evaluate(3, model, manager)


@pytest.mark.parametrize(("num_rounds", "interval"), [(1, 1), (10, 1), (11, 2), (50, 5), (1000, 100)])
def test_auto_eval_every_keeps_about_ten_evaluations(tmp_path: Path, num_rounds: int, interval: int) -> None:
    cfg = _cfg(tmp_path, method="ffcm", **{"num-rounds": num_rounds})
    assert cfg.eval_every == 0 and cfg.evaluation_interval == interval


# ------------------------------------------------------------------------------ waiting for clients
class _LateManager(SimpleClientManager):
    """Clients connect one at a time, each time the manager is asked how many there are."""

    def __init__(self, cids: list[str]) -> None:
        super().__init__()
        self.pending = list(cids)

    def num_available(self) -> int:
        if self.pending:
            self.register(mock_proxy(self.pending.pop(0)))
        return super().num_available()


def test_waiting_for_clients_returns_as_soon_as_they_are_there() -> None:
    manager = _LateManager(["a", "b", "c"])
    started = time.perf_counter()
    assert strategies.roster.wait_for_clients(manager, 3, timeout=30.0)
    assert time.perf_counter() - started < 1.0  # Flower's wait_for slept until its 5 s poll
    assert manager.num_available() == 3


def test_waiting_for_clients_that_never_come_gives_up_at_the_timeout() -> None:
    manager = mock_manager(["a"])
    started = time.perf_counter()
    assert not strategies.roster.wait_for_clients(manager, 2, timeout=0.3)
    assert 0.3 <= time.perf_counter() - started < 1.5


def test_the_wait_for_clients_is_booked_apart_from_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow_wait(manager: Any, wanted: int, timeout: float) -> bool:
        time.sleep(0.2)
        return True

    monkeypatch.setattr(strategies.roster, "wait_for_clients", slow_wait)
    strategy = KFedStrategy(_cfg(tmp_path))
    manager = mock_manager(["a", "b", "c"])
    strategy.configure_fit(1, strategy.initialize_parameters(manager), manager)
    record = strategy.record.timing[1]
    assert record["node_wait_s"] >= 0.2
    assert record["server_configure_s"] < 0.1  # the configure itself, without the wait

"""Vertical strategies (CeFMC, CeFMC-H, FedCMv, FedFCMv) with hand-built replies, then whole federations.

The first half drives each strategy with mocked client proxies and replies built from the clients' own
maths on small random views (no Ray, no network); the second half runs the real clients under the
in-process engine on `digits-mv` (and on HW when ../shared/data has it), then checks the vertical
configuration errors.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import (
    Code,
    Context,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    RecordDict,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from threadpoolctl import threadpool_limits

from clients.base import ClientConfigError
from clients.cefmc import CeFMCClient, client_round, client_round_full_representation, init_embedding
from clients.fedcmv import init_centroids, squared_distances
from fedapp.config.run import ConfigError, RunConfig, parse_run_config
from fedapp.datasets import resolve_data_dir
from fedapp.datasets.partition import PartitionError
from fedapp.launch.resolve import build_overrides, count_views
from fedapp.methods import METHODS
from fedapp.methods.fedcmv import choose_initial_samples
from fedapp.metrics.contingency import clustering_metrics, contingency_table, encode_table
from fedapp.wire import LABEL_HOLDER, label_dtype
from simulation.runner import execute
from strategies.cefmc import (
    CeFMCHStrategy,
    CeFMCStrategy,
    initialise_consensus,
    server_round,
    server_round_full,
    split_centroids,
)
from strategies.fedcmv import (
    FedCMvStrategy,
    FedFCMvStrategy,
    cmeans_objective,
    fuzzy_cmeans_objective,
    fuzzy_memberships,
)
from tests.flower_mocks import mock_manager, mock_proxy

FitResult = tuple[ClientProxy, FitRes]

N_SAMPLES, K = 30, 3
VIEW_DIMS = (5, 4, 6)
N_VIEWS = len(VIEW_DIMS)
TABLES = {name: spec.config_table for name, spec in METHODS.items()}
# view -> client id, deliberately not in cid order: the strategy must route by the reported partition-id
CID_OF_VIEW = {0: "n2", 1: "n0", 2: "n1"}
ORTHONORMAL_TOL = 1e-8
MONOTONE_RTOL = 1e-12  # round-off allowance when checking that an objective never moves the wrong way
HW_FILE = "hw/Handwritten.mat"


@pytest.fixture(autouse=True)
def _single_threaded_blas() -> Iterator[None]:
    """Tiny problems: on a shared 2-core machine, BLAS/OpenMP spin-waits cost more than the maths."""
    with threadpool_limits(limits=1):
        yield


def _make_views(n_samples: int = N_SAMPLES, k: int = K, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Gaussian clusters seen through `VIEW_DIMS`-dimensional views; returns (views, true labels)."""
    rng = np.random.default_rng(seed)
    truth = np.arange(n_samples) % k
    views = [rng.normal(scale=4.0, size=(k, d))[truth] + rng.normal(size=(n_samples, d)) for d in VIEW_DIMS]
    return views, truth


VIEWS, TRUTH = _make_views()
H0 = [init_embedding(X, K) for X in VIEWS]


# ------------------------------------------------------------------------------------------- helpers
def _cfg(tmp_path: Path, method: str = "cefmc", **overrides: Any) -> RunConfig:
    """A valid vertical run config writing into `tmp_path`; keyword names use '_' for Flower's '-'."""
    run_config = {
        "method": method,
        "dataset": "digits-mv",
        "out-dir": str(tmp_path),
        "num-clients": N_VIEWS,
        "k": K,
    }
    run_config.update({key.replace("_", "-"): value for key, value in overrides.items()})
    return parse_run_config(run_config)


def _manager(cids: list[str] | None = None) -> SimpleClientManager:
    return mock_manager(cids if cids is not None else sorted(CID_OF_VIEW.values()))


def _fit_res(arrays: list[np.ndarray], metrics: dict[str, Any], num_examples: int = N_SAMPLES) -> FitRes:
    return FitRes(
        status=Status(Code.OK, ""),
        parameters=ndarrays_to_parameters(arrays),
        num_examples=num_examples,
        metrics=metrics,
    )


def _reply(view: int, arrays: list[np.ndarray], k: int = K, **metrics: Any) -> FitResult:
    """The reply of the client holding `view`, with its identity metrics."""
    return mock_proxy(CID_OF_VIEW[view]), _fit_res(arrays, {"partition-id": view, "k": k, **metrics})


def _init_replies(H_views: list[np.ndarray] = H0, k: int = K) -> list[FitResult]:
    """Round-1 CeFMC replies: every view's H_v^(0)."""
    return [_reply(v, [H], k) for v, H in enumerate(H_views)]


def _decoded(parameters: Parameters | None) -> list[np.ndarray]:
    assert parameters is not None
    return parameters_to_ndarrays(parameters)


def _initialised(
    tmp_path: Path, strategy_class: type[CeFMCStrategy] = CeFMCStrategy, **overrides: Any
) -> CeFMCStrategy:
    """A CeFMC(-H) strategy after a complete round 1 (configure_fit + aggregate_fit)."""
    strategy = strategy_class(_cfg(tmp_path, method=strategy_class.method, **overrides))
    manager = _manager()
    strategy.configure_fit(1, strategy.initialize_parameters(manager), manager)
    parameters, stats = strategy.aggregate_fit(1, _init_replies(), [])
    assert parameters is not None and stats["accepted"] == N_VIEWS
    return strategy


def _label_replies(strategy: CeFMCStrategy) -> tuple[list[FitResult], list[np.ndarray], list[float]]:
    """An update round as real CeFMC clients would answer it right after initialisation (Alg. 2).

    Returns (replies, y_v per view, obj_v per view).
    """
    assert strategy.y is not None and strategy.C is not None
    segments = split_centroids(strategy.C, N_VIEWS)
    replies, labels, objectives = [], [], []
    for v, X in enumerate(VIEWS):
        _, y_v, objective = client_round(
            X, H0[v], strategy.y, strategy.C_views[v], strategy.y, segments[v], lam=1.0, beta=1.0
        )
        replies.append(_reply(v, [y_v.astype(label_dtype(K))], objective=objective))
        labels.append(y_v)
        objectives.append(objective)
    return replies, labels, objectives


def _fixed_label_replies(objective: float) -> list[FitResult]:
    """Update-round replies with each view's labels = the true classes and the given obj_v."""
    return [_reply(v, [TRUTH.astype(np.uint8)], objective=objective) for v in range(N_VIEWS)]


def _eval_res(table: np.ndarray, view: int = LABEL_HOLDER) -> EvaluateRes:
    metrics = {"table": encode_table(table), "partition-id": view, "k": K}
    return EvaluateRes(status=Status(Code.OK, ""), loss=0.0, num_examples=int(table.sum()), metrics=metrics)


def _assert_monotone(objectives: list[float], increasing: bool) -> None:
    """Non-decreasing (`increasing`) or non-increasing objective, up to round-off."""
    steps = np.diff(objectives) * (1.0 if increasing else -1.0)
    allowance = MONOTONE_RTOL * np.abs(np.asarray(objectives[1:]))
    assert np.all(steps >= -allowance), f"objective moved the wrong way: {objectives}"


def _assert_orthonormal(H: np.ndarray) -> None:
    np.testing.assert_allclose(H.T @ H, np.eye(H.shape[1]), atol=ORTHONORMAL_TOL, rtol=0)


# ------------------------------------------------------------------------------------ CeFMC: round 1
def test_round_one_sends_the_same_empty_init_instruction_to_every_client(tmp_path: Path) -> None:
    keys = {
        "cefmc.lambda": 0.5,
        "cefmc.beta": 2.0,
        "cefmc.mm-factor": 1.5,
        "cefmc.h-iters": 3,
        "cefmc.pad": "random",
    }
    strategy = CeFMCStrategy(_cfg(tmp_path, **keys))
    manager = _manager(["n2", "n0", "n1"])
    instructions = strategy.configure_fit(1, strategy.initialize_parameters(manager), manager)
    assert [proxy.cid for proxy, _ in instructions] == ["n0", "n1", "n2"]
    expected_config = {
        "server-round": 1,
        "k": K,
        "phase": "init",
        "lambda": 0.5,
        "beta": 2.0,
        "mm-factor": 1.5,
        "h-iters": 3,
        "pad": "random",
    }
    for _, ins in instructions:
        assert ins.parameters.tensors == []
        assert ins.config == expected_config


def test_beta_defaults_to_lambda_in_the_instructions(tmp_path: Path) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path, **{"cefmc.lambda": 0.25}))
    assert strategy.fit_config(1)["beta"] == 0.25


def test_round_one_builds_y_and_orthonormal_centroids_from_the_representations(tmp_path: Path) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    parameters, stats = strategy.aggregate_fit(1, _init_replies(), [])
    assert stats == {"accepted": N_VIEWS, "rejected": 0, "failures": 0}
    expected_y, expected_C = initialise_consensus(H0, K, seed=0)
    (labels,) = _decoded(parameters)
    assert labels.dtype == label_dtype(K) == np.uint8
    np.testing.assert_array_equal(labels, expected_y)
    np.testing.assert_array_equal(strategy.y, expected_y)
    np.testing.assert_allclose(strategy.C, expected_C, atol=1e-12)
    assert strategy.C.shape == (K, N_VIEWS * K)
    np.testing.assert_allclose(strategy.C @ strategy.C.T, np.eye(K), atol=1e-10)
    assert len(strategy.C_views) == N_VIEWS
    for kept, segment in zip(strategy.C_views, np.hsplit(strategy.C, N_VIEWS), strict=True):
        np.testing.assert_array_equal(kept, segment)
    assert strategy.objectives == [] and not strategy.finished
    assert strategy.fit_config(2)["phase"] == "update"
    # well-separated clusters: the consensus recovers the classes
    assert clustering_metrics(contingency_table(labels.astype(np.int64), TRUTH, K, K))["acc"] == 1.0


def test_round_one_does_not_depend_on_arrival_order(tmp_path: Path) -> None:
    outcomes = []
    for order in itertools.permutations(_init_replies()):
        strategy = CeFMCStrategy(_cfg(tmp_path))
        parameters, _ = strategy.aggregate_fit(1, list(order), [])
        outcomes.append((_decoded(parameters)[0], strategy.C))
    for labels, C in outcomes[1:]:
        np.testing.assert_array_equal(labels, outcomes[0][0])
        np.testing.assert_array_equal(C, outcomes[0][1])


def test_labels_travel_in_uint16_when_k_exceeds_256(tmp_path: Path) -> None:
    n_samples, k = 300, 257
    rng = np.random.default_rng(1)
    H_views = [np.linalg.qr(rng.normal(size=(n_samples, k)))[0] for _ in range(N_VIEWS)]
    strategy = CeFMCStrategy(_cfg(tmp_path, k=k))
    parameters, _ = strategy.aggregate_fit(1, _init_replies(H_views, k), [])
    (labels,) = _decoded(parameters)
    assert labels.dtype == label_dtype(k) == np.uint16 and labels.shape == (n_samples,)


# ------------------------------------------------------------------------- CeFMC: per-view routing
def test_round_two_sends_each_client_y_and_its_own_views_segment(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path)
    instructions = strategy.configure_fit(2, ndarrays_to_parameters([strategy.y]), _manager())
    assert sorted(proxy.cid for proxy, _ in instructions) == sorted(CID_OF_VIEW.values())
    view_of = {cid: view for view, cid in CID_OF_VIEW.items()}
    segments = np.hsplit(strategy.C, N_VIEWS)
    for proxy, ins in instructions:
        y, C_bar = parameters_to_ndarrays(ins.parameters)
        assert y.dtype == np.uint8
        np.testing.assert_array_equal(y, strategy.y)
        np.testing.assert_array_equal(C_bar, segments[view_of[proxy.cid]])
        assert C_bar.shape == (K, K)
        assert ins.config["phase"] == "update" and ins.config["server-round"] == 2


def test_a_client_that_missed_round_one_gets_no_instruction(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = _initialised(tmp_path)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        instructions = strategy.configure_fit(
            2, ndarrays_to_parameters([]), _manager(["n0", "n1", "n2", "late"])
        )
    assert sorted(proxy.cid for proxy, _ in instructions) == ["n0", "n1", "n2"]
    assert "client late holds no known view" in caplog.text


def test_update_round_is_server_round_of_the_views_labels(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path)
    C_before = strategy.C.copy()
    replies, labels, objectives = _label_replies(strategy)
    parameters, stats = strategy.aggregate_fit(2, replies, [])
    assert stats == {"accepted": N_VIEWS, "rejected": 0, "failures": 0}
    expected_y, expected_C, expected_objective = server_round(
        labels, objectives, strategy.C_views, C_before, beta=1.0
    )
    (y,) = _decoded(parameters)
    assert y.dtype == np.uint8
    np.testing.assert_array_equal(y, expected_y)
    np.testing.assert_allclose(strategy.C, expected_C, atol=1e-12)
    assert strategy.objectives == [pytest.approx(expected_objective, rel=1e-12)]
    # the fixed C_v (Eq. 24) never change after initialisation
    for kept, segment in zip(strategy.C_views, np.hsplit(C_before, N_VIEWS), strict=True):
        np.testing.assert_array_equal(kept, segment)


def test_shuffled_update_replies_give_the_same_result(tmp_path: Path) -> None:
    outcomes = []
    for index, order in enumerate(itertools.permutations(range(N_VIEWS))):
        strategy = _initialised(tmp_path / str(index))
        replies, _, _ = _label_replies(strategy)
        parameters, _ = strategy.aggregate_fit(2, [replies[v] for v in order], [])
        outcomes.append((_decoded(parameters)[0], strategy.C, strategy.objectives))
    for y, C, objectives in outcomes[1:]:
        np.testing.assert_array_equal(y, outcomes[0][0])
        np.testing.assert_array_equal(C, outcomes[0][1])
        assert objectives == outcomes[0][2]


def test_wire_label_dtype_does_not_change_the_update_for_many_clusters(tmp_path: Path) -> None:
    n_samples, k = 60, 20
    rng = np.random.default_rng(2)
    H_views = [np.linalg.qr(rng.normal(size=(n_samples, k)))[0] for _ in range(N_VIEWS)]
    labels = [rng.integers(0, k, n_samples) for _ in range(N_VIEWS)]
    outcomes = []
    for dtype in (np.int64, label_dtype(k)):  # what the maths expects vs what the clients send (uint8)
        strategy = CeFMCStrategy(_cfg(tmp_path / np.dtype(dtype).name, k=k))
        strategy.aggregate_fit(1, _init_replies(H_views, k), [])
        replies = [_reply(v, [y.astype(dtype)], k, objective=1.0) for v, y in enumerate(labels)]
        strategy.aggregate_fit(2, replies, [])
        outcomes.append((strategy.y, strategy.C, strategy.objectives))
    np.testing.assert_array_equal(outcomes[1][0], outcomes[0][0])
    np.testing.assert_allclose(outcomes[1][1], outcomes[0][1], atol=1e-10)
    assert outcomes[1][2] == pytest.approx(outcomes[0][2], rel=1e-12)


# ---------------------------------------------------------------------------------- CeFMC: stopping
@pytest.mark.parametrize(("later_objective", "stops"), [(1e6, True), (1.1e6, False)])
def test_stops_when_the_relative_objective_change_is_at_most_delta(
    tmp_path: Path, later_objective: float, stops: bool
) -> None:
    # obj_v = 1e6 dwarfs the label-integration term (at most N V = 90), so the total moves by < 1e-4
    strategy = _initialised(tmp_path, **{"cefmc.delta": 1e-3})
    manager = _manager()
    strategy.aggregate_fit(2, _fixed_label_replies(1e6), [])
    assert not strategy.finished  # never on the first objective
    parameters, _ = strategy.aggregate_fit(3, _fixed_label_replies(later_objective), [])
    assert strategy.finished is stops
    assert len(strategy.objectives) == 2
    instructions = strategy.configure_fit(4, parameters, manager)
    assert (instructions == []) is stops
    if not stops:
        return
    assert "delta" in strategy.stop_reason
    # the converged model is evaluated exactly once more, then never again
    (holder, _), *others = strategy.configure_evaluate(3, parameters, manager)
    assert others == [] and holder.cid == CID_OF_VIEW[LABEL_HOLDER]
    table = contingency_table(strategy.y, TRUTH, K, K)
    strategy.aggregate_evaluate(3, [(holder, _eval_res(table))], [])
    assert strategy.configure_evaluate(4, parameters, manager) == []
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["objective_per_round"] == pytest.approx(strategy.objectives, rel=1e-15)
    assert summary["rounds"] == 3 and "delta" in summary["stop_reason"]
    assert summary["metrics"] == pytest.approx(clustering_metrics(table))


# ---------------------------------------------------------------------------- CeFMC: failed clients
def _missing_view_failures(case: str, view: int) -> list[FitResult | BaseException]:
    """How a missing reply shows up: an exception, a non-OK status, or nothing at all."""
    if case == "exception":
        return [RuntimeError("node lost")]
    if case == "status":
        failed = _fit_res([], {})
        failed.status = Status(Code.FIT_NOT_IMPLEMENTED, "fit failed")
        return [(mock_proxy(CID_OF_VIEW[view]), failed)]
    return []


@pytest.mark.parametrize("case", ["exception", "status", "silent"])
def test_a_view_missing_in_round_one_skips_the_round_and_it_is_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    manager = _manager()
    replies = _init_replies()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(
            1, [replies[0], replies[2]], _missing_view_failures(case, 1)
        )
    assert parameters is None and stats["accepted"] == 0
    assert "views [1] of 3 missing: the initialisation needs every view" in caplog.text
    assert strategy.y is None and strategy.C is None and strategy.C_views == []
    # round 2 repeats the initialisation for everyone, and then succeeds
    instructions = strategy.configure_fit(2, strategy.initialize_parameters(manager), manager)
    assert len(instructions) == N_VIEWS
    assert all(ins.config["phase"] == "init" and ins.parameters.tensors == [] for _, ins in instructions)
    parameters, _ = strategy.aggregate_fit(2, replies, [])
    np.testing.assert_array_equal(_decoded(parameters)[0], initialise_consensus(H0, K, seed=0)[0])


@pytest.mark.parametrize("case", ["exception", "status", "silent"])
def test_a_view_missing_in_an_update_round_keeps_the_server_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    strategy = _initialised(tmp_path)
    reference = _initialised(tmp_path / "reference")
    y_before, C_before = strategy.y.copy(), strategy.C.copy()
    replies, _, _ = _label_replies(strategy)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(2, replies[1:], _missing_view_failures(case, 0))
    assert parameters is None and stats["accepted"] == 0
    assert f"views [{LABEL_HOLDER}] have not replied to an update round yet" in caplog.text
    np.testing.assert_array_equal(strategy.y, y_before)
    np.testing.assert_array_equal(strategy.C, C_before)
    assert strategy.objectives == [] and not strategy.finished
    # the next complete round is exactly the round that would have happened without the failure
    instructions = strategy.configure_fit(3, ndarrays_to_parameters([]), _manager())
    assert len(instructions) == N_VIEWS
    parameters, _ = strategy.aggregate_fit(3, replies, [])
    expected, _ = reference.aggregate_fit(2, replies, [])
    np.testing.assert_array_equal(_decoded(parameters)[0], _decoded(expected)[0])
    np.testing.assert_array_equal(strategy.C, reference.C)
    assert strategy.objectives == reference.objectives


def test_a_view_missing_after_it_has_replied_stands_in_with_its_last_labels(tmp_path: Path) -> None:
    """The dropout policy of vertical methods: the server goes on with the missing view's last reply."""
    strategy = _initialised(tmp_path)
    reference = _initialised(tmp_path / "reference")
    replies, _, _ = _label_replies(strategy)
    for server in (strategy, reference):
        server.aggregate_fit(2, replies, [])
    replies_3, _, _ = _label_replies(strategy)
    stale = [replies[0], *replies_3[1:]]  # view 0 is missing in round 3: its round-2 reply stands in
    parameters, stats = strategy.aggregate_fit(3, replies_3[1:], [])
    expected, _ = reference.aggregate_fit(3, stale, [])
    assert stats["accepted"] == N_VIEWS - 1 and strategy.stale_views == {3: [0]}
    np.testing.assert_array_equal(_decoded(parameters)[0], _decoded(expected)[0])
    assert strategy.objectives == reference.objectives


# ------------------------------------------------------------------------------ CeFMC: bad replies
def _with_replaced(
    replies: list[FitResult], view: int, arrays: list[np.ndarray], **metrics: Any
) -> list[FitResult]:
    """`replies` with view `view`'s reply replaced by one carrying `arrays` and `metrics`."""
    out = list(replies)
    out[view] = _reply(view, arrays, **metrics)
    return out


def test_nan_in_a_representation_is_rejected_and_the_round_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    poisoned = H0[1].copy()
    poisoned[3, 1] = np.nan
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(1, _with_replaced(_init_replies(), 1, [poisoned]), [])
    assert parameters is None and stats["rejected"] == 1
    assert "NaN" in caplog.text and "views [1] of 3 missing" in caplog.text
    assert strategy.C is None


@pytest.mark.parametrize(
    ("name", "arrays"),
    [
        ("too-many-rows", [np.vstack([H0[2], H0[2][:1]])]),
        ("wrong-k", [np.hstack([H0[2], H0[2][:, :1]])]),
        ("labels-instead", [np.zeros(N_SAMPLES, dtype=np.uint8)]),
        ("two-arrays", [H0[2], H0[2]]),
    ],
)
def test_a_malformed_init_reply_is_rejected_without_crashing(
    tmp_path: Path, name: str, arrays: list[np.ndarray]
) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    parameters, stats = strategy.aggregate_fit(1, _with_replaced(_init_replies(), 2, arrays), [])
    assert parameters is None and stats["rejected"] == 1 and stats["accepted"] == 0
    assert strategy.C is None and strategy.n_samples is None
    parameters, _ = strategy.aggregate_fit(2, _init_replies(), [])  # the next clean round initialises
    assert _decoded(parameters)[0].shape == (N_SAMPLES,)


BAD_UPDATE_REPLIES: dict[str, tuple[list[np.ndarray], dict[str, Any], str]] = {
    "label-equal-to-k": ([np.full(N_SAMPLES, K, dtype=np.uint8)], {"objective": 1.0}, "labels outside"),
    "negative-label": ([np.full(N_SAMPLES, -1, dtype=np.int64)], {"objective": 1.0}, "labels outside"),
    "wrong-n": ([np.zeros(N_SAMPLES + 1, dtype=np.uint8)], {"objective": 1.0}, "shape"),
    "float-labels": ([np.zeros(N_SAMPLES)], {"objective": 1.0}, "dtype"),
    "representation": ([H0[1]], {"objective": 1.0}, "shape"),
    "no-objective": ([np.zeros(N_SAMPLES, dtype=np.uint8)], {}, "objective"),
    "str-objective": ([np.zeros(N_SAMPLES, dtype=np.uint8)], {"objective": "1.0"}, "objective"),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATE_REPLIES))
def test_a_malformed_update_reply_is_rejected_and_the_state_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    arrays, metrics, reason = BAD_UPDATE_REPLIES[case]
    strategy = _initialised(tmp_path)
    y_before, C_before = strategy.y.copy(), strategy.C.copy()
    replies, _, _ = _label_replies(strategy)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(2, _with_replaced(replies, 1, arrays, **metrics), [])
    assert parameters is None and stats["rejected"] == 1
    assert "partition-id 1: reply rejected" in caplog.text and reason in caplog.text
    assert "views [1] have not replied to an update round yet" in caplog.text
    np.testing.assert_array_equal(strategy.y, y_before)
    np.testing.assert_array_equal(strategy.C, C_before)
    assert strategy.objectives == []


@pytest.mark.parametrize("bad_objective", [float("nan"), float("inf")])
def test_a_non_finite_objective_is_rejected(tmp_path: Path, bad_objective: float) -> None:
    strategy = _initialised(tmp_path)
    replies, _, _ = _label_replies(strategy)
    labels = _decoded(replies[1][1].parameters)
    parameters, stats = strategy.aggregate_fit(
        2, _with_replaced(replies, 1, labels, objective=bad_objective), []
    )
    assert stats["rejected"] == 1 and parameters is None
    assert strategy.objectives == []


def test_a_duplicate_view_is_ignored_and_the_round_proceeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    duplicate = (mock_proxy("n9"), _fit_res([H0[2]], {"partition-id": 0, "k": K}))  # claims view 0 too
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(1, [duplicate, *_init_replies()], [])
    assert "two replies for view 0; keeping client n2" in caplog.text
    assert stats["accepted"] == N_VIEWS + 1
    np.testing.assert_array_equal(_decoded(parameters)[0], initialise_consensus(H0, K, seed=0)[0])


def test_a_duplicate_view_that_hides_another_skips_the_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    replies = _init_replies()
    replies[1] = (mock_proxy(CID_OF_VIEW[1]), _fit_res([H0[1]], {"partition-id": 0, "k": K}))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, _ = strategy.aggregate_fit(1, replies, [])
    assert parameters is None and strategy.C is None
    assert "views [1] of 3 missing: the initialisation needs every view" in caplog.text


def test_a_reply_for_an_unknown_view_is_rejected_not_blocking(tmp_path: Path) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    bogus = (mock_proxy("n9"), _fit_res([H0[0]], {"partition-id": N_VIEWS + 2, "k": K}))
    parameters, stats = strategy.aggregate_fit(1, [*_init_replies(), bogus], [])
    assert parameters is not None and strategy.C is not None
    assert stats["rejected"] == 1


def test_a_client_claiming_an_unknown_view_never_crashes_configure_fit(tmp_path: Path) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    bogus = (mock_proxy("n9"), _fit_res([H0[0]], {"partition-id": N_VIEWS + 2, "k": K}))
    strategy.aggregate_fit(1, [*_init_replies(), bogus], [])
    strategy.aggregate_fit(2, _init_replies(), [])  # n9 is gone for a round: the initialisation succeeds
    assert strategy.C is not None
    instructions = strategy.configure_fit(3, ndarrays_to_parameters([]), _manager(["n0", "n1", "n2", "n9"]))
    assert sorted(proxy.cid for proxy, _ in instructions) == ["n0", "n1", "n2"]


# --------------------------------------------------------------------------------- CeFMC: evaluation
def test_only_the_label_holder_evaluates_the_consensus_labels(tmp_path: Path) -> None:
    strategy = CeFMCStrategy(_cfg(tmp_path))
    manager = _manager()
    assert strategy.configure_evaluate(1, strategy.initialize_parameters(manager), manager) == []
    parameters, _ = strategy.aggregate_fit(1, _init_replies(), [])
    instructions = strategy.configure_evaluate(1, parameters, manager)
    assert [proxy.cid for proxy, _ in instructions] == [CID_OF_VIEW[LABEL_HOLDER]]
    (labels,) = parameters_to_ndarrays(instructions[0][1].parameters)
    np.testing.assert_array_equal(labels, strategy.y)
    # the label holder answers with its (cluster x class) table; the server scores exactly that table
    table = contingency_table(labels.astype(np.int64), (TRUTH + 1) % K, K, K)
    loss, metrics = strategy.aggregate_evaluate(1, [(instructions[0][0], _eval_res(table))], [])
    assert loss is None
    assert metrics == clustering_metrics(table)
    assert strategy.final_metrics == metrics
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metrics"] == pytest.approx(metrics)
    assert summary["comm_bytes"]["eval_down"] > 0 and summary["comm_bytes"]["eval_up"] > 0


# ------------------------------------------------------------------------------------------ CeFMC-H
def test_cefmc_h_update_aggregates_the_representations_with_server_round_full(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path, CeFMCHStrategy)
    C_before = strategy.C.copy()
    segments = split_centroids(C_before, N_VIEWS)
    instructions = strategy.configure_fit(2, ndarrays_to_parameters([]), _manager())
    view_of = {cid: view for view, cid in CID_OF_VIEW.items()}
    for proxy, ins in instructions:
        y, C_bar = parameters_to_ndarrays(ins.parameters)
        np.testing.assert_array_equal(y, strategy.y)
        np.testing.assert_array_equal(C_bar, segments[view_of[proxy.cid]])
    H_views, objectives, replies = [], [], []
    for v, X in enumerate(VIEWS):
        H, objective = client_round_full_representation(X, H0[v], strategy.y, segments[v], beta=1.0)
        H_views.append(H)
        objectives.append(objective)
        replies.append(_reply(v, [H], objective=objective))
    parameters, stats = strategy.aggregate_fit(2, replies[::-1], [])
    assert stats["accepted"] == N_VIEWS
    expected_y, expected_C, expected_objective = server_round_full(H_views, objectives, C_before, beta=1.0)
    np.testing.assert_array_equal(_decoded(parameters)[0], expected_y)
    np.testing.assert_allclose(strategy.C, expected_C, atol=1e-12)
    assert strategy.objectives == [pytest.approx(expected_objective, rel=1e-12)]


def test_cefmc_h_rejects_label_replies_in_update_rounds(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path, CeFMCHStrategy)
    replies, _, _ = _label_replies(strategy)  # what plain CeFMC clients would send
    parameters, stats = strategy.aggregate_fit(2, replies, [])
    assert parameters is None and stats["rejected"] == N_VIEWS


# ---------------------------------------------------------------------------------- FedCMv / FedFCMv
def _partial_distances(scale: float = 1.0) -> list[np.ndarray]:
    """Each view's N x k partial squared distances to the seeded initial centroids (x `scale`)."""
    samples = choose_initial_samples(N_SAMPLES, K, seed=0)
    return [scale * squared_distances(X, init_centroids(X, samples)) for X in VIEWS]


def _distance_replies(distances: list[np.ndarray]) -> list[FitResult]:
    return [_reply(v, [d]) for v, d in enumerate(distances)]


@pytest.fixture(params=[FedCMvStrategy, FedFCMvStrategy], ids=["fedcmv", "fedfcmv"])
def fedcmv_strategy(request: pytest.FixtureRequest, tmp_path: Path) -> FedCMvStrategy:
    """A fresh FedCMv (hard labels) or FedFCMv (fuzzy memberships) strategy."""
    strategy_class: type[FedCMvStrategy] = request.param
    return strategy_class(_cfg(tmp_path, method=strategy_class.method))


def test_fedcmv_round_one_labels_are_argmin_of_summed_distances(fedcmv_strategy: FedCMvStrategy) -> None:
    strategy = fedcmv_strategy
    manager = _manager()
    instructions = strategy.configure_fit(1, strategy.initialize_parameters(manager), manager)
    assert len(instructions) == N_VIEWS
    for _, ins in instructions:
        assert ins.parameters.tensors == [] and ins.config["phase"] == "init"
        assert ins.config.get("fuzziness") == strategy.fuzzifier
    distances = _partial_distances()
    total = np.sum(distances, axis=0)
    parameters, stats = strategy.aggregate_fit(1, _distance_replies(distances)[::-1], [])
    assert stats["accepted"] == N_VIEWS
    (labels,) = _decoded(parameters)
    assert labels.dtype == np.uint8
    if type(strategy) is FedCMvStrategy:
        np.testing.assert_array_equal(labels, total.argmin(axis=1))
        assert strategy.objectives == [pytest.approx(cmeans_objective(total, total.argmin(axis=1)))]
    else:
        memberships = fuzzy_memberships(total, strategy.fuzzifier)
        np.testing.assert_array_equal(labels, memberships.argmax(axis=1))
        expected = fuzzy_cmeans_objective(total, memberships, strategy.fuzzifier)
        assert strategy.objectives == [pytest.approx(expected)]


def test_fedcmv_round_two_sends_the_assignment_to_every_client(fedcmv_strategy: FedCMvStrategy) -> None:
    strategy = fedcmv_strategy
    distances = _partial_distances()
    total = np.sum(distances, axis=0)
    strategy.aggregate_fit(1, _distance_replies(distances), [])
    instructions = strategy.configure_fit(2, ndarrays_to_parameters([]), _manager())
    assert len(instructions) == N_VIEWS
    for _, ins in instructions:
        assert ins.config["phase"] == "update"
        (assignment,) = parameters_to_ndarrays(ins.parameters)
        if type(strategy) is FedCMvStrategy:
            assert assignment.dtype == np.uint8 and assignment.shape == (N_SAMPLES,)
            np.testing.assert_array_equal(assignment, total.argmin(axis=1))
        else:
            assert assignment.dtype == np.float64 and assignment.shape == (N_SAMPLES, K)
            assert (assignment >= 0).all()
            np.testing.assert_allclose(assignment.sum(axis=1), 1.0, atol=1e-12)
            np.testing.assert_allclose(assignment, fuzzy_memberships(total, strategy.fuzzifier))


@pytest.mark.parametrize("strategy_class", [FedCMvStrategy, FedFCMvStrategy])
@pytest.mark.parametrize(("scale", "stops"), [(1.0, True), (1.5, False)])
def test_fedcmv_stops_on_the_relative_objective_change(
    tmp_path: Path, strategy_class: type[FedCMvStrategy], scale: float, stops: bool
) -> None:
    delta_key = f"{strategy_class.method}.delta"
    strategy = strategy_class(_cfg(tmp_path, method=strategy_class.method, **{delta_key: 1e-3}))
    strategy.aggregate_fit(1, _distance_replies(_partial_distances()), [])
    assert not strategy.finished
    parameters, _ = strategy.aggregate_fit(2, _distance_replies(_partial_distances(scale)), [])
    assert strategy.finished is stops
    assert (strategy.configure_fit(3, parameters, _manager()) == []) is stops
    assert strategy.summary()["objective_per_round"] == strategy.objectives
    if stops:
        assert "delta" in strategy.stop_reason


def test_fedcmv_rejects_negative_or_non_finite_distances(tmp_path: Path) -> None:
    for index, poison in enumerate((-1.0, np.inf)):
        distances = _partial_distances()
        distances[2][0, 0] = poison
        strategy = FedCMvStrategy(_cfg(tmp_path / str(index), method="fedcmv"))
        parameters, stats = strategy.aggregate_fit(1, _distance_replies(distances), [])
        assert parameters is None and stats["rejected"] == 1 and strategy.assignment is None


def test_fedcmv_evaluates_on_the_label_holder_only(tmp_path: Path) -> None:
    strategy = FedCMvStrategy(_cfg(tmp_path, method="fedcmv"))
    parameters, _ = strategy.aggregate_fit(1, _distance_replies(_partial_distances()), [])
    instructions = strategy.configure_evaluate(1, parameters, _manager())
    assert [proxy.cid for proxy, _ in instructions] == [CID_OF_VIEW[LABEL_HOLDER]]


# ------------------------------------------------------------------ whole federations (in-process)
def _run(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """One in-process run of the real strategy and clients; returns its summary."""
    base = {"seed": 0, **overrides}
    return execute(build_overrides(base, tmp_path), engine="inprocess", quiet=True)


@pytest.mark.parametrize("method", ["cefmc", "cefmc-h", "fedcmv", "fedfcmv"])
def test_whole_run_on_digits_mv(tmp_path: Path, method: str) -> None:
    rounds = 4
    keys = {"num-rounds": rounds, f"{TABLES[method]}.delta": 0.0}
    summary = _run(tmp_path, method=method, dataset="digits-mv", **keys)
    assert summary["num_clients"] == 3 and summary["rounds"] == rounds and summary["k"] == 10
    assert summary["status"] == "completed" and summary["stop_reason"] == f"max rounds ({rounds})"
    metrics = summary["metrics"]
    assert {"acc", "nmi", "purity"} <= metrics.keys()
    assert all(0.0 <= metrics[key] <= 1.0 for key in ("acc", "nmi", "purity"))
    assert metrics["acc"] > 0.5  # ten classes: chance is about 0.1
    comm = summary["comm_bytes"]
    assert comm["up"] > 0 and comm["down"] > 0
    objectives = summary["objective_per_round"]
    n_samples, n_views, k = 1797, 3, 10
    per_round = comm["per_round"]
    if method.startswith("cefmc"):
        assert len(objectives) == rounds - 1  # round 1 initialises, every later round is scored
        _assert_monotone(objectives, increasing=True)  # CeFMC maximises Eq. 19
        update_up = per_round[str(rounds)]["up"]
        if method == "cefmc":  # labels (one byte each) up, not representations
            assert update_up < n_views * (n_samples + 1024)
        else:
            assert update_up > n_views * n_samples * k * 8
    else:
        assert len(objectives) == rounds
        _assert_monotone(objectives, increasing=False)  # c-means objectives never rise


def _hw_dir() -> Path:
    """The data directory holding HW, or skip the test."""
    data_dir = resolve_data_dir()
    if data_dir is None or not (data_dir / HW_FILE).is_file():
        pytest.skip(f"HW data ({HW_FILE}) not found in the shared data directory {data_dir}")
    return data_dir


@pytest.mark.shared_data
def test_whole_cefmc_run_on_hw(tmp_path: Path) -> None:
    data_dir = _hw_dir()
    summary = _run(
        tmp_path,
        method="cefmc",
        dataset="hw",
        **{"data-dir": str(data_dir), "num-rounds": 8, "cefmc.delta": 0.0},
    )
    assert summary["num_clients"] == 6
    objectives = summary["objective_per_round"]
    assert len(objectives) == 7
    _assert_monotone(objectives, increasing=True)
    assert summary["metrics"]["acc"] >= 0.94
    fit_bytes = summary["comm_bytes"]["up"] + summary["comm_bytes"]["down"]
    assert fit_bytes <= 1.3e6


def _vertical_clients(cfg: RunConfig, n_views: int) -> dict[str, CeFMCClient]:
    """Real CeFMC clients, one per view, keyed by the cid of a mocked proxy."""
    clients = {}
    for view in range(n_views):
        context = Context(
            run_id=0,
            node_id=view + 1,
            node_config={"partition-id": view, "num-partitions": n_views},
            state=RecordDict(),
            run_config={},
        )
        clients[f"node-{view}"] = CeFMCClient(context, cfg)
    return clients


def _fit_all(
    clients: dict[str, CeFMCClient], instructions: list[tuple[ClientProxy, FitIns]]
) -> list[FitResult]:
    """Deliver each instruction to its real client and wrap the answers as Flower would."""
    results = []
    for proxy, ins in instructions:
        arrays, n_examples, metrics = clients[proxy.cid].fit(
            parameters_to_ndarrays(ins.parameters), ins.config
        )
        results.append((proxy, _fit_res(arrays, metrics, n_examples)))
    return results


@pytest.mark.parametrize("dataset", ["digits-mv", pytest.param("hw", marks=pytest.mark.shared_data)])
def test_clients_keep_orthonormal_representations_in_their_state(tmp_path: Path, dataset: str) -> None:
    data_dir = _hw_dir() if dataset == "hw" else None
    overrides = build_overrides({"method": "cefmc", "dataset": dataset, "seed": 0}, tmp_path)
    n_views = overrides["num-clients"]
    cfg = parse_run_config(overrides)
    assert data_dir is None or Path(cfg.data_dir) == data_dir.resolve()
    clients = _vertical_clients(cfg, n_views)
    manager = _manager(list(clients))
    strategy = CeFMCStrategy(cfg)
    parameters = strategy.initialize_parameters(manager)
    for round_number in (1, 2, 3):
        results = _fit_all(clients, strategy.configure_fit(round_number, parameters, manager))
        parameters, stats = strategy.aggregate_fit(round_number, results, [])
        assert parameters is not None and stats["accepted"] == n_views
        for cid, client in clients.items():
            state = client.state_arrays("cefmc")
            # HW's 6-d view at k = 10: cefmc.pad = zero keeps its 4 extra columns zero (H_vᵀ H_v = I_6 ⊕ 0)
            real = np.any(state["H"] != 0.0, axis=0)
            assert real.sum() == min(client.k, np.linalg.matrix_rank(client.data.features))
            _assert_orthonormal(state["H"][:, real])
            if round_number > 1:  # Eq. 24: the client's C_v is the first segment the server sent it
                np.testing.assert_array_equal(state["C_v"], strategy.C_views[strategy.partition_of[cid]])
    _assert_monotone(strategy.objectives, increasing=True)


# --------------------------------------------------------------------------- vertical config errors
def test_vertical_method_needs_one_client_per_view(tmp_path: Path) -> None:
    assert count_views({"dataset": "digits-mv"}) == 3
    with pytest.raises(ConfigError) as excinfo:
        build_overrides({"method": "cefmc", "dataset": "digits-mv", "num-clients": 2}, tmp_path)
    assert "3 views" in str(excinfo.value) and "num-clients=2" in str(excinfo.value)
    overrides = build_overrides({"method": "cefmc", "dataset": "digits-mv"}, tmp_path)
    assert overrides["num-clients"] == 3


@pytest.mark.parametrize("method", ["cefmc", "cefmc-h", "fedcmv", "fedfcmv"])
def test_vertical_method_on_a_single_view_dataset_is_a_clear_error(tmp_path: Path, method: str) -> None:
    expected = f"method '{method}' runs on datasets of kind multiview; 'digits' is of kind images"
    with pytest.raises(ConfigError, match=expected):
        build_overrides({"method": method, "dataset": "digits"}, tmp_path)


def test_vertical_method_with_an_explicit_horizontal_partition(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="method 'cefmc' needs partition='vertical', got partition='iid'"):
        parse_run_config({"method": "cefmc", "dataset": "digits-mv", "partition": "iid"})
    with pytest.raises(ConfigError, match="partition='iid'"):  # the runner refuses it before any work
        build_overrides({"method": "cefmc", "dataset": "digits-mv", "partition": "iid"}, tmp_path)
    assert not (tmp_path / "summary.json").exists()
    with pytest.raises(ConfigError, match="method 'kfed' needs a horizontal partition"):
        parse_run_config({"method": "kfed", "partition": "vertical"})


@pytest.mark.parametrize(
    ("method", "partition"),
    [
        ("cefmc", "vertical"),
        ("cefmc-h", "vertical"),
        ("fedcmv", "vertical"),
        ("kfed", "iid"),
        ("ffcm", "iid"),
    ],
)
def test_auto_partition_follows_the_method(method: str, partition: str) -> None:
    dataset = "digits-mv" if partition == "vertical" else "digits"
    assert parse_run_config({"method": method, "dataset": dataset}).partition == partition
    explicit = parse_run_config({"method": method, "dataset": dataset, "partition": "auto"})
    assert explicit.partition == partition


@pytest.mark.parametrize(("num_clients", "error"), [(0, PartitionError), (3, ClientConfigError)])
def test_a_client_with_the_wrong_number_of_partitions_fails_naming_both(
    tmp_path: Path, num_clients: int, error: type[Exception]
) -> None:
    cfg = parse_run_config(
        {"method": "cefmc", "dataset": "digits-mv", "num-clients": num_clients, "out-dir": str(tmp_path)}
    )
    context = Context(
        run_id=0,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config={},
    )
    with pytest.raises(error) as excinfo:
        CeFMCClient(context, cfg)
    message = str(excinfo.value)
    assert "num-partitions=2" in message or "num_partitions=2" in message
    assert ("3 views" if num_clients == 0 else "num-clients=3") in message

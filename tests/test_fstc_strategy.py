"""FSTC strategy driven with hand-built client replies (no Ray, no data, no encoder)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Code, EvaluateRes, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from fedapp.maths.fstc import aggregate_centres, initial_centres
from fedapp.methods.fstc import CENTRES_KEY, FINAL_KEY, MODEL_KEY
from fedapp.metrics.contingency import encode_table
from fedapp.neural.glue import FINGERPRINT_KEY
from strategies.fstc import FSTCRSTCStrategy, FSTCStrategy
from tests.flower_mocks import mock_manager, mock_proxy
from tests.strategy_configs import FSTC_K, fstc_config

K, DIM = FSTC_K, 2
FitResult = tuple[ClientProxy, FitRes]


def _reply(cid: str, pid: int, arrays: list[np.ndarray], n: int, **metrics: Any) -> FitResult:
    res = FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, {"partition-id": pid, "k": K, **metrics}
    )
    return mock_proxy(cid), res


# Round 1: local k-means centres near three groups at (0, 0), (10, 0), (0, 10).
INIT_REPLIES = [
    ("a", 0, [np.array([[0.0, 0.0], [10.0, 0.0]]), np.array([4, 6])], 10),
    ("b", 1, [np.array([[0.0, 10.0], [0.0, 2.0]]), np.array([5, 1])], 6),
    ("c", 2, [np.array([[10.0, 2.0], [0.0, 12.0]]), np.array([2, 5])], 7),
]


def _initialised(
    tmp_path: Path, strategy_class: type[FSTCStrategy] = FSTCStrategy, **overrides: Any
) -> FSTCStrategy:
    strategy = strategy_class(fstc_config(tmp_path, **overrides))
    parameters, stats = strategy.aggregate_fit(1, [_reply(*r) for r in INIT_REPLIES], [])
    assert stats["accepted"] == 3 and parameters is not None
    return strategy


def _sorted_rows(array: np.ndarray) -> np.ndarray:
    return array[np.lexsort(array.T[::-1])]


# ------------------------------------------------------------------------------------------- maths
def test_eq16_weights_by_counts_and_keeps_a_cluster_nobody_holds() -> None:
    previous = np.array([[9.0, 9.0], [8.0, 8.0], [7.0, 7.0]])
    centres = [np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]]), np.array([[4.0, 0.0], [3.0, 3.0], [6.0, 6.0]])]
    counts = [np.array([3, 1, 0]), np.array([1, 0, 0])]  # cluster 2 empty on both clients, 1 on one
    result = aggregate_centres(centres, counts, previous)
    np.testing.assert_allclose(result[0], [(3 * 0 + 1 * 4) / 4, 0.0])
    np.testing.assert_allclose(result[1], [1.0, 1.0])  # only the client that holds it counts
    np.testing.assert_allclose(result[2], [7.0, 7.0])  # nobody holds it: the previous centre stays


def test_initial_centres_weight_local_centres_by_their_sizes() -> None:
    points = [np.array([[0.0, 0.0], [10.0, 10.0]]), np.array([[2.0, 2.0], [12.0, 12.0]])]
    centres = initial_centres(points, [np.array([3, 1]), np.array([1, 3])], 2, seed=0)
    np.testing.assert_allclose(_sorted_rows(centres), [[0.5, 0.5], [11.5, 11.5]])
    padded = initial_centres(points, None, 5, seed=0)  # fewer points than k: kept, plus a seeded draw
    assert padded.shape == (5, 2)
    np.testing.assert_array_equal(padded[:4], np.vstack(points))
    with pytest.raises(ValueError, match="no points"):
        initial_centres([np.empty((0, 2))], None, 2, seed=0)


# ---------------------------------------------------------------------------------------- protocol
def test_round_one_asks_for_local_centres_and_builds_centres_and_model(tmp_path: Path) -> None:
    strategy = FSTCStrategy(fstc_config(tmp_path))
    manager = mock_manager(["c", "a", "b"])
    instructions = strategy.configure_fit(1, strategy.initialize_parameters(manager), manager)
    assert [ins.config["phase"] for _, ins in instructions] == ["init"] * 3
    strategy = _initialised(tmp_path)
    assert strategy.centres is not None  # the default, FSBERT k-FED's merge: the local centres unweighted
    expected = [[0.0, 1.0], [0.0, 11.0], [10.0, 1.0]]
    np.testing.assert_allclose(_sorted_rows(strategy.centres), _sorted_rows(np.array(expected)), atol=1e-12)
    assert strategy.initial_model is not None and strategy.schema is not None
    weighted = _initialised(tmp_path, **{"fstc.init-merge": "weighted"}).centres  # the paper presets'
    assert weighted is not None
    expected = [[0.0, 2.0 / 5], [0.0, 11.0], [10.0, 0.5]]
    np.testing.assert_allclose(_sorted_rows(weighted), _sorted_rows(np.array(expected)), atol=1e-12)
    assert not strategy.should_evaluate(1)


def test_the_initial_model_labels_every_record_by_its_nearest_initial_centre(tmp_path: Path) -> None:
    """`fstc.head-init = centres` (default): F is C̃'s nearest-centre classifier, so argmax O of the
    initial model is the start's clustering; `random` (the paper presets') is not."""
    import torch

    from fedapp.models.fstc import fstc_model

    points = np.random.default_rng(0).uniform(-2, 12, size=(400, DIM))
    for head_init, agrees in (("centres", True), ("random", False)):
        strategy = _initialised(tmp_path, **{"fstc.head-init": head_init})
        assert strategy.centres is not None and strategy.initial_model is not None
        model = fstc_model(strategy.params, K, DIM, strategy.cfg.embedding_model)
        model.load_state_dict(
            {
                name: torch.as_tensor(a)
                for name, a in zip(model.state_dict(), strategy.initial_model, strict=True)
            }
        )
        with torch.no_grad():
            _, scores = model(torch.as_tensor(points, dtype=torch.float32))
        nearest = ((points[:, None, :] - strategy.centres[None]) ** 2).sum(2).argmin(1)
        assert (scores.argmax(1).numpy() == nearest).all() == agrees, head_init
    with pytest.raises(ValueError, match="head-hidden"):
        fstc_config(tmp_path, **{"fstc.head-hidden": 8})


def test_training_rounds_send_the_initial_model_once_per_client(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path)
    assert strategy.initial_model is not None
    n_model = len(strategy.initial_model)
    manager = mock_manager(["a", "b", "c"])
    instructions = strategy.configure_fit(2, ndarrays_to_parameters([]), manager)
    for _, ins in instructions:
        arrays = parameters_to_ndarrays(ins.parameters)
        assert ins.config[MODEL_KEY] and ins.config[CENTRES_KEY] and not ins.config[FINAL_KEY]
        assert len(arrays) == 1 + n_model
        np.testing.assert_array_equal(arrays[0], strategy.centres)
    # round 2 again, c not sampled (as with dropout-rate; a client asked but silent counts as failed)
    strategy.configure_fit(2, ndarrays_to_parameters([]), mock_manager(["a", "b"]))
    replies = [_train_reply("a", 0, 10), _train_reply("b", 1, 6)]
    strategy.aggregate_fit(2, replies, [])
    instructions = {
        proxy.cid: ins for proxy, ins in strategy.configure_fit(3, ndarrays_to_parameters([]), manager)
    }
    assert (
        not instructions["a"].config[MODEL_KEY]
        and len(parameters_to_ndarrays(instructions["a"].parameters)) == 1
    )
    assert instructions["c"].config[MODEL_KEY]  # it never got the initial model
    assert all(ins.config[FINAL_KEY] for ins in instructions.values())


def _train_reply(
    cid: str,
    pid: int,
    n: int,
    centres: np.ndarray | None = None,
    counts: np.ndarray | None = None,
    model: list[np.ndarray] | None = None,
    **metrics: Any,
) -> FitResult:
    centres = np.full((K, DIM), float(pid)) if centres is None else centres
    counts = np.array([n - 2, 1, 1]) if counts is None else counts
    return _reply(cid, pid, [centres, counts, *(model or [])], n, **metrics)


def test_training_round_applies_eq16_with_unequal_counts_and_an_empty_cluster(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path)
    before = strategy.centres.copy()
    replies = [
        _train_reply("a", 0, 10, np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]), np.array([7, 3, 0])),
        _train_reply("b", 1, 6, np.array([[5.0, 5.0], [6.0, 6.0], [0.0, 0.0]]), np.array([1, 5, 0])),
    ]
    parameters, stats = strategy.aggregate_fit(2, replies, [])
    assert stats["accepted"] == 2
    (centres,) = parameters_to_ndarrays(parameters)
    np.testing.assert_allclose(centres[0], [(7 * 1 + 1 * 5) / 8] * 2)
    np.testing.assert_allclose(centres[1], [(3 * 2 + 5 * 6) / 8] * 2)
    np.testing.assert_allclose(centres[2], before[2])  # empty everywhere: unchanged
    assert strategy.train_metrics[-1]["round"] == 2


def test_final_round_averages_models_by_sample_count_and_evaluates_once(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path)
    strategy.aggregate_fit(
        2, [_train_reply("a", 0, 10), _train_reply("b", 1, 6), _train_reply("c", 2, 7)], []
    )
    assert strategy.initial_model is not None and strategy.schema is not None
    models = [[np.full_like(a, value) for a in strategy.initial_model] for value in (1.0, 3.0)]
    fingerprint = {FINGERPRINT_KEY: strategy.schema.fingerprint}
    replies = [
        _train_reply("a", 0, 10, model=models[0], **fingerprint),
        _train_reply("b", 1, 30, counts=np.array([28, 1, 1]), model=models[1], **fingerprint),
    ]
    parameters, stats = strategy.aggregate_fit(3, replies, [])
    assert stats["accepted"] == 2 and strategy.finished
    for array in parameters_to_ndarrays(parameters):
        np.testing.assert_allclose(array, (10 * 1.0 + 30 * 3.0) / 40)  # Alg. 2 line 12, renormalised
    manager = mock_manager(["a", "b", "c"])
    assert strategy.configure_fit(4, parameters, manager) == []
    assert len(strategy.configure_evaluate(3, parameters, manager)) == 3
    table = encode_table(np.array([[5, 0, 0], [0, 5, 0], [0, 0, 5]]))
    strategy.aggregate_evaluate(
        3, [(mock_proxy("a"), EvaluateRes(Status(Code.OK, ""), 0.0, 15, {"table": table}))], []
    )
    assert strategy.final_metrics is not None and strategy.final_metrics["acc"] == 1.0
    assert strategy.configure_evaluate(4, parameters, manager) == []


def _bad_train_replies(strategy: FSTCStrategy) -> dict[str, tuple[FitResult, str]]:
    assert strategy.initial_model is not None and strategy.schema is not None
    good_model = [a.copy() for a in strategy.initial_model]
    nan_model = [a.copy() for a in strategy.initial_model]
    nan_model[0].flat[0] = np.nan
    fingerprint = {FINGERPRINT_KEY: strategy.schema.fingerprint}
    return {
        "nan-centres": (
            _train_reply("x", 5, 10, np.full((K, DIM), np.nan), model=good_model, **fingerprint),
            "NaN",
        ),
        "wrong-k": (
            _train_reply("x", 5, 10, np.zeros((K + 1, DIM)), model=good_model, **fingerprint),
            "shape",
        ),
        "counts-sum": (
            _train_reply("x", 5, 10, counts=np.array([1, 1, 1]), model=good_model, **fingerprint),
            "sum to 3",
        ),
        "nan-model": (_train_reply("x", 5, 10, model=nan_model, **fingerprint), "NaN"),
        "no-model": (_train_reply("x", 5, 10, **fingerprint), "expected"),
        "no-fingerprint": (_train_reply("x", 5, 10, model=good_model), "state-fingerprint"),
        "other-fingerprint": (
            _train_reply("x", 5, 10, model=good_model, **{FINGERPRINT_KEY: "0" * 16}),
            "fingerprint",
        ),
    }


@pytest.mark.parametrize(
    "case",
    ["nan-centres", "wrong-k", "counts-sum", "nan-model", "no-model", "no-fingerprint", "other-fingerprint"],
)
def test_malformed_final_replies_are_rejected_and_the_others_averaged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    strategy = _initialised(tmp_path, **{"num-rounds": 2})
    bad, reason = _bad_train_replies(strategy)[case]
    assert strategy.initial_model is not None and strategy.schema is not None
    good = _train_reply(
        "a",
        0,
        10,
        model=[np.full_like(a, 2.0) for a in strategy.initial_model],
        **{FINGERPRINT_KEY: strategy.schema.fingerprint},
    )
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parameters, stats = strategy.aggregate_fit(2, [good, bad], [])
    assert stats["accepted"] == 1 and stats["rejected"] == 1
    assert "node x" in caplog.text and reason in caplog.text  # no valid reply yet: its node id
    for array in parameters_to_ndarrays(parameters):
        np.testing.assert_allclose(array, 2.0)


def test_init_with_representations_runs_plain_kmeans(tmp_path: Path) -> None:
    strategy = FSTCStrategy(fstc_config(tmp_path, **{"fstc.init": "representations"}))
    reps = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 10.0], [1.0, 10.0]])
    replies = [_reply("a", 0, [reps[:3]], 3), _reply("b", 1, [reps[3:]], 3)]
    strategy.aggregate_fit(1, replies, [])
    expected = [[0.0, 0.5], [0.5, 10.0], [10.0, 0.5]]
    np.testing.assert_allclose(_sorted_rows(strategy.centres), expected, atol=1e-12)


def test_ablation_sends_no_centres_to_clients_that_have_the_model(tmp_path: Path) -> None:
    strategy = _initialised(tmp_path, FSTCRSTCStrategy, method="fstc-rstc")
    manager = mock_manager(["a", "b", "c"])
    first = strategy.configure_fit(2, ndarrays_to_parameters([]), manager)
    assert all(ins.config[CENTRES_KEY] and ins.config[MODEL_KEY] for _, ins in first)  # Q starts from C̃
    counts_only = [
        _reply(cid, pid, [np.array([n - 2, 1, 1])], n)
        for cid, pid, n in (("a", 0, 10), ("b", 1, 6), ("c", 2, 7))
    ]
    before = strategy.centres.copy()
    parameters, stats = strategy.aggregate_fit(2, counts_only, [])
    assert stats["accepted"] == 3
    np.testing.assert_array_equal(strategy.centres, before)  # no Eq. 16
    later = strategy.configure_fit(3, parameters, manager)
    assert all(
        not ins.config[CENTRES_KEY] and parameters_to_ndarrays(ins.parameters) == [] for _, ins in later
    )


@pytest.mark.parametrize(
    ("overrides", "method"),
    [
        ({}, "fsbert-kfed"),
        ({"fstc.init-merge": "weighted"}, ""),
        ({"fstc.init-local-k": 2 * FSTC_K}, ""),
        ({"fstc.init-local-k": FSTC_K}, "fsbert-kfed"),
        ({"fstc.init": "representations"}, ""),
        ({"fstc.init": "moments"}, ""),
    ],
)
def test_the_kept_start_names_fsbert_kfed_only_where_it_is_its_clustering(
    tmp_path: Path, overrides: dict[str, Any], method: str
) -> None:
    """The warning of a kept start names the one-shot method it amounts to: FSBERT k-FED only for K local
    centres a client merged unweighted; 2K, weighted or another init is another clustering."""
    strategy = FSTCStrategy(fstc_config(tmp_path, **overrides))
    strategy.start_centres = np.zeros((FSTC_K, 4))
    strategy.initial_model = [np.zeros(2)]
    start = strategy.start_candidate()
    assert start is not None and start.method == method

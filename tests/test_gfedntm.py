"""gFedNTM pieces: models, batching, metrics, the generator, and the strategy driven by hand-built replies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from fedapp.config.run import parse_run_config
from fedapp.datasets.partition import PartitionError, partition_indices
from fedapp.datasets.synthetic import SyntheticLDASpec, generate
from fedapp.launch.resolve import build_overrides
from fedapp.maths.gfedntm import EpochSplit, TopicModelError, steps_per_epoch
from fedapp.methods.gfedntm import PHASE_TRAIN, PHASE_VOCABULARY
from fedapp.metrics.topics import (
    average_minimum_wmd,
    document_similarity_score,
    npmi_from_cooccurrence,
    topic_diversity,
    topic_similarity_score,
)
from fedapp.models.gfedntm import GroupBatchNorm1d
from fedapp.neural.glue import FINGERPRINT_KEY, state_arrays, state_schema
from simulation.runner import execute
from strategies.gfedntm import GFedNTMStrategy, weighted_gradient
from tests.flower_mocks import mock_proxy


# ----------------------------------------------------------------------------------- model pieces
def test_group_batchnorm_with_one_group_is_torch_batchnorm() -> None:
    torch.manual_seed(0)
    x = torch.randn(9, 4) * 3 + 1
    ours, theirs = GroupBatchNorm1d(4), torch.nn.BatchNorm1d(4, affine=False)
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.allclose(getattr(ours, name).float(), getattr(theirs, name).float(), atol=1e-6), name
    ours.eval(), theirs.eval()
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)


def test_group_batchnorm_running_stats_are_the_size_weighted_mean_of_per_group_updates() -> None:
    torch.manual_seed(1)
    x = torch.randn(10, 3)
    grouped = GroupBatchNorm1d(3)
    grouped(x, [7, 3])
    singles = [GroupBatchNorm1d(3), GroupBatchNorm1d(3)]
    singles[0](x[:7]), singles[1](x[7:])
    expected = (7 * singles[0].running_var + 3 * singles[1].running_var) / 10
    assert torch.allclose(grouped.running_var, expected, atol=1e-6)
    assert int(grouped.num_batches_tracked) == 1


def test_epoch_split_visits_every_document_once_and_aligns_unequal_clients() -> None:
    sizes = [130, 64, 33]
    per_epoch = steps_per_epoch(sizes, 32)
    assert per_epoch == 5
    for n in sizes:
        split = EpochSplit(n, per_epoch, seed=4)
        epoch = [split.batch(step) for step in range(per_epoch)]
        assert np.array_equal(np.sort(np.concatenate(epoch)), np.arange(n))
        lengths = [len(batch) for batch in epoch]
        assert max(lengths) - min(lengths) <= 1 and sum(lengths) == n
        assert not np.array_equal(split.batch(per_epoch), split.batch(0))  # the next epoch reshuffles
    with pytest.raises(TopicModelError, match="cannot fill"):
        EpochSplit(9, per_epoch, seed=0)


# ------------------------------------------------------------------------------------- data pieces
def test_by_group_partition_gives_whole_groups() -> None:
    labels = np.array([2, 0, 1, 2, 0, 3, 4, 1])
    parts = partition_indices(labels, 3, "by-group", seed=0)
    assert [sorted(labels[p].tolist()) for p in parts] == [[0, 0, 3], [1, 1, 4], [2, 2]]
    with pytest.raises(PartitionError, match="at most one client per group"):
        partition_indices(labels, 6, "by-group", seed=0)


def test_synthetic_nodes_use_only_shared_and_own_topics() -> None:
    spec = SyntheticLDASpec(vocab_size=200, n_topics=10, n_shared=5, docs_per_node=30, heldout_per_node=20)
    data = generate(spec, seed=1)
    assert data.train_counts.shape == (150, 200) and data.heldout_theta.shape == (100, 10)
    lengths = np.asarray(data.train_counts.sum(axis=1)).ravel()
    assert lengths.min() >= 150 and lengths.max() < 250
    for node in range(5):
        theta = data.heldout_theta[data.heldout_nodes == node]
        foreign = np.setdiff1d(np.arange(10), spec.node_topics(node))
        assert theta[:, foreign].sum(axis=1).max() < 1e-2  # prior alpha / 10,000 on other nodes' topics
    again = generate(spec, seed=1)
    assert (again.train_counts != data.train_counts).nnz == 0


# ------------------------------------------------------------------------------------------ metrics
def test_tss_and_dss_of_the_truth_are_perfect() -> None:
    rng = np.random.default_rng(0)
    topics = rng.dirichlet(np.full(30, 0.1), 4)
    assert topic_similarity_score(topics, topics) == pytest.approx(4.0)
    assert topic_similarity_score(topics[:2], topics) < 4.0
    theta = rng.dirichlet(np.ones(4), 12)
    assert document_similarity_score(theta, theta) == pytest.approx(0.0, abs=1e-9)
    uniform = np.full_like(theta, 0.25)
    assert document_similarity_score(theta, uniform) > 0.5


def test_npmi_and_diversity_by_hand() -> None:
    # 4 documents; words a, b always together (NPMI 1), a, c never (-1)
    cooccurrence = np.array([[[2, 2, 0], [2, 2, 0], [0, 0, 2]]])
    npmi = npmi_from_cooccurrence(cooccurrence, 4)
    assert npmi[0] == pytest.approx((1.0 - 1.0 - 1.0) / 3)
    assert topic_diversity(np.array([[0, 1], [1, 2]])) == 0.75


def test_amwmd_is_zero_for_the_same_topics_and_grows_with_distance() -> None:
    vectors = np.random.default_rng(0).standard_normal((8, 5))
    topics = np.array([[0, 1, 2], [3, 4, 5]])
    assert average_minimum_wmd(topics, topics, vectors) == pytest.approx(0.0)
    assert average_minimum_wmd(topics, np.array([[5, 6, 7]]), vectors) > 0


# ------------------------------------------------------------------------------- strategy by hand
def _strategy(tmp_path: Path, **overrides: object) -> GFedNTMStrategy:
    run_config = {
        "method": "gfedntm",
        "dataset": "synthetic-lda-tiny",
        "num-clients": 3,
        "num-rounds": 50,
        "out-dir": str(tmp_path),
        "device": "cpu",
        "gfedntm.topics": 3,
        "gfedntm.hidden": "4",
        "gfedntm.batch-size": 4,
    }
    run_config.update(overrides)
    return GFedNTMStrategy(parse_run_config(run_config))


def _vocabulary_reply(pid: int, df: dict[str, int], n: int) -> tuple[ClientProxy, FitRes]:
    terms = np.array(sorted(df), dtype=np.str_)
    counts = np.array([df[t] for t in sorted(df)], dtype=np.int64)
    metrics = {"partition-id": pid, "k": 3, "context-dim": 0}
    return mock_proxy(f"c{pid}"), FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters([terms, counts]), n, metrics
    )


def _consensus(strategy: GFedNTMStrategy, sizes: tuple[int, ...] = (8, 12, 6)) -> None:
    dfs = [{"w000": 3, "w001": 1}, {"w000": 5, "w002": 2}, {"w001": 1, "w003": 4}]
    replies = [_vocabulary_reply(pid, df, n) for pid, (df, n) in enumerate(zip(dfs, sizes, strict=True))]
    assert strategy.fit_config(1)["phase"] == PHASE_VOCABULARY
    strategy.aggregate_fit(1, replies, [])


def _update_reply(
    strategy: GFedNTMStrategy, pid: int, scale: float, n: int, **metric_overrides: object
) -> tuple[ClientProxy, FitRes]:
    """A training reply whose every gradient entry is `scale` and buffers are `scale` too."""
    trainable = [np.full(a.shape, scale, dtype=a.dtype) for a in state_arrays(strategy.model, "trainable")]
    buffers = [
        np.full(a.shape, scale, dtype=a.dtype) if a.dtype.kind == "f" else a + 1
        for a in state_arrays(strategy.model, "buffers")
    ]
    metrics = {
        "partition-id": pid,
        "k": 3,
        "step": strategy.step,
        "loss": 1.0,
        FINGERPRINT_KEY: state_schema(strategy.model).fingerprint,
        **metric_overrides,
    }
    return mock_proxy(f"c{pid}"), FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters([*trainable, *buffers]), n, metrics
    )


def test_vocabulary_consensus_is_the_union_with_summed_counts(tmp_path: Path) -> None:
    strategy = _strategy(tmp_path)
    _consensus(strategy)
    assert strategy.vocabulary == ("w000", "w001", "w002", "w003")
    assert strategy.client_documents == {0: 8, 1: 12, 2: 6}
    assert strategy.steps_per_epoch == 3  # ceil(12 / 4): the largest client's batches hold 4
    assert strategy.model.beta.shape == (3, 4)
    assert strategy.fit_config(2)["phase"] == PHASE_TRAIN


def test_vocabulary_min_df_applies_to_the_merged_counts(tmp_path: Path) -> None:
    strategy = _strategy(tmp_path, **{"gfedntm.min-df": 3})
    _consensus(strategy)
    # w001: 1 + 1 = 2 documents in the union (< 3); w000: 8; w003: 4; w002: 2
    assert strategy.vocabulary == ("w000", "w003")


def test_gradient_mean_is_weighted_by_batch_sizes() -> None:
    grads = [[np.array([1.0, 2.0])], [np.array([4.0, -1.0])]]
    mean = weighted_gradient(grads, [3, 1])
    assert np.allclose(mean[0], [(3 * 1 + 4) / 4, (3 * 2 - 1) / 4])


def test_server_adam_steps_with_the_weighted_gradient_and_keeps_its_state(tmp_path: Path) -> None:
    strategy = _strategy(tmp_path)
    _consensus(strategy)
    reference = torch.optim.Adam(
        [p.detach().clone().requires_grad_() for p in strategy.model.parameters()],
        lr=2e-3,
        betas=(0.99, 0.99),
    )
    for step in range(3):
        sizes = [strategy.expected_documents(pid) for pid in range(3)]
        replies = [
            _update_reply(strategy, pid, scale, n)
            for pid, (scale, n) in enumerate(zip((1.0, 3.0, -2.0), sizes, strict=True))
        ]
        strategy.aggregate_fit(2 + step, replies, [])
        mean = (1.0 * sizes[0] + 3.0 * sizes[1] - 2.0 * sizes[2]) / sum(sizes)
        for param in reference.param_groups[0]["params"]:
            param.grad = torch.full_like(param, mean)
        reference.step()
    assert strategy.step == 3
    for ours, theirs in zip(strategy.model.parameters(), reference.param_groups[0]["params"], strict=True):
        assert torch.allclose(ours, theirs, atol=1e-6)
        assert torch.allclose(
            strategy.optimizer.state[ours]["exp_avg_sq"], reference.state[theirs]["exp_avg_sq"]
        )
        assert float(strategy.optimizer.state[ours]["step"]) == 3
    # BatchNorm buffers: the weighted mean of the clients'; the counter stays an integer
    assert strategy.model.beta_batchnorm.num_batches_tracked.dtype == torch.int64


def test_a_failed_client_step_renormalises_over_the_others(tmp_path: Path) -> None:
    strategy = _strategy(tmp_path, **{"gfedntm.optimizer": "sgd", "gfedntm.lr": 0.5})
    _consensus(strategy)
    before = strategy.model.beta.detach().clone()
    sizes = [strategy.expected_documents(pid) for pid in range(3)]
    replies = [_update_reply(strategy, 0, 2.0, sizes[0]), _update_reply(strategy, 2, -1.0, sizes[2])]
    strategy.aggregate_fit(2, replies, [RuntimeError("client 1 crashed")])
    mean = (2.0 * sizes[0] - 1.0 * sizes[2]) / (sizes[0] + sizes[2])
    assert torch.allclose(strategy.model.beta, before - 0.5 * mean)  # Eq. 3 on the clients that answered
    assert strategy.step == 1  # the failed client's batch of step 0 is skipped; everyone moves on
    assert strategy.fit_config(3)["step"] == 1


def test_malformed_and_nan_gradients_are_rejected(tmp_path: Path) -> None:
    strategy = _strategy(tmp_path, **{"gfedntm.optimizer": "sgd", "gfedntm.lr": 1.0})
    _consensus(strategy)
    before = strategy.model.beta.detach().clone()
    sizes = [strategy.expected_documents(pid) for pid in range(3)]
    good = _update_reply(strategy, 0, 1.0, sizes[0])
    nan = _update_reply(strategy, 1, float("nan"), sizes[1])
    _, malformed = _update_reply(strategy, 2, 1.0, sizes[2])
    arrays = parameters_to_ndarrays(malformed.parameters)
    arrays[0] = arrays[0][:-1]
    malformed.parameters = ndarrays_to_parameters(arrays)
    wrong_size = _update_reply(strategy, 2, 1.0, sizes[2] + 5)
    _, stats = strategy.aggregate_fit(2, [good, nan, (mock_proxy("c2"), malformed)], [])
    assert stats["accepted"] == 1 and stats["rejected"] == 2
    assert torch.allclose(strategy.model.beta, before - 1.0)
    _, stats = strategy.aggregate_fit(3, [wrong_size], [])
    assert stats["rejected"] == 1 and strategy.step == 1


def _tiny_run(tmp_path: Path, **overrides: object) -> dict:
    base = {
        "method": "gfedntm",
        "dataset": "synthetic-lda-tiny",
        "num-clients": 5,
        "partition": "by-group",
        "num-rounds": 13,
        "eval-every": 6,
        "device": "cpu",
        "gfedntm.topics": 10,
        "gfedntm.batch-size": 30,
        "gfedntm.epochs": 3,
        **overrides,
    }
    execute(build_overrides(base, tmp_path), "inprocess", quiet=True)
    return json.loads((tmp_path / "summary.json").read_text())


def test_dropout_rate_half_completes_every_step(tmp_path: Path) -> None:
    summary = _tiny_run(tmp_path, **{"dropout-rate": 0.5})
    assert summary["steps"] == 12 and summary["stop_reason"].startswith("12 steps")
    assert {"tss", "dss", "npmi", "td"} <= set(summary["metrics"])
    trained = [r for key, r in summary["participation"].items() if key != "1"]
    assert all(len(r["accepted"]) == 3 for r in trained[:12])  # round(0.5 * 5) = 2 sat out each step
    assert len(summary["participation"]["1"]["accepted"]) == 5  # the vocabulary round is never thinned


def test_parameter_exchange_with_sgd_and_one_local_step_equals_gradient_exchange(tmp_path: Path) -> None:
    sgd = {"gfedntm.optimizer": "sgd", "gfedntm.lr": 0.05, "gfedntm.precision": "float64", "eval-every": 100}
    gradient = _tiny_run(tmp_path / "g", **sgd)
    parameters = _tiny_run(tmp_path / "p", **sgd, **{"gfedntm.exchange": "parameters"})
    assert gradient["metrics"]["tss"] == pytest.approx(parameters["metrics"]["tss"], abs=1e-9)
    assert gradient["metrics"]["dss"] == pytest.approx(parameters["metrics"]["dss"], abs=1e-6)


def test_local_steps_need_parameter_exchange() -> None:
    with pytest.raises(ValueError, match="needs 'gfedntm.exchange'='parameters'"):
        parse_run_config({"method": "gfedntm", "dataset": "synthetic-lda-tiny", "gfedntm.local-steps": 4})


def test_bow_counts_survive_subsampling() -> None:
    from fedapp.datasets import load_dataset

    full = load_dataset("synthetic-lda-tiny", seed=2)
    small = load_dataset("synthetic-lda-tiny", seed=2, max_samples=100)
    assert isinstance(small.counts, scipy.sparse.csr_matrix) and small.counts.shape == (100, 300)
    assert np.bincount(small.y).tolist() == [20] * 5 and full.kind == "bow"


def test_the_round_before_any_client_holds_the_vocabulary_is_not_evaluated_and_no_failure(
    tmp_path: Path,
) -> None:
    """Round 1 is the vocabulary consensus: clients get the vocabulary with their first training step, so
    nobody is asked to score round 1's model (it used to give one "evaluation failure ... no vocabulary
    yet" per client on the console)."""
    summary = _tiny_run(tmp_path, **{"num-rounds": 2, "eval-every": 1})
    assert summary["status"] == "converged", summary["status_reason"]
    log = (tmp_path / "flower.log").read_text()
    assert "failure" not in log and "no vocabulary yet" not in log
    assert "round 1/2" in log and "round 2/2" in log  # each round still says it ran
    evaluated = [entry["round"] for entry in json.loads((tmp_path / "rounds.json").read_text())]
    assert evaluated == [2]

"""gFedNTM equals centralized training: 100 federated steps through the real client and strategy classes
(in-process Flower engine: Parameters bytes, context.state, RNG restore, server Adam) against one
process training one model on the union batches.

What "centralized" means here: the union of the clients' mini-batches of each step, one forward and one
backward pass, mean loss over its documents, the same dropout / reparameterisation draws per client
(each client's generator), and BatchNorm statistics per client group ("ghost batches"): in train mode a
client can only normalise its own mini-batch. The control test shows that ordinary BatchNorm over the
whole union batch is a different computation (the federated weights are far from it).

Deterministic settings: float64 (`gfedntm.precision`). One tensor is left out of the comparison: the
learnable prior mean. Its exact gradient is prior_mean / prior_variance (the BatchNorm'd posterior means
average to zero in every group), zero at the initial value 0, and no other gradient depends on it
(BatchNorm's backward pass removes the constant it adds); Adam turns the 1e-16 rounding residue of
that zero gradient into lr-sized steps within three steps, so its trajectory is amplified rounding
noise in federated and centralized training alike. `test_prior_mean_is_inert` checks both facts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedapp.app.client_app import client_fn
from fedapp.app.inprocess import run_inprocess
from fedapp.app.server_app import server_fn
from fedapp.config.run import parse_run_config
from fedapp.datasets import load_dataset
from fedapp.datasets.local import client_seed
from fedapp.datasets.partition import partition_indices
from fedapp.maths.gfedntm import (
    Corpus,
    EpochSplit,
    batch_loss,
    bow_projection,
    build_model,
    make_optimizer,
    model_dtype,
    steps_per_epoch,
    union_batch_step,
)
from fedapp.methods.gfedntm import GFedNTMConfig
from fedapp.models.gfedntm import Groups, NeuralTopicModel
from fedapp.neural.glue import Rngs

STEPS = 100  # 6 epoch ends (each client's reshuffle, its generator restored from context.state)
CLIENTS = 3  # by-group over 5 nodes: clients of 240, 240 and 120 documents (unequal n_l)
SEED = 3


def _overrides(model: str, out_dir: Path) -> dict:
    return {
        "method": "gfedntm",
        "dataset": "synthetic-lda-tiny",
        "num-clients": CLIENTS,
        "partition": "by-group",
        "num-rounds": STEPS + 1,  # round 1 is the vocabulary consensus
        "eval-every": 10_000,
        "seed": SEED,
        "device": "cpu",
        "out-dir": str(out_dir),
        "gfedntm.model": model,
        "gfedntm.topics": 10,
        "gfedntm.batch-size": 16,
        "gfedntm.precision": "float64",
    }


def _centralized(overrides: dict, *, pooled_norm: bool = False) -> tuple[torch.nn.Module, tuple[str, ...]]:
    """One model trained on the union batches of the clients' batch plans, in one process."""
    cfg = parse_run_config(overrides)
    params = cfg.params(GFedNTMConfig)
    data = load_dataset(cfg.dataset, seed=SEED)
    parts = partition_indices(data.y, CLIENTS, "by-group", seed=SEED)
    columns = np.flatnonzero(np.asarray(data.counts.sum(axis=0)).ravel() > 0)  # every term some document has
    combined = params.model == "combinedtm"
    corpora = [
        Corpus(data.counts[rows][:, columns], bow_projection(data.counts[rows], SEED) if combined else None)
        for rows in parts
    ]
    model = build_model(params, columns.size, 384 if combined else 0, SEED, torch.device("cpu"))
    optimizer = make_optimizer(list(model.parameters()), params.optimizer, params.lr, params.betas)
    batches_per_epoch = steps_per_epoch([c.n_documents for c in corpora], params.batch_size)
    seeds = [client_seed(SEED, client) for client in range(CLIENTS)]
    splits = [EpochSplit(c.n_documents, batches_per_epoch, s) for c, s in zip(corpora, seeds, strict=True)]
    generators = [Rngs.from_seed(s).torch for s in seeds]
    for step in range(STEPS):
        batches = [
            c.batch(split.batch(step), torch.device("cpu"), model_dtype(model))
            for c, split in zip(corpora, splits, strict=True)
        ]
        union_batch_step(model, optimizer, batches, generators, pooled_norm=pooled_norm)
    return model, tuple(data.vocabulary[j] for j in columns)


def _max_difference(first: torch.nn.Module, second: torch.nn.Module) -> float:
    """max |a - b| over every tensor of the state except the inert prior mean (see the module docstring)."""
    a, b = first.state_dict(), second.state_dict()
    assert list(a) == list(b)
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in a if name != "prior_mean")


@pytest.fixture(scope="module", params=["prodlda", "combinedtm"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    overrides = _overrides(request.param, tmp_path_factory.mktemp(request.param))
    strategy, _ = run_inprocess(server_fn, client_fn, overrides, CLIENTS)
    return overrides, strategy


@pytest.mark.long
def test_federated_equals_centralized_on_union_batches(runs: tuple) -> None:
    overrides, strategy = runs
    assert strategy.step == STEPS and strategy.steps_per_epoch == 15  # 100 steps cross 6 epoch ends
    reference, vocabulary = _centralized(overrides)
    assert strategy.vocabulary == vocabulary
    difference = _max_difference(strategy.model, reference)
    assert difference <= 1e-5, f"max |W_federated - W_centralized| = {difference:.3g}"
    # BatchNorm counters: one per step, kept integer through the weighted averaging
    assert int(strategy.model.beta_batchnorm.num_batches_tracked) == STEPS


@pytest.mark.long
def test_ordinary_batchnorm_on_the_union_batch_is_a_different_computation(runs: tuple) -> None:
    overrides, strategy = runs
    reference, _ = _centralized(overrides, pooled_norm=True)
    assert _max_difference(strategy.model, reference) > 1e-3


def test_prior_mean_is_inert() -> None:
    """Its gradient is prior_mean / prior_variance, and moving it changes no other parameter's gradient."""
    torch.manual_seed(0)
    model = NeuralTopicModel(40, 6).double()
    bow = torch.poisson(torch.rand(12, 40, dtype=torch.float64) * 3)

    def gradients(prior_mean: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            model.prior_mean.copy_(prior_mean)
        model.zero_grad()
        batch_loss(model, bow, None, Groups.single(12, torch.Generator().manual_seed(5)))["loss"].backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    at_zero = gradients(torch.zeros(6, dtype=torch.float64))
    shifted_mean = torch.linspace(-1, 1, 6, dtype=torch.float64)
    shifted = gradients(shifted_mean)
    assert float(at_zero["prior_mean"].abs().max()) < 1e-12
    expected = shifted_mean / model.prior_variance.detach()
    assert torch.allclose(shifted["prior_mean"], expected, atol=1e-12)
    for name in at_zero:
        if name not in ("prior_mean", "prior_variance"):  # the variance's KL term reads the mean
            assert torch.allclose(at_zero[name], shifted[name], atol=1e-12), name

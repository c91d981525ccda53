"""CCFC: loss semantics, the client's state across rounds, the strategy with hand-built replies, and
end-to-end runs on the embedded digits."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.common import (
    Code,
    Context,
    FitRes,
    RecordDict,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from clients.ccfc import (
    CCFCClient,
    ClusterObjective,
    SampleContrastiveObjective,
    cluster_contrastive_loss,
    cosine_assign,
    info_nce_loss,
    model_contrastive_loss,
    optimizer_key,
    simsiam_loss,
)
from fedapp.config.run import RunConfig, parse_run_config
from fedapp.datasets.augment import contrastive_augmenter
from fedapp.launch.resolve import build_overrides
from fedapp.methods.ccfc import CLUSTER, PRETRAIN, SETUP, SHAPE_KEYS, CCFCConfig, phase_of
from fedapp.models.ccfc import CCFCNet, initial_model
from fedapp.neural.glue import FINGERPRINT_KEY, state_arrays, state_schema
from simulation.runner import execute
from strategies.ccfc import CCFCStrategy, CheckpointError, average_models, merge_centroids
from tests.flower_mocks import mock_proxy

DIGITS_SHAPE = (1, 8, 8)


# ------------------------------------------------------------------------------------------- losses
def _loop_cluster_loss(p: torch.Tensor, z: torch.Tensor, labels: torch.Tensor, self_pairs: bool) -> float:
    """Eq. 1-2 written as loops over clusters and pairs (the authors' code when self_pairs)."""
    per_cluster = []
    for label in labels.unique():
        members = torch.nonzero(labels == label).flatten().tolist()
        if len(members) < 2:
            continue
        cosines = [
            torch.nn.functional.cosine_similarity(p[i], z[j], dim=0).item()
            for i in members
            for j in members
            if self_pairs or i != j
        ]
        per_cluster.append(-sum(cosines) / len(cosines))
    return sum(per_cluster) / len(per_cluster)


@pytest.mark.parametrize("self_pairs", [True, False])
def test_cluster_contrastive_loss_matches_the_pairwise_definition(self_pairs: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    p, z = torch.randn(20, 6, generator=generator), torch.randn(20, 6, generator=generator)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 5, 0, 1, 1, 7, 7, 7, 2, 9, 3])  # 5, 9: singletons
    got = cluster_contrastive_loss(p, z, labels, self_pairs=self_pairs).item()
    assert got == pytest.approx(_loop_cluster_loss(p, z, labels, self_pairs), abs=1e-6)


def test_cluster_contrastive_gradient_flows_only_through_the_predictor_output() -> None:
    generator = torch.Generator().manual_seed(1)
    p = torch.randn(12, 4, generator=generator, requires_grad=True)
    z = torch.randn(12, 4, generator=generator, requires_grad=True)
    cluster_contrastive_loss(p, z, torch.tensor([0, 1, 2] * 4)).backward()
    assert z.grad is None  # stop-gradient on every z_j
    assert p.grad is not None and p.grad.abs().sum() > 0


def test_network_gradient_is_exactly_the_one_through_the_predictor_path() -> None:
    """Backward through the whole net equals backpropagating dL/dp through p = h(f(x)) alone: the
    target side z_j = f(x_j) contributes nothing (stop-gradient), for the encoder and the predictor."""
    torch.manual_seed(0)
    net = CCFCNet("conv-small", 1, 8, latent_dim=8, projector_hidden=8, predictor_hidden=4)
    images, labels = torch.rand(16, 1, 8, 8), torch.tensor([0, 1, 1, 2] * 4)
    params = [param for param in net.parameters() if param.requires_grad]
    z, p = net(images)
    full = torch.autograd.grad(cluster_contrastive_loss(p, z, labels), params, allow_unused=True)
    z, p = net(images)
    p_leaf = p.detach().requires_grad_()
    (d_loss_d_p,) = torch.autograd.grad(cluster_contrastive_loss(p_leaf, z.detach(), labels), [p_leaf])
    through_p = torch.autograd.grad(p, params, grad_outputs=d_loss_d_p, allow_unused=True)
    for got, want in zip(full, through_p, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want)
    assert all(g is not None and g.abs().sum() > 0 for g in full[-4:])  # the predictor learns


def test_all_singleton_clusters_give_a_finite_zero_loss_and_zero_gradient() -> None:
    p = torch.randn(5, 3, requires_grad=True)
    z = torch.randn(5, 3)
    loss = cluster_contrastive_loss(p, z, torch.arange(5))
    assert torch.isfinite(loss) and loss.item() == 0.0
    loss.backward()
    assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p))


def test_model_contrastive_term_is_minus_cosine_and_the_global_side_is_fixed() -> None:
    generator = torch.Generator().manual_seed(2)
    p_local = torch.randn(7, 5, generator=generator, requires_grad=True)
    p_global = torch.randn(7, 5, generator=generator, requires_grad=True)
    loss = model_contrastive_loss(p_local, p_global)
    cosines = (p_local * p_global).sum(1) / (p_local.norm(dim=1) * p_global.norm(dim=1))
    assert loss.item() == pytest.approx(-cosines.mean().item(), abs=1e-6)
    loss.backward()
    assert p_global.grad is None and p_local.grad is not None
    same = torch.randn(3, 4)
    assert model_contrastive_loss(same, 2.5 * same).item() == pytest.approx(-1.0, abs=1e-6)


def test_simsiam_loss_is_symmetric_and_stops_gradients_at_z() -> None:
    generator = torch.Generator().manual_seed(3)
    p1, z1, p2, z2 = (torch.randn(6, 4, generator=generator, requires_grad=True) for _ in range(4))
    loss = simsiam_loss(p1, z1, p2, z2)
    assert loss.item() == pytest.approx(simsiam_loss(p2, z2, p1, z1).item(), abs=1e-7)
    loss.backward()
    assert z1.grad is None and z2.grad is None and p1.grad is not None


def _loop_info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> float:
    """NT-Xent written per anchor: -log softmax of the partner among the 2B - 1 other views."""
    views = torch.nn.functional.normalize(torch.cat([z1, z2]), dim=1).tolist()
    batch, losses = len(z1), []
    for a, anchor in enumerate(views):
        partner = (a + batch) % (2 * batch)
        logits = {
            b: sum(x * y for x, y in zip(anchor, v, strict=True)) / temperature for b, v in enumerate(views)
        }
        log_norm = np.log(sum(np.exp(value) for b, value in logits.items() if b != a))
        losses.append(log_norm - logits[partner])
    return float(np.mean(losses))


def test_info_nce_matches_the_per_anchor_definition_and_trains_both_views() -> None:
    generator = torch.Generator().manual_seed(4)
    z1, z2 = (torch.randn(5, 3, generator=generator, requires_grad=True) for _ in range(2))
    loss = info_nce_loss(z1, z2, 0.5)
    assert loss.item() == pytest.approx(_loop_info_nce(z1.detach(), z2.detach(), 0.5), abs=1e-5)
    loss.backward()
    assert z1.grad is not None and z2.grad is not None and z1.grad.abs().sum() > 0
    # matching views score lower than unrelated ones; the result is finite at a tiny temperature
    assert info_nce_loss(z1, 3 * z1, 0.5).item() < info_nce_loss(z1, z2, 0.5).item()
    assert torch.isfinite(info_nce_loss(z1, z2, 1e-4))


def test_cosine_assign_picks_the_most_similar_centroid_not_the_nearest() -> None:
    centroids = torch.tensor([[1.0, 0.0], [0.0, 10.0]])
    # (0.1, 0.2) is nearest to (1, 0) in Euclidean distance but at a smaller angle to (0, 10)
    z = torch.tensor([[5.0, 0.1], [0.1, 0.2], [-1.0, 0.0]])
    assert cosine_assign(z, centroids).tolist() == [0, 1, 1]


def test_phase_schedule() -> None:
    assert [phase_of(r, 2) for r in range(1, 6)] == [SETUP, PRETRAIN, PRETRAIN, CLUSTER, CLUSTER]
    assert phase_of(2, 0) == CLUSTER


# ------------------------------------------------------------------------------------------- client
def _run_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "method": "ccfc",
        "dataset": "digits",
        "num-clients": 3,
        "out-dir": str(tmp_path),
        "ccfc.batch-size": 32,
        "ccfc.local-steps": 2,
        "ccfc.latent-dim": 16,
        "ccfc.projector-hidden": 16,
        "ccfc.kmeans-samples": 200,
        **extra,
    }


def _client_context(run_config: dict[str, Any], pid: int = 0, state: RecordDict | None = None) -> Context:
    return Context(
        run_id=0,
        node_id=pid + 1,
        node_config={"partition-id": pid, "num-partitions": 3},
        state=state if state is not None else RecordDict(),
        run_config=run_config,
    )


def _client(context: Context) -> CCFCClient:
    return CCFCClient(context, parse_run_config(context.run_config))


def _global(params: CCFCConfig, seed: int = 0) -> list[np.ndarray]:
    return state_arrays(initial_model(params, DIGITS_SHAPE, seed))


def _adam_steps(context: Context, phase: str) -> int:
    saved = torch.load(io.BytesIO(context.state[optimizer_key(phase)]["state-dict"]), weights_only=True)
    return int(next(iter(saved["state"].values()))["step"])


def test_setup_reply_is_the_image_shape_and_no_arrays(tmp_path: Path) -> None:
    client = _client(_client_context(_run_config(tmp_path)))
    arrays, n, metrics = client.fit([], {"phase": SETUP, "server-round": 1})
    assert arrays == [] and n == client.data.n_samples
    assert tuple(metrics[key] for key in SHAPE_KEYS) == DIGITS_SHAPE


def test_adam_state_persists_across_rounds_while_weights_come_from_the_server(tmp_path: Path) -> None:
    run_config = _run_config(tmp_path)
    params = parse_run_config(run_config).params(CCFCConfig)
    start = _global(params)
    context = _client_context(run_config)
    config = {"phase": PRETRAIN, "local-centroids": 0}
    after_one, _, _ = _client(context).fit(start, {**config, "server-round": 2})
    assert _adam_steps(context, PRETRAIN) == 2
    after_two, _, _ = _client(context).fit(start, {**config, "server-round": 3})  # a rebuilt client
    assert _adam_steps(context, PRETRAIN) == 4  # the moments of round 2 were restored, not restarted
    # the same global weights with a fresh optimizer (and fresh RNG/cursor) give different weights
    fresh, _, _ = _client(_client_context(run_config)).fit(start, {**config, "server-round": 3})
    assert any(not np.array_equal(a, b) for a, b in zip(after_two, fresh, strict=True))
    # the second round started from `start`, not from the client's own round-2 weights
    continued, _, _ = _client(context).fit(after_two, {**config, "server-round": 4})
    assert any(not np.array_equal(a, b) for a, b in zip(after_two, continued, strict=True))
    # the CCFC phase starts a fresh Adam, as the authors' code does, and drops the pre-training one
    centroids = np.random.default_rng(0).normal(size=(10, 16)).astype(np.float32)
    _client(context).fit([*after_two, centroids], {"phase": CLUSTER, "local-centroids": 1, "server-round": 5})
    assert _adam_steps(context, CLUSTER) == 2 and optimizer_key(PRETRAIN) not in context.state


def test_client_replies_weights_and_centroids_and_is_reproducible(tmp_path: Path) -> None:
    run_config = _run_config(tmp_path)
    params = parse_run_config(run_config).params(CCFCConfig)
    start = _global(params)
    config = {"phase": PRETRAIN, "local-centroids": 1, "server-round": 2}
    arrays, n, metrics = _client(_client_context(run_config)).fit(start, config)
    schema = state_schema(initial_model(params, DIGITS_SHAPE, 0))
    assert len(arrays) == len(schema) + 1 and arrays[-1].shape == (10, 16) and arrays[-1].dtype == np.float32
    assert metrics[FINGERPRINT_KEY] == schema.fingerprint and metrics["train-steps"] == 2
    again, _, _ = _client(_client_context(run_config)).fit(start, config)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, again, strict=True))
    labels = _client(_client_context(run_config)).predict(arrays, {})
    assert labels.shape == (n,) and labels.min() >= 0 and labels.max() < 10


def test_pretrain_loss_infonce_trains_on_the_contrastive_objective(tmp_path: Path) -> None:
    config = {"phase": PRETRAIN, "server-round": 2}
    replies = {}
    for loss in ("simsiam", "infonce"):
        run_config = _run_config(tmp_path, **{"ccfc.pretrain-loss": loss})
        start = _global(parse_run_config(run_config).params(CCFCConfig))
        replies[loss] = _client(_client_context(run_config)).fit(start, config)
    # InfoNCE over 2 x 32 views starts near log(63) ~ 4.1; SimSiam's negative cosine is at most 1
    assert replies["infonce"][2]["train-sample"] > 3
    assert replies["simsiam"][2]["train-sample"] <= 1
    assert not np.array_equal(replies["infonce"][0][0], replies["simsiam"][0][0])


def test_fit_predictor_trains_only_the_predictor_on_stop_gradient_views(tmp_path: Path) -> None:
    """fit-predictor adds D(h(sg z1), sg z2)/2 + D(h(sg z2), sg z1)/2: h learns, f's gradient is unchanged."""
    params = parse_run_config(_run_config(tmp_path, **{"ccfc.pretrain-loss": "infonce"})).params(CCFCConfig)
    grads, images = {}, torch.rand(16, *DIGITS_SHAPE)
    for fit in (False, True):
        model = initial_model(params, DIGITS_SHAPE, 0)
        objective = SampleContrastiveObjective(
            contrastive_augmenter(1), torch.Generator().manual_seed(3), None, 0.0, 0.5, fit
        )
        terms = objective(model, images)
        terms["loss"].backward()
        grads[fit] = {name: p.grad for name, p in model.named_parameters()}
        assert ("predictor" in terms) == fit
    assert all(grads[False][n] is None for n in grads[False] if n.startswith("predictor."))
    for name, grad in grads[True].items():
        if name.startswith("predictor."):
            assert grad is not None and grad.abs().sum() > 0
        else:
            torch.testing.assert_close(grad, grads[False][name], rtol=0, atol=0)


@pytest.mark.parametrize("centroid_model, same", [("global", True), ("local", False)])
def test_centroid_model_global_clusters_the_received_model(
    tmp_path: Path, centroid_model: str, same: bool
) -> None:
    """With centroid-model=global the local centroids do not depend on local training (here: its lr)."""
    config = {"phase": PRETRAIN, "local-centroids": 1, "server-round": 2}
    centroids = []
    for lr in (1e-3, 1e-1):
        run_config = _run_config(tmp_path, **{"ccfc.centroid-model": centroid_model, "ccfc.lr": lr})
        start = _global(parse_run_config(run_config).params(CCFCConfig))
        arrays, _, _ = _client(_client_context(run_config)).fit(start, config)
        centroids.append(arrays[-1])
    assert np.array_equal(centroids[0], centroids[1]) == same


def test_standalone_client_keeps_its_model_and_sends_no_arrays(tmp_path: Path) -> None:
    run_config = _run_config(tmp_path, **{"ccfc.federation": "standalone"})
    start = _global(parse_run_config(run_config).params(CCFCConfig))
    context = _client_context(run_config)
    arrays, _, metrics = _client(context).fit(
        start, {"phase": PRETRAIN, "local-centroids": 1, "server-round": 2}
    )
    assert arrays == [] and FINGERPRINT_KEY not in metrics
    assert "ccfc.own-model" in context.state and "ccfc.own-centroids" in context.state
    marker = [np.zeros((0,), np.float32)]  # what a standalone server broadcasts
    _client(context).fit(marker, {"phase": CLUSTER, "local-centroids": 1, "server-round": 3})
    labels = _client(context).predict(marker, {})
    assert labels.shape == (_client(context).data.n_samples,)


@pytest.mark.parametrize(
    ("phase2_loss", "pretrain_loss", "expected"),
    [("cluster", "infonce", None), ("sample", "simsiam", "simsiam"), ("sample", "infonce", "infonce")],
)
def test_phase2_objective_follows_the_ablation_key(
    tmp_path: Path, phase2_loss: str, pretrain_loss: str, expected: str | None
) -> None:
    """SCFC (phase2-loss = sample) keeps training with the pre-training loss, whichever it is."""
    run_config = _run_config(
        tmp_path, **{"ccfc.phase2-loss": phase2_loss, "ccfc.pretrain-loss": pretrain_loss}
    )
    client = _client(_client_context(run_config))
    reference = torch.nn.Identity()
    objective = client._objective(
        CLUSTER, reference, torch.eye(10, 16), torch.Generator(), torch.device("cpu")
    )
    if expected is None:
        assert isinstance(objective, ClusterObjective)
    else:
        assert isinstance(objective, SampleContrastiveObjective)
        assert (objective.temperature is None) == (expected == "simsiam")


def test_sample_weight_adds_the_pretraining_loss_to_eq4_and_phase2_lr_sets_the_ccfc_optimizer(
    tmp_path: Path,
) -> None:
    """sample-weight mu: the CCFC phase minimises Eq. 4 + mu * InfoNCE; phase2-lr is its Adam's rate."""
    run_config = _run_config(
        tmp_path, **{"ccfc.sample-weight": 0.5, "ccfc.pretrain-loss": "infonce", "ccfc.phase2-lr": 1e-4}
    )
    client = _client(_client_context(run_config))
    params = client.params
    assert (params.lr_of(PRETRAIN), params.lr_of(CLUSTER)) == (params.lr, 1e-4)
    model, reference = (initial_model(params, DIGITS_SHAPE, seed) for seed in (0, 1))
    images = torch.rand(12, *DIGITS_SHAPE)
    objective = client._objective(
        CLUSTER, reference.eval(), torch.randn(10, 16), torch.Generator().manual_seed(0), torch.device("cpu")
    )
    assert isinstance(objective, ClusterObjective) and objective.sample is not None
    assert objective.sample.lam == 0.0  # R is counted once, in Eq. 4
    assert not objective.sample.fit_predictor  # Eq. 1 trains h in this phase
    terms = objective(model, images)
    expected = terms["cluster"] + params.lam * terms["model"] + 0.5 * terms["sample"]
    torch.testing.assert_close(terms["loss"], expected)
    assert terms["sample"].item() > 0  # InfoNCE over 24 views is at least log(1) and positive here
    plain = _client(_client_context(_run_config(tmp_path)))._objective(
        CLUSTER, reference, torch.randn(10, 16), torch.Generator(), torch.device("cpu")
    )
    assert plain.sample is None and "sample" not in plain(model, images)


# ----------------------------------------------------------------------------------------- strategy
def _fit_res(arrays: list[np.ndarray], metrics: dict[str, Any], n: int) -> FitRes:
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)


def _strategy(tmp_path: Path, **extra: Any) -> tuple[CCFCStrategy, RunConfig]:
    cfg = parse_run_config(
        {
            "method": "ccfc",
            "dataset": "digits",
            "num-clients": 3,
            "num-rounds": 6,
            "k": 4,
            "out-dir": str(tmp_path),
            "ccfc.pretrain-rounds": 2,
            "ccfc.latent-dim": 8,
            "ccfc.projector-hidden": 8,
            **extra,
        }
    )
    return CCFCStrategy(cfg), cfg


def _set_up(strategy: CCFCStrategy) -> list[np.ndarray]:
    strategy.fit_config(1)
    shape = dict(zip(SHAPE_KEYS, DIGITS_SHAPE, strict=True))
    replies = [
        (mock_proxy(f"c{i}"), _fit_res([], {"partition-id": i, "k": 4, **shape}, 50)) for i in range(3)
    ]
    parameters, stats = strategy.aggregate_fit(1, replies, [])
    assert stats["accepted"] == 3
    assert parameters is not None
    return parameters_to_ndarrays(parameters)


def test_setup_builds_the_seeded_initial_model_from_the_reported_shape(tmp_path: Path) -> None:
    strategy, cfg = _strategy(tmp_path)
    broadcast = _set_up(strategy)
    expected = state_arrays(initial_model(cfg.params(CCFCConfig), DIGITS_SHAPE, cfg.seed))
    assert all(np.array_equal(a, b) for a, b in zip(broadcast, expected, strict=True))
    assert strategy.fit_config(2)["phase"] == PRETRAIN


def _model_reply(
    global_state: list[np.ndarray], shift: float, centroids: np.ndarray | None, fingerprint: str
) -> list[np.ndarray]:
    """The global state moved by `shift` (floats) and by int(shift) (integer buffers), + centroids."""
    moved = [a + (shift if a.dtype.kind == "f" else int(shift)) for a in global_state]
    moved = [m.astype(a.dtype) for m, a in zip(moved, global_state, strict=True)]
    return moved + ([centroids] if centroids is not None else [])


def test_round_averages_every_tensor_by_size_and_merges_centroids_with_bad_replies_left_out(
    tmp_path: Path,
) -> None:
    strategy, cfg = _strategy(tmp_path)
    global_state = _set_up(strategy)
    fingerprint = strategy.schema.fingerprint
    config = strategy.fit_config(3)  # the last pre-training round asks for centroids
    assert config["phase"] == PRETRAIN and config["local-centroids"] == 1
    rng = np.random.default_rng(0)
    blobs = rng.normal(size=(4, 8)) * 10
    local = [(blobs + rng.normal(scale=0.01, size=blobs.shape)).astype(np.float32) for _ in range(3)]
    metrics = {"k": 4, FINGERPRINT_KEY: fingerprint}
    good = [
        (
            mock_proxy("a"),
            _fit_res(
                _model_reply(global_state, 1.0, local[0], fingerprint), {**metrics, "partition-id": 0}, 100
            ),
        ),
        (
            mock_proxy("b"),
            _fit_res(
                _model_reply(global_state, 4.0, local[1], fingerprint), {**metrics, "partition-id": 1}, 300
            ),
        ),
    ]
    nan_state = _model_reply(global_state, 2.0, local[2], fingerprint)
    nan_state[0] = nan_state[0].copy()
    nan_state[0].flat[0] = np.nan
    wrong_shape = _model_reply(global_state, 2.0, local[2][:3], fingerprint)
    wrong_fingerprint = _model_reply(global_state, 2.0, local[2], fingerprint)
    bad = [
        (mock_proxy("nan"), _fit_res(nan_state, {**metrics, "partition-id": 2}, 100)),
        (mock_proxy("shape"), _fit_res(wrong_shape, {**metrics, "partition-id": 2}, 100)),
        (
            mock_proxy("fp"),
            _fit_res(wrong_fingerprint, {**metrics, FINGERPRINT_KEY: "0" * 16, "partition-id": 2}, 100),
        ),
    ]
    parameters, stats = strategy.aggregate_fit(3, [*good, *bad], [RuntimeError("client c lost")])
    assert stats == {"accepted": 2, "rejected": 3, "failures": 1}
    arrays = parameters_to_ndarrays(parameters)
    names = strategy.schema.names
    for name, got, start in zip(names, arrays[:-1], global_state, strict=True):
        assert got.dtype == start.dtype
        if start.dtype.kind == "f":  # (100 * 1 + 300 * 4) / 400 = 3.25 on every float tensor
            np.testing.assert_allclose(got, start + 3.25, rtol=0, atol=1e-5, err_msg=name)
        else:  # num_batches_tracked: rint((100 * 1 + 300 * 4) / 400) = 3
            np.testing.assert_array_equal(got, start + 3, err_msg=name)
    assert any("running_mean" in n for n in names) and any("num_batches_tracked" in n for n in names)
    centroids = arrays[-1]
    assert centroids.shape == (4, 8) and centroids.dtype == np.float32
    order = np.argsort(centroids[:, 0])
    np.testing.assert_allclose(centroids[order], blobs[np.argsort(blobs[:, 0])], atol=0.05)
    assert strategy.fit_config(4)["phase"] == CLUSTER  # global centroids exist: CCFC begins


def test_ccfc_phase_waits_for_global_centroids(tmp_path: Path) -> None:
    strategy, _ = _strategy(tmp_path)
    _set_up(strategy)
    strategy.fit_config(2)
    strategy.fit_config(3)
    assert strategy.aggregate_fit(3, [], [RuntimeError("everyone lost")]) == (
        None,
        {"accepted": 0, "rejected": 0, "failures": 1},
    )
    assert strategy.fit_config(4)["phase"] == PRETRAIN  # no centroids yet: keep pre-training


def _checkpoint(path: Path, state: list[np.ndarray], names: list[str], centroids: np.ndarray) -> Path:
    np.savez(path, **{f"state.{n}": a for n, a in zip(names, state, strict=True)}, centroids=centroids)
    return path


def test_init_model_starts_from_a_checkpoint_and_goes_straight_to_ccfc(tmp_path: Path) -> None:
    probe, cfg = _strategy(tmp_path / "probe")
    _set_up(probe)
    state = [a + 1 if a.dtype.kind == "f" else a for a in probe.global_state]
    centroids = np.arange(32, dtype=np.float32).reshape(4, 8)
    path = _checkpoint(tmp_path / "model.npz", state, probe.schema.names, centroids)
    strategy, _ = _strategy(tmp_path / "run", **{"ccfc.init-model": str(path), "ccfc.pretrain-rounds": 0})
    broadcast = _set_up(strategy)
    assert all(np.array_equal(a, b) for a, b in zip(broadcast, [*state, centroids], strict=True))
    assert strategy.fit_config(2)["phase"] == CLUSTER


def test_init_model_of_another_shape_stops_the_run(tmp_path: Path) -> None:
    probe, _ = _strategy(tmp_path / "probe")
    _set_up(probe)
    state = list(probe.global_state)
    state[0] = np.zeros((3, 3), np.float32)
    path = _checkpoint(tmp_path / "model.npz", state, probe.schema.names, np.zeros((4, 8), np.float32))
    strategy, _ = _strategy(tmp_path / "run", **{"ccfc.init-model": str(path)})
    with pytest.raises(CheckpointError, match="shape"):
        _set_up(strategy)


def test_average_models_weights_by_client_size() -> None:
    states = [
        [np.array([1.0, 2.0], np.float32), np.array(4, np.int64)],
        [np.array([3.0, 6.0], np.float32), np.array(8, np.int64)],
    ]
    averaged = average_models(states, [1, 3])
    np.testing.assert_allclose(averaged[0], [2.5, 5.0])
    assert averaged[1] == 7 and averaged[1].dtype == np.int64


def test_merge_centroids_needs_k_local_centroids() -> None:
    with pytest.raises(ValueError, match="only 3 local centroids"):
        merge_centroids([np.zeros((3, 2), np.float32)], 4, seed=0)


# ----------------------------------------------------------------------------------------- end to end
def _digits_run(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    overrides = {
        "method": "ccfc",
        "dataset": "digits",
        "num-clients": 5,
        "num-rounds": 7,
        "seed": 0,
        "ccfc.pretrain-rounds": 3,
        "ccfc.batch-size": 64,
        "ccfc.kmeans-samples": 200,
        **extra,
    }
    return execute(build_overrides(overrides, tmp_path), engine="inprocess", quiet=True)


def test_ccfc_end_to_end_on_digits(tmp_path: Path) -> None:
    summary = _digits_run(tmp_path)
    assert summary["rounds"] == 7
    assert summary["phases"] == {
        "1": SETUP,
        "2": PRETRAIN,
        "3": PRETRAIN,
        "4": PRETRAIN,
        "5": CLUSTER,
        "6": CLUSTER,
        "7": CLUSTER,
    }
    assert summary["metrics"]["nmi"] > 0.4 and summary["metrics"]["kappa"] > 0.3
    assert set(summary["client_metrics"]) == {"0", "1", "2", "3", "4"}
    saved = np.load(tmp_path / "global_model.npz")
    assert saved["centroids"].shape == (10, 256)


def test_ccfc_completes_with_half_the_clients_sitting_out_each_round(tmp_path: Path) -> None:
    summary = _digits_run(tmp_path, **{"dropout-rate": 0.5, "num-rounds": 4, "ccfc.pretrain-rounds": 1})
    assert summary["rounds"] == 4 and summary["metrics"]["nmi"] > 0
    for round_number in ("2", "3", "4"):
        record = summary["participation"][round_number]
        assert len(record["dropped"]) == 2 and len(record["accepted"]) == 3  # round(0.5 * 5) = 2 sit out


def test_fit_predictor_leaves_sample_contrastive_runs_without_lambda_unchanged(tmp_path: Path) -> None:
    """SCFC with lambda = 0 never sends a gradient through h, so fitting h changes h and nothing else:
    the README reuses those ablation columns across the option, and this is why that is sound."""
    scfc = {
        "ccfc.pretrain-loss": "infonce",
        "ccfc.phase2-loss": "sample",
        "ccfc.lambda": 0.0,
        "ccfc.backbone": "conv-small",
        "num-rounds": 5,
        "ccfc.pretrain-rounds": 2,
        "max-samples": 500,  # an identity of the two runs, whatever the data's size
    }
    runs = {}
    for fit in (True, False):
        out = tmp_path / f"fit-{fit}"
        summary = _digits_run(out, **scfc, **{"ccfc.fit-predictor": fit})
        runs[fit] = (summary, np.load(out / "global_model.npz"))
    (with_fit, model_with), (without, model_without) = runs[True], runs[False]
    assert with_fit["metrics"] == without["metrics"]
    predictor = [name for name in model_with.files if "predictor" in name]
    encoder = [name for name in model_with.files if name not in predictor and name != "centroids"]
    assert predictor and encoder
    assert all(np.array_equal(model_with[name], model_without[name]) for name in encoder)
    assert np.array_equal(model_with["centroids"], model_without["centroids"])
    assert not all(np.array_equal(model_with[name], model_without[name]) for name in predictor)

"""Torch glue: state <-> arrays, reply validation, FedAvg, device, seeding, state that survives rounds,
the batch cursor and the training loop (all on CPU, a few seconds)."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import pytest
import torch
from flwr.common import Context, RecordDict, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import FLOWER_LOGGER
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from torch import nn

from fedapp.neural.glue import (
    FINGERPRINT_KEY,
    ClientStateError,
    DeviceError,
    Rngs,
    StateMismatchError,
    client_rngs,
    gradient_arrays,
    load_gradients,
    load_state_arrays,
    resolve_device,
    restore_module,
    restore_optimizer,
    save_module,
    save_optimizer,
    seed_everything,
    set_deterministic,
    state_arrays,
    state_schema,
    weighted_average,
)
from fedapp.neural.training import BatchCursor, TrainingError, batch_gradients, train_steps
from fedapp.wire import ArraySpec, ReplyError, check_arrays

torch.set_num_threads(1)


class ConvBNNet(nn.Module):
    """conv + BatchNorm + dropout + linear, and a float64 buffer to show dtypes survive."""

    def __init__(self, width: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(width * 6 * 6, classes)
        self.register_buffer("scale", torch.ones(classes, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.bn(self.conv(x)))
        return self.head(self.drop(hidden.flatten(1))) * self.scale.float()


def trained_net(seed: int) -> ConvBNNet:
    """A net whose BN statistics and counter moved away from their initial values."""
    torch.manual_seed(seed)
    net = ConvBNNet()
    for _ in range(seed + 1):
        net(torch.randn(5, 1, 6, 6))
    return net


# --------------------------------------------------------------------------- state <-> arrays
def test_round_trip_keeps_every_tensor_buffer_and_dtype():
    source, target = trained_net(1), ConvBNNet()
    arrays = state_arrays(source)
    schema = state_schema(source)
    assert schema.names == list(source.state_dict())  # state_dict order, buffers included
    assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "scale"} <= set(schema.names)
    dtypes = {spec.name: spec.dtype for spec in schema.tensors}
    assert (dtypes["bn.num_batches_tracked"], dtypes["scale"], dtypes["conv.weight"]) == (
        "int64",
        "float64",
        "float32",
    )
    wire = parameters_to_ndarrays(ndarrays_to_parameters(arrays))  # through Flower's serialisation
    load_state_arrays(target, wire, fingerprint=schema.fingerprint)
    for (name, want), (_, got) in zip(source.state_dict().items(), target.state_dict().items(), strict=True):
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want), name
    assert int(target.bn.num_batches_tracked) == 2


def test_state_arrays_are_copies():
    net = ConvBNNet()
    arrays = state_arrays(net)
    with torch.no_grad():
        net.conv.weight.add_(1.0)
    assert not np.array_equal(arrays[state_schema(net).names.index("conv.weight")], net.conv.weight.detach())


def test_parts_split_parameters_from_buffers():
    net = ConvBNNet()
    trainable, buffers = state_schema(net, "trainable").names, state_schema(net, "buffers").names
    assert buffers == ["scale", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert sorted(trainable + buffers) == sorted(state_schema(net).names)
    net.conv.requires_grad_(False)
    assert "conv.weight" not in state_schema(net, "trainable").names


def _bad_replies() -> dict[str, tuple[list[np.ndarray], str]]:
    good = state_arrays(ConvBNNet())
    at = state_schema(ConvBNNet()).names.index

    def changed(name: str, array: np.ndarray) -> list[np.ndarray]:
        return [array if i == at(name) else a.copy() for i, a in enumerate(good)]

    nan = changed("bn.running_mean", np.array([0.0, np.nan, 0.0, 0.0], np.float32))
    return {
        "missing": (good[:-1], "expected 10 arrays, got 9: first missing 'head.bias'"),
        "extra": ([*good, np.zeros(2)], "expected 10 arrays, got 11: first extra has shape"),
        "shape": (
            changed("conv.bias", np.zeros(5, np.float32)),
            r"'conv.bias' has shape \(5,\), expected \(4,\)",
        ),
        "dtype": (
            changed("conv.weight", good[at("conv.weight")].astype(np.float64)),
            "'conv.weight' has dtype float64, expected float32",
        ),
        "counter": (
            changed("bn.num_batches_tracked", np.array(1.0, np.float32)),
            "'bn.num_batches_tracked' has dtype float32, expected kind 'i'",
        ),
        "nan": (nan, "'bn.running_mean' contains NaN"),
    }


@pytest.mark.parametrize("case", list(_bad_replies()))
def test_mismatched_reply_is_rejected_with_client_and_tensor_and_never_loaded(case):
    arrays, message = _bad_replies()[case]
    net = ConvBNNet()
    before = state_arrays(net)
    with pytest.raises(StateMismatchError, match=f"^client 7: {message}"):
        load_state_arrays(net, arrays, sender="client 7")
    assert all(np.array_equal(a, b) for a, b in zip(before, state_arrays(net), strict=True))


def test_renamed_tensors_are_caught_by_the_fingerprint():
    class Renamed(ConvBNNet):  # same shapes and dtypes, another name for the head
        def __init__(self) -> None:
            super().__init__()
            self.classifier = self.head
            del self.head

    theirs, ours = state_schema(Renamed()), state_schema(ConvBNNet())
    arrays = state_arrays(Renamed())
    assert theirs.fingerprint != ours.fingerprint
    with pytest.raises(StateMismatchError, match="^client 2: state fingerprint"):
        ours.check(arrays, sender="client 2", fingerprint=theirs.fingerprint)
    with pytest.raises(StateMismatchError, match="^client 2: state fingerprint"):
        ours.check_fingerprint({FINGERPRINT_KEY: theirs.fingerprint}, sender="client 2")
    with pytest.raises(StateMismatchError, match="metrics lack a string 'state-fingerprint'"):
        ours.check_fingerprint({}, sender="client 2")
    ours.check(state_arrays(ConvBNNet()), sender="client 2", fingerprint=ours.fingerprint)


def test_array_specs_fit_a_strategy_reply_spec_with_extra_arrays():
    schema = state_schema(ConvBNNet())
    specs = [*schema.array_specs(), ArraySpec("centroids", (3, None))]
    arrays = [*state_arrays(ConvBNNet()), np.zeros((3, 8))]
    check_arrays(arrays, specs)
    index = schema.names.index("bn.weight")
    arrays[index] = arrays[index].astype(np.float16)  # right kind, wrong exact dtype
    with pytest.raises(ReplyError, match="'bn.weight' has dtype float16, expected float32"):
        check_arrays(arrays, specs)


def test_bfloat16_state_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="'weight' has dtype torch.bfloat16"):
        state_schema(nn.Linear(2, 2).to(torch.bfloat16))


# ------------------------------------------------------------------------------------ FedAvg
def test_weighted_average_of_states_with_unequal_weights():
    states = [state_arrays(trained_net(seed)) for seed in (0, 1, 2)]
    weights = [10, 30, 5]
    averaged = weighted_average(states, weights)
    names = state_schema(ConvBNNet()).names
    for name, got, column in zip(names, averaged, zip(*states, strict=True), strict=True):
        assert got.dtype == column[0].dtype and got.shape == column[0].shape, name
        if got.dtype.kind == "f":
            want = sum(w * a.astype(np.float64) for w, a in zip(weights, column, strict=True)) / sum(weights)
            np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=name)
    counter = averaged[names.index("bn.num_batches_tracked")]
    assert counter.dtype == np.int64 and int(counter) == 2  # (10*1 + 30*2 + 5*3) / 45 = 1.89 -> 2
    np.testing.assert_array_equal(averaged[names.index("scale")], np.ones(3))
    # the running variance of the heavy client dominates: a float mean, not a vote
    var = names.index("bn.running_var")
    assert np.abs(averaged[var] - states[1][var]).max() < np.abs(averaged[var] - states[0][var]).max()


def test_integer_average_rounds_half_to_even_and_equal_counts_stay():
    counts = [[np.array(3, np.int64)], [np.array(4, np.int64)]]
    assert int(weighted_average(counts, [1, 1])[0]) == 4  # 3.5 -> 4 (half to even)
    assert int(weighted_average([[np.array(5)], [np.array(5)]], [2, 7])[0]) == 5


@pytest.mark.parametrize(
    ("states", "weights", "message"),
    [
        ([[np.ones(2)], [np.array([1.0, np.nan])]], [1, 1], "NaN or infinite"),
        ([[np.ones(2)], [np.ones(3)]], [1, 1], "array 0 of state 1 is float64"),
        ([[np.ones(2)], [np.ones(2, np.float32)]], [1, 1], "array 0 of state 1 is float32"),
        ([[np.ones(2)], [np.ones(2), np.ones(1)]], [1, 1], "state 1 has 2 arrays"),
        ([[np.ones(2)], [np.ones(2)]], [1, 0], "positive and finite"),
        ([[np.ones(2)]], [1, 2], "one weight per state"),
        ([[np.array([True])], [np.array([False])]], [1, 1], "has no weighted mean"),
    ],
)
def test_weighted_average_refuses_what_validation_should_have_caught(states, weights, message):
    with pytest.raises(ValueError, match=message):
        weighted_average(states, weights)


# ------------------------------------------------------------------------------------ gradients
def test_weighted_client_gradients_equal_the_union_batch_gradient():
    """gFedNTM Eq. 2: the n-weighted mean of per-client mean-loss gradients is the union batch's."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = torch.randn(11, 5), torch.randn(11, 2)

    def loss(batch):
        return nn.functional.mse_loss(net(x[batch]), y[batch])

    parts = [np.arange(0, 4), np.arange(4, 11)]
    grads = [batch_gradients(net, loss, part)[0] for part in parts]
    federated = weighted_average(grads, [len(part) for part in parts])
    union, terms = batch_gradients(net, loss, np.arange(11))
    assert set(terms) == {"loss"}
    for got, want in zip(federated, union, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # the server writes the mean into .grad and steps: same as a local step on the union batch
    server, local = [nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)) for _ in range(2)]
    for model in (server, local):
        load_state_arrays(model, state_arrays(net))
    load_gradients(server, union, sender="aggregate")
    torch.optim.SGD(server.parameters(), lr=0.1).step()
    batch_gradients(local, lambda b: nn.functional.mse_loss(local(x[b]), y[b]), np.arange(11))
    torch.optim.SGD(local.parameters(), lr=0.1).step()
    for a, b in zip(state_arrays(server), state_arrays(local), strict=True):
        np.testing.assert_array_equal(a, b)


def test_missing_gradient_and_bad_gradient_arrays_are_errors():
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    net[0](torch.ones(1, 2)).sum().backward()  # net[1] gets no gradient
    with pytest.raises(ValueError, match="parameter '1.weight' got no gradient"):
        gradient_arrays(net)
    with pytest.raises(StateMismatchError, match="client 4: '0.bias' has shape"):
        load_gradients(net, [np.zeros((2, 2), np.float32), np.zeros(3, np.float32)] * 2, sender="client 4")


# --------------------------------------------------------------------------------------- device
def test_resolve_device(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="device=cuda but torch .* sees no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="device must be one of auto | cpu | cuda, got 'gpu'"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")


# -------------------------------------------------------------------------------------- seeding
def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.random()), torch.rand(3).tolist()


def test_seed_everything_repeats_every_global_stream():
    seed_everything(11)
    first = _draws()
    seed_everything(11)
    assert _draws() == first
    seed_everything(12)
    assert _draws() != first


def test_explicit_generators_are_seeded_and_independent_of_the_globals():
    a, b, c = Rngs.from_seed(3), Rngs.from_seed(3), Rngs.from_seed(4)
    assert a.numpy.random() == b.numpy.random() != c.numpy.random()
    assert torch.equal(torch.rand(4, generator=a.torch), torch.rand(4, generator=b.torch))
    torch.manual_seed(3)
    assert not torch.equal(torch.rand(4), torch.rand(4, generator=Rngs.from_seed(3).torch))


@pytest.fixture
def restore_determinism():
    flags = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(flags[0])
    torch.backends.cudnn.deterministic = flags[1]
    if workspace is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def test_deterministic_mode_sets_and_clears_the_flags(restore_determinism):
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic


# ------------------------------------------------------------------------------------ cursor
def test_cursor_visits_each_sample_once_per_epoch_with_a_short_last_batch():
    cursor = BatchCursor(n_samples=50, batch_size=8, seed=5)
    assert cursor.steps_per_epoch == 7
    orders = []
    for epoch in range(3):
        batches = list(cursor.rest_of_epoch())
        assert [len(b) for b in batches] == [8] * 6 + [2]  # leftovers: a short batch, never padded
        order = np.concatenate(batches)
        assert sorted(order) == list(range(50))
        assert (cursor.epoch, cursor.position) == (epoch + 1, 0)
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])  # a fresh permutation per epoch


def test_cursor_drop_last_skips_different_leftovers_each_epoch():
    cursor = BatchCursor(n_samples=50, batch_size=8, seed=5, drop_last=True)
    assert cursor.steps_per_epoch == 6
    epochs = [np.concatenate(list(cursor.rest_of_epoch())) for _ in range(2)]
    assert all(len(e) == 48 == len(set(e)) for e in epochs)
    assert set(range(50)) - set(epochs[0]) != set(range(50)) - set(epochs[1])
    with pytest.raises(ValueError, match="gives no batch"):
        BatchCursor(n_samples=5, batch_size=8, seed=0, drop_last=True)


def test_cursor_crosses_epochs_and_resumes_exactly():
    whole = BatchCursor(n_samples=20, batch_size=6, seed=9)
    reference = [b.tolist() for b in whole.take(9)]  # 4 steps per epoch: crosses two boundaries
    state = RecordDict()
    first = BatchCursor.resume(state, "cursor", n_samples=20, batch_size=6, seed=9)
    got = [b.tolist() for b in first.take(5)]
    assert first.steps_left_in_epoch == 3
    first.save(state, "cursor")
    state = recorddict_from_proto(recorddict_to_proto(state))
    second = BatchCursor.resume(state, "cursor", n_samples=20, batch_size=6, seed=9)
    assert (second.epoch, second.position) == (1, 6)
    got += [b.tolist() for b in second.take(4)]
    assert got == reference
    with pytest.raises(ClientStateError, match="has n-samples=20, this round 21"):
        BatchCursor.resume(state, "cursor", n_samples=21, batch_size=6, seed=9)
    assert BatchCursor(4, 2, seed=0, shuffle=False).next_batch().tolist() == [0, 1]


# ---------------------------------------------------------------- state that survives rounds
N, BATCH, STEPS_PER_ROUND, SEED = 50, 8, 6, 7  # 7 batches per epoch: round 2 crosses an epoch end


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(N, 1, 6, 6, generator=generator), torch.randint(0, 3, (N,), generator=generator)


CPU = torch.device("cpu")
DEVICES = [CPU] + ([torch.device("cuda")] if torch.cuda.is_available() else [])  # CUDA: where lent


def client_round(
    state: RecordDict,
    weights: list[np.ndarray],
    steps: int,
    skip: str = "",
    seed: int = SEED,
    device: torch.device = CPU,
) -> list[np.ndarray]:
    """One round of a client rebuilt from scratch: new model, optimizer and cursor, state from `state`."""
    features, labels = (tensor.to(device) for tensor in _data())
    model = ConvBNNet().to(device)  # built before client_rngs: its init draws must not shift the streams
    load_state_arrays(model, weights)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    if skip != "optimizer":
        restore_optimizer(state, "opt", optimizer)
    rng_key = f"rng-{len(state)}" if skip == "rng" else "rng"  # a new key: re-seeded, not restored
    with client_rngs(state, rng_key, seed) as rngs:
        if skip == "cursor":
            state.pop("cursor", None)
        cursor = BatchCursor.resume(state, "cursor", n_samples=N, batch_size=BATCH, seed=seed)

        def loss_fn(batch: np.ndarray) -> torch.Tensor:
            x = features[batch]
            if rngs.numpy.random() < 0.5:  # numpy Generator: a random flip
                x = x.flip(-1)
            x = x + 0.1 * torch.randn(x.shape, generator=rngs.torch).to(device)  # torch Generator: noise
            return nn.functional.cross_entropy(model(x), labels[batch])  # global RNG: dropout

        stats = train_steps(model, optimizer, loss_fn, cursor.take(steps), steps=steps)
    assert stats.steps == steps and np.isfinite(stats.mean_loss)
    save_optimizer(state, "opt", optimizer)
    cursor.save(state, "cursor")
    return state_arrays(model)


def two_rounds_rebuilt(skip: str = "", device: torch.device = CPU) -> list[np.ndarray]:
    weights = state_arrays(trained_net(0))
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    weights = client_round(context.state, weights, STEPS_PER_ROUND, skip, device=device)
    # between rounds: another client runs in the same process, the weights cross the wire, and the
    # node's state is serialised (as a SuperNode hands it to a fresh ClientApp process)
    client_round(RecordDict(), weights, 3, seed=99, device=device)
    weights = parameters_to_ndarrays(ndarrays_to_parameters(weights))
    context.state = recorddict_from_proto(recorddict_to_proto(context.state))
    return client_round(context.state, weights, STEPS_PER_ROUND, skip, device=device)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_two_rebuilt_rounds_equal_one_uninterrupted_run_bit_for_bit(device, restore_determinism):
    set_deterministic(device.type == "cuda")  # CPU is reproducible without it
    uninterrupted = client_round(
        RecordDict(), state_arrays(trained_net(0)), 2 * STEPS_PER_ROUND, device=device
    )
    rebuilt = two_rounds_rebuilt(device=device)
    names = state_schema(ConvBNNet()).names
    for name, got, want in zip(names, rebuilt, uninterrupted, strict=True):
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert int(rebuilt[names.index("bn.num_batches_tracked")]) == 1 + 2 * STEPS_PER_ROUND  # trained_net(0): 1


@pytest.mark.parametrize("skip", ["rng", "optimizer", "cursor"])
def test_without_restoring_a_piece_of_state_the_runs_differ(skip):
    """The control for the test above: each restored piece is needed for the equality."""
    uninterrupted = client_round(RecordDict(), state_arrays(trained_net(0)), 2 * STEPS_PER_ROUND)
    rebuilt = two_rounds_rebuilt(skip)
    assert not all(np.array_equal(a, b) for a, b in zip(rebuilt, uninterrupted, strict=True))


def test_rng_scope_isolates_clients_that_share_a_process():
    state_a, state_b = RecordDict(), RecordDict()
    with client_rngs(state_a, "rng", 1):
        first_a = (torch.rand(2).tolist(), random.random(), float(np.random.random()))
    with client_rngs(state_b, "rng", 2):
        torch.rand(100)
    with client_rngs(state_a, "rng", 1):
        second_a = (torch.rand(2).tolist(), random.random(), float(np.random.random()))
    with client_rngs(RecordDict(), "rng", 1):
        torch.rand(2), random.random(), np.random.random()
        continued = (torch.rand(2).tolist(), random.random(), float(np.random.random()))
    assert second_a == continued != first_a


def test_optimizer_state_mismatch_is_a_clear_error():
    state = RecordDict()
    net = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    save_optimizer(state, "opt", optimizer)
    two_groups = torch.optim.Adam([{"params": [net.weight]}, {"params": [net.bias]}])
    with pytest.raises(ClientStateError, match=r"context.state\['opt'\]"):
        restore_optimizer(state, "opt", two_groups)
    assert not restore_optimizer(RecordDict(), "opt", optimizer)


def test_module_state_survives_rounds_and_is_checked():
    state = RecordDict()
    save_module(state, "local", trained_net(2))
    state = recorddict_from_proto(recorddict_to_proto(state))
    restored = ConvBNNet()
    assert restore_module(state, "local", restored)
    for a, b in zip(state_arrays(restored), state_arrays(trained_net(2)), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ClientStateError, match="holds tensor 'scale' where the module has '0.weight'"):
        restore_module(state, "local", nn.Sequential(nn.Conv2d(1, 4, 3)))
    with pytest.raises(ClientStateError, match="'conv.weight' has shape"):
        restore_module(state, "local", ConvBNNet(width=5))
    assert not restore_module(RecordDict(), "local", restored)


# ------------------------------------------------------------------------------ training loop
def test_train_steps_reports_terms_and_logs_plain_lines_when_not_a_tty():
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    x, y = torch.randn(10, 3), torch.randn(10, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    FLOWER_LOGGER.addHandler(handler)
    try:
        stats = train_steps(
            net,
            optimizer,
            lambda b: {"loss": nn.functional.mse_loss(net(x[b]), y[b]), "half": torch.tensor(0.5)},
            BatchCursor(10, 2, seed=0).take(5),
            desc="client 0",
            log_every=2,
        )
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    assert stats.steps == 5 and stats.means["half"] == 0.5 and stats.seconds > 0
    assert set(stats.metrics()) == {"train-loss", "train-half", "train-steps", "train-seconds"}
    lines = [line for line in records if line.startswith("client 0: step")]
    assert [line.split()[3] for line in lines] == ["2", "4", "5"]  # every 2 steps and at the end


def test_train_steps_clips_and_stops_on_a_non_finite_loss():
    net = nn.Linear(4, 1)
    before = torch.cat([p.detach().flatten() for p in net.parameters()])
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    big = torch.full((2, 4), 100.0)
    train_steps(net, optimizer, lambda _: net(big).pow(2).mean(), [0], max_grad_norm=0.1)
    after = torch.cat([p.detach().flatten() for p in net.parameters()])
    assert torch.linalg.vector_norm(after - before) <= 0.1 + 1e-6  # SGD lr 1: the step is the clipped grad
    with pytest.raises(TrainingError, match="train: loss is nan at step 1"):
        train_steps(net, optimizer, lambda b: torch.tensor(b, requires_grad=True), [0.0, float("nan")])
    with pytest.raises(TypeError, match="without 'loss'"):
        train_steps(net, optimizer, lambda _: {"total": net(big).sum()}, [0])

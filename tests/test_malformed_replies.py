"""Property: whatever malformed replies arrive beside the honest ones, aggregation raises nothing and
its result is exactly the result of the honest replies alone (every strategy, every phase)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedapp.config.run import parse_run_config
from fedapp.methods.ccfc import SHAPE_KEYS
from strategies.ccfc import CCFCStrategy
from strategies.cefmc import CeFMCHStrategy, CeFMCStrategy
from strategies.fedcmv import FedCMvStrategy, FedFCMvStrategy
from strategies.ffcm import FFCMStrategy
from strategies.fstc import FSTCStrategy
from strategies.gfedntm import GFedNTMStrategy
from strategies.kfed import KFedStrategy
from tests.flower_mocks import mock_proxy

K, N, DIM = 3, 24, 4
Result = tuple[ClientProxy, FitRes]


def _result(cid: str, arrays: list[np.ndarray], metrics: dict[str, Any], n: int = 10) -> Result:
    return mock_proxy(cid), FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ------------------------------------------------------------------- strategies in a known state
def _cfg(tmp_path: Path, method: str, **extra: Any) -> Any:
    dataset = "digits-mv" if method in ("cefmc", "cefmc-h", "fedcmv", "fedfcmv") else "digits"
    dataset = "texts-demo" if method.startswith("fstc") else dataset
    keys = {"method": method, "dataset": dataset, "out-dir": str(tmp_path), "k": K, **extra}
    if dataset == "digits-mv":
        keys["num-clients"] = 3
    return parse_run_config(keys)


def kfed_round_one(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    rng = _rng(1)
    replies = [
        _result(
            f"c{i}", [rng.normal(size=(4, DIM)) + 5 * i, rng.integers(1, 9, 4)], {"partition-id": i, "k": K}
        )
        for i in range(3)
    ]
    return KFedStrategy(_cfg(tmp_path, "kfed")), 1, replies


def ffcm_init(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    rng = _rng(2)
    replies = [
        _result(f"c{i}", [rng.normal(size=(K, DIM)) + i, rng.uniform(1, 5, K)], {"partition-id": i, "k": K})
        for i in range(3)
    ]
    return FFCMStrategy(_cfg(tmp_path, "ffcm")), 1, replies


def ffcm_update(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    rng = _rng(3)
    strategy = FFCMStrategy(_cfg(tmp_path, "ffcm"))
    strategy.centres = rng.normal(size=(K, DIM))
    replies = [
        _result(f"c{i}", [rng.normal(size=(K, DIM)), rng.uniform(1, 5, K)], {"partition-id": i, "k": K})
        for i in range(3)
    ]
    return strategy, 2, replies


def _views(seed: int) -> list[np.ndarray]:
    rng = _rng(seed)
    return [np.linalg.qr(rng.normal(size=(N, K)))[0] for _ in range(3)]


def cefmc_init(tmp_path: Path, strategy_class: type = CeFMCStrategy) -> tuple[Any, int, list[Result]]:
    strategy = strategy_class(_cfg(tmp_path, strategy_class.method))
    replies = [_result(f"c{v}", [H], {"partition-id": v, "k": K}) for v, H in enumerate(_views(4))]
    return strategy, 1, replies


def cefmc_update(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    strategy, _, init = cefmc_init(tmp_path)
    strategy.aggregate_fit(1, init, [])
    rng = _rng(5)
    replies = [
        _result(
            f"c{v}", [rng.integers(0, K, N).astype(np.uint8)], {"partition-id": v, "k": K, "objective": 1.5}
        )
        for v in range(3)
    ]
    return strategy, 2, replies


def cefmc_h_update(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    strategy, _, init = cefmc_init(tmp_path, CeFMCHStrategy)
    strategy.aggregate_fit(1, init, [])
    replies = [
        _result(f"c{v}", [H], {"partition-id": v, "k": K, "objective": 2.5}) for v, H in enumerate(_views(6))
    ]
    return strategy, 2, replies


def fedcmv_round(tmp_path: Path, strategy_class: type = FedCMvStrategy) -> tuple[Any, int, list[Result]]:
    rng = _rng(7)
    strategy = strategy_class(_cfg(tmp_path, strategy_class.method))
    replies = [
        _result(f"c{v}", [rng.uniform(0.1, 4.0, size=(N, K))], {"partition-id": v, "k": K}) for v in range(3)
    ]
    return strategy, 1, replies


def gfedntm_vocabulary(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    cfg = parse_run_config(
        {"method": "gfedntm", "dataset": "synthetic-lda-tiny", "out-dir": str(tmp_path), "device": "cpu"}
        | {"gfedntm.topics": K, "gfedntm.hidden": "4", "gfedntm.batch-size": 4}
    )
    terms = [np.array(["w000", "w001", "w003"]), np.array(["w000", "w002"]), np.array(["w001", "w002"])]
    replies = [
        _result(f"c{i}", [t, np.arange(1, t.size + 1)], {"partition-id": i, "k": K, "context-dim": 0}, n=8)
        for i, t in enumerate(terms)
    ]
    return GFedNTMStrategy(cfg), 1, replies


def gfedntm_step(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    from fedapp.neural.glue import FINGERPRINT_KEY, state_arrays, state_schema

    strategy, _, vocabulary = gfedntm_vocabulary(tmp_path)
    strategy.aggregate_fit(1, vocabulary, [])
    rng = _rng(8)
    fingerprint = state_schema(strategy.model).fingerprint
    replies = []
    for i in range(3):
        gradient = [
            rng.normal(size=a.shape).astype(a.dtype) for a in state_arrays(strategy.model, "trainable")
        ]
        buffers = state_arrays(strategy.model, "buffers")
        metrics = {"partition-id": i, "k": K, "step": 0, "loss": 1.0, FINGERPRINT_KEY: fingerprint}
        replies.append(_result(f"c{i}", [*gradient, *buffers], metrics, n=strategy.expected_documents(i)))
    return strategy, 2, replies


# CCFC: setup round (image shapes, no arrays), then pre-training rounds 2-3 (round 3 also sends local
# centroids: the next round is CCFC), then CCFC rounds (model + local centroids); a tiny 8x8 model.
CCFC_KEYS = {
    "num-rounds": 10,
    "eval-every": 10,  # round 2 is not evaluated: its replies carry the model only
    "ccfc.pretrain-rounds": 2,
    "ccfc.latent-dim": 8,
    "ccfc.projector-hidden": 8,
    "ccfc.predictor-hidden": 4,
}


def _ccfc_replies(strategy: CCFCStrategy, server_round: int, seed: int) -> list[Result]:
    """What `clients/ccfc.py` sends in a pre-training / CCFC round: the moved state dict (same dtypes)
    and, when the round asks for them, k local centroids (float32, k x latent-dim)."""
    from fedapp.neural.glue import FINGERPRINT_KEY

    assert strategy.schema is not None and strategy.global_state is not None
    rng = _rng(seed)
    blobs = rng.normal(size=(K, strategy.params.latent_dim)) * 5
    replies = []
    for i in range(3):
        state = [  # floats moved a little, integer buffers (num_batches_tracked) counted on
            np.asarray(a + rng.normal(scale=0.1, size=a.shape) if a.dtype.kind == "f" else a + i + 1, a.dtype)
            for a in strategy.global_state
        ]
        if strategy.wants_centroids(server_round):
            state.append((blobs + rng.normal(scale=0.05, size=blobs.shape)).astype(np.float32))
        metrics = {"partition-id": i, "k": K, "loss": -0.5, FINGERPRINT_KEY: strategy.schema.fingerprint}
        replies.append(_result(f"c{i}", state, metrics, n=20 + 10 * i))
    return replies


def _ccfc_through(tmp_path: Path, last_round: int) -> CCFCStrategy:
    """A CCFC strategy that has aggregated honest replies of rounds 1 .. last_round, as the protocol runs."""
    strategy = CCFCStrategy(_cfg(tmp_path, "ccfc", **CCFC_KEYS))
    strategy.fit_config(1)
    shape = dict(zip(SHAPE_KEYS, (1, 8, 8), strict=True))  # digits: 1 x 8 x 8
    setup = [_result(f"c{i}", [], {"partition-id": i, "k": K, **shape}, n=20 + 10 * i) for i in range(3)]
    assert strategy.aggregate_fit(1, setup, [])[0] is not None
    for server_round in range(2, last_round + 1):
        strategy.fit_config(server_round)
        replies = _ccfc_replies(strategy, server_round, seed=20 + server_round)
        assert strategy.aggregate_fit(server_round, replies, [])[0] is not None
    return strategy


def ccfc_pretrain(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    strategy = _ccfc_through(tmp_path, 1)
    assert strategy.fit_config(2)["phase"] == "pretrain" and not strategy.wants_centroids(2)
    return strategy, 2, _ccfc_replies(strategy, 2, seed=9)


def ccfc_cluster(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    strategy = _ccfc_through(tmp_path, 3)  # round 3 produced the global centroids
    assert strategy.fit_config(4)["phase"] == "cluster" and strategy.wants_centroids(4)
    return strategy, 4, _ccfc_replies(strategy, 4, seed=10)


# FSTC: round 1 = local k-means centres (K per client) + their sizes; rounds 2 .. num-rounds = K x D
# local centres + K sizes summing to the client's sample count; the last round adds the client's model.
FSTC_KEYS = {"num-clients": 3, "num-rounds": 3, "fstc.adapter-hidden": 4}


def fstc_init(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    rng = _rng(11)
    replies = []
    for i in range(3):
        counts = rng.integers(1, 6, 2 * K).astype(np.int64)
        centres = rng.normal(size=(2 * K, DIM)) + 3 * rng.integers(0, K, (2 * K, 1))
        replies.append(_result(f"c{i}", [centres, counts], {"partition-id": i, "k": K}, n=int(counts.sum())))
    return FSTCStrategy(_cfg(tmp_path, "fstc", **FSTC_KEYS)), 1, replies


def _fstc_train_replies(strategy: FSTCStrategy, server_round: int, seed: int) -> list[Result]:
    from fedapp.neural.glue import FINGERPRINT_KEY

    assert strategy.centres is not None and strategy.initial_model is not None
    rng = _rng(seed)
    final = server_round >= strategy.cfg.num_rounds
    replies = []
    for i in range(3):
        n = 12 + 5 * i
        counts = rng.multinomial(n, [0.5, 0.3, 0.2]).astype(np.int64)  # one cluster may be empty
        centres = strategy.centres + rng.normal(scale=0.2, size=strategy.centres.shape)
        arrays = [centres, counts]
        metrics: dict[str, Any] = {"partition-id": i, "k": K, "train-loss": 0.5, "step": 10 * server_round}
        if final:
            arrays += [
                (a + rng.normal(size=a.shape)).astype(a.dtype) if a.dtype.kind == "f" else a
                for a in strategy.initial_model
            ]
            metrics[FINGERPRINT_KEY] = strategy.schema.fingerprint
        replies.append(_result(f"c{i}", arrays, metrics, n=n))
    return replies


def _fstc_initialised(tmp_path: Path) -> FSTCStrategy:
    strategy, _, init = fstc_init(tmp_path)
    assert strategy.aggregate_fit(1, init, [])[0] is not None
    return strategy


def fstc_train(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    strategy = _fstc_initialised(tmp_path)
    return strategy, 2, _fstc_train_replies(strategy, 2, seed=12)


def fstc_final(tmp_path: Path) -> tuple[Any, int, list[Result]]:
    strategy = _fstc_initialised(tmp_path)
    assert strategy.aggregate_fit(2, _fstc_train_replies(strategy, 2, seed=12), [])[0] is not None
    return strategy, 3, _fstc_train_replies(strategy, 3, seed=13)


CASES: dict[str, Callable[[Path], tuple[Any, int, list[Result]]]] = {
    "kfed": kfed_round_one,
    "ffcm-init": ffcm_init,
    "ffcm-update": ffcm_update,
    "cefmc-init": cefmc_init,
    "cefmc-update": cefmc_update,
    "cefmc-h-update": cefmc_h_update,
    "fedcmv": fedcmv_round,
    "fedfcmv": lambda tmp_path: fedcmv_round(tmp_path, FedFCMvStrategy),
    "gfedntm-vocabulary": gfedntm_vocabulary,
    "gfedntm-step": gfedntm_step,
    "ccfc-pretrain": ccfc_pretrain,
    "ccfc-cluster": ccfc_cluster,
    "fstc-init": fstc_init,
    "fstc-train": fstc_train,
    "fstc-final": fstc_final,
}


# --------------------------------------------------------------------------- malformed replies
MUTATIONS = (
    "non-finite",
    "drop-array",
    "extra-array",
    "extra-axis",
    "wrong-dtype-kind",
    "no-partition-id",
    "string-partition-id",
    "wrong-k",
    "garbage-bytes",
    "oversized-bytes",
)


@st.composite
def malformed(draw: st.DrawFn, honest: list[Result]) -> Result:
    """A copy of one honest reply with one change that makes it invalid for every strategy."""
    _, source = honest[draw(st.integers(0, len(honest) - 1))]
    arrays = [np.array(a) for a in parameters_to_ndarrays(source.parameters)]
    metrics = dict(source.metrics)
    mutation = draw(st.sampled_from(MUTATIONS))
    index = draw(st.integers(0, len(arrays) - 1))
    parameters: Parameters | None = None
    if mutation == "non-finite":
        floats = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"] or [
            i
            for i, a in enumerate(arrays)
            if a.dtype.kind in "iu"  # terms (unicode) cannot hold NaN
        ]
        target = floats[draw(st.integers(0, len(floats) - 1))]
        arrays[target] = arrays[target].astype(np.float64)
        flat = arrays[target].reshape(-1)
        flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    elif mutation == "drop-array":
        arrays = arrays[:index] + arrays[index + 1 :] if len(arrays) > 1 else []
    elif mutation == "extra-array":
        arrays.append(np.zeros(draw(st.integers(1, 5))))
    elif mutation == "extra-axis":
        arrays[index] = arrays[index][..., None]
    elif mutation == "wrong-dtype-kind":
        kind = arrays[index].dtype.kind
        arrays[index] = (
            np.zeros(arrays[index].shape)  # terms (unicode) become numbers
            if kind == "U"
            else arrays[index].astype(np.int64 if kind == "f" else np.float64)
        )
    elif mutation == "no-partition-id":
        metrics.pop("partition-id")
    elif mutation == "string-partition-id":
        metrics["partition-id"] = str(metrics["partition-id"])
    elif mutation == "wrong-k":
        metrics["k"] = K + draw(st.integers(1, 5))
    elif mutation == "garbage-bytes":
        blob = draw(st.binary(min_size=0, max_size=64))
        parameters = Parameters(tensors=[blob] * len(arrays), tensor_type="numpy.ndarray")
    else:  # far more bytes than the reply can hold: refused before decoding (open shapes: decoded, then bad)
        parameters = Parameters(tensors=[b"\x93NUMPY" + b"\0" * (1 << 16)], tensor_type="numpy.ndarray")
    if parameters is None:
        parameters = ndarrays_to_parameters(arrays)
    cid = f"bad{draw(st.integers(0, 999))}"
    return mock_proxy(cid), FitRes(Status(Code.OK, ""), parameters, source.num_examples, metrics)


def _outcome(strategy: Any, server_round: int, results: list[Result]) -> list[np.ndarray] | None:
    parameters, _ = strategy.aggregate_fit(server_round, results, [])
    return None if parameters is None else parameters_to_ndarrays(parameters)


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_malformed_replies_never_change_the_honest_result(
    tmp_path: Path, case: str, data: st.DataObject
) -> None:
    reference, server_round, honest = CASES[case](tmp_path / "reference")
    expected = _outcome(reference, server_round, honest)
    assert expected is not None  # the honest replies alone do aggregate
    strategy, _, honest_again = CASES[case](tmp_path / "mixed")
    bad = data.draw(st.lists(malformed(honest), min_size=1, max_size=4), label="malformed replies")
    order = data.draw(st.permutations(honest_again + bad), label="arrival order")
    got = _outcome(strategy, server_round, list(order))  # must not raise
    assert got is not None and len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    record = strategy.record.participation[server_round]
    assert len(record["rejected"]) == len({proxy.cid for proxy, _ in bad} - {p.cid for p, _ in honest})

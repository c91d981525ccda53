"""Differential privacy for FSTC (with `fstc.dp-labels = model`), CCFC and gFedNTM (`fedapp.privacy.dp`):
what a
client sends is clipped before it is noised (payload tests: the arrays handed to the Gaussian mechanism,
spied on in small in-process runs), and the RDP accountant reports an epsilon spent within the target, per
record (FSTC) or per client."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedapp.privacy.dp
import fedapp.privacy.uplink
from clients.fstc import centre_statistics, private_model
from fedapp.config.run import parse_run_config
from fedapp.launch.resolve import build_overrides
from fedapp.methods import method_spec
from fedapp.privacy.dp import clip_joint, clip_rows, epsilon_spent, private_update
from fedapp.privacy.plan import dp_plan
from simulation.runner import execute
from tests.run_checks import assert_ran_through

DP = {"dp.epsilon": 2.0, "dp.delta": 1e-5}


# --------------------------------------------------------------------------------------- the maths
def test_one_huge_record_moves_fstc_statistics_by_at_most_the_sensitivity() -> None:
    rng = np.random.default_rng(0)
    records, centres = rng.normal(size=(50, 6)), rng.normal(size=(4, 6))
    huge = np.full((1, 6), 1e9)
    clip = 0.5
    without = centre_statistics(clip_rows(records, clip), centres)
    with_huge = centre_statistics(clip_rows(np.vstack([records, huge]), clip), centres)
    change = math.sqrt(sum(float(np.square(a - b).sum()) for a, b in zip(with_huge, without, strict=True)))
    assert 0 < change <= math.sqrt(clip**2 + 1) + 1e-9
    assert with_huge[1].sum() == 51  # every record counts once, for one cluster


def test_fstc_model_release_without_noise_is_the_initial_model_plus_a_clipped_delta() -> None:
    initial = [np.zeros((3, 4), np.float32), np.ones(5, np.float32)]
    trained = [np.full((3, 4), 100.0, np.float32), np.full(5, -50.0, np.float32)]
    sent = private_model(trained, initial, 0.25, 0.0, np.random.default_rng(0))
    delta = [s.astype(np.float64) - i for s, i in zip(sent, initial, strict=True)]
    assert math.sqrt(sum(float(np.square(d).sum()) for d in delta)) == pytest.approx(0.25, rel=1e-6)
    assert [s.dtype for s in sent] == [np.float32, np.float32]


def test_private_update_clips_released_arrays_and_returns_the_others_unchanged() -> None:
    received = [np.zeros(4), np.zeros(3), np.array(7, np.int64)]
    local = [np.full(4, 10.0), np.full(3, 10.0), np.array(9, np.int64)]
    state, extra = private_update(received, local, [True, False, False], 1.0, 0.0, np.random.default_rng(0))
    assert np.linalg.norm(state[0]) == pytest.approx(1.0)
    np.testing.assert_array_equal(state[1], received[1])  # not released: as received, not as trained
    assert int(state[2]) == 7 and extra == []


def test_new_methods_are_planned_and_validated() -> None:
    def training(method: str, dataset: str, rounds: int, **keys: object) -> int:
        cfg = parse_run_config({"method": method, "dataset": dataset, "num-rounds": rounds, **DP, **keys})
        return dp_plan(cfg).training

    assert training("fstc", "texts-demo", 4, **{"fstc.dp-labels": "model"}) == 5  # moments + 3 + the model
    assert training("fstc", "texts-demo", 4) == 4  # dp-labels = centres: no model
    assert training("ccfc", "digits", 6) == training("gfedntm", "synthetic-lda-tiny", 6) == 5
    units = tuple(method_spec(method).dp.unit for method in ("fstc", "ccfc", "gfedntm"))  # type: ignore[union-attr]
    assert units == ("record", "client", "client")
    for method, dataset in (("fstc", "texts-demo"), ("ccfc", "digits"), ("gfedntm", "synthetic-lda-tiny")):
        cfg = parse_run_config({"method": method, "dataset": dataset, **DP, "dp.model-clip": 0.5})
        assert cfg.dp.enabled and cfg.dp.model_clip == 0.5


# ------------------------------------------------------------------------------- payload + accountant
class Spy:
    """Records what reaches the Gaussian mechanism (the last step before a reply leaves the client)."""

    def __init__(self) -> None:
        self.statistics: list[tuple[list[np.ndarray], float]] = []
        self.norms_before: list[float] = []
        self.real_mechanism = fedapp.privacy.dp.gaussian_mechanism
        self.real_clip = fedapp.privacy.dp.clip_joint

    def mechanism(self, statistics: list[np.ndarray], sensitivity: float, z: float, rng: Any) -> Any:
        self.statistics.append(([np.array(s, copy=True) for s in statistics], sensitivity))
        return self.real_mechanism(statistics, sensitivity, z, rng)

    def clip(self, arrays: list[np.ndarray], clip: float) -> tuple[list[np.ndarray], float]:
        clipped, norm = self.real_clip(arrays, clip)
        self.norms_before.append(norm)
        return clipped, norm


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    spy = Spy()
    monkeypatch.setattr(fedapp.privacy.dp, "gaussian_mechanism", spy.mechanism)
    monkeypatch.setattr(fedapp.privacy.dp, "clip_joint", spy.clip)
    monkeypatch.setattr(fedapp.privacy.uplink, "gaussian_mechanism", spy.mechanism)
    return spy


def _run(tmp_path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    execute(build_overrides({"seed": 0, **DP, **overrides}, tmp_path), engine="inprocess", quiet=True)
    return json.loads((tmp_path / "summary.json").read_text())


def _check_accountant(summary: dict[str, Any], unit: str) -> dict[str, Any]:
    privacy = summary["privacy"]["dp"]
    assert_ran_through(summary, exit_code=None)
    assert privacy["unit"] == unit and privacy["accountant"] == "rdp"
    assert 0 < privacy["epsilon_spent"] <= privacy["epsilon_target"] == 2.0
    assert 1 <= privacy["releases"] <= privacy["planned_releases"]
    assert privacy["epsilon_spent"] == pytest.approx(
        epsilon_spent(privacy["noise_multiplier"], privacy["releases"], 1e-5)
    )
    return privacy


def _check_client_level(spy: Spy, model_clip: float) -> None:
    """Every part handed to the mechanism has norm <= model-clip, and clipping did bite (the raw update
    was larger): the reply is never the unclipped update."""
    parts = [stats for stats, _ in spy.statistics]
    assert parts and all(clip_joint(part, math.inf)[1] <= model_clip * (1 + 1e-9) for part in parts)
    assert max(spy.norms_before) > model_clip


def test_fstc_sends_only_clipped_noised_statistics_and_a_clipped_model(tmp_path: Path, spy: Spy) -> None:
    """`fstc.dp-labels = model`: the final model is released too (tests/test_fstc_dp_labels.py: centres)."""
    clip, model_clip = 0.5, 1e-3
    quick = {"fstc.local-iters": 5, "fstc.batch-size": 50, "fstc.warmup-iters": 2, "fstc.label-updates": 2}
    summary = _run(
        tmp_path,
        {
            "method": "fstc",
            "dataset": "texts-demo",
            "num-clients": 2,
            "num-rounds": 3,
            "dp.clip": clip,
            "dp.model-clip": model_clip,
            "fstc.dp-labels": "model",
            **quick,
        },
    )
    privacy = _check_accountant(summary, "record")
    assert privacy["releases"] == privacy["planned_releases"] == 4
    assert privacy["model"]["unit"] == "client" and privacy["model"]["noise_multiplier"] == pytest.approx(
        2 * privacy["noise_multiplier"]
    )
    statistics = [s for s, sensitivity in spy.statistics if sensitivity == pytest.approx(math.hypot(clip, 1))]
    assert len(statistics) == 2 * 2  # two clients x two training rounds
    for sums, counts in statistics:  # each cluster's sum holds `count` records of norm <= clip
        assert (np.linalg.norm(sums, axis=1) <= clip * counts + 1e-9).all()
        assert counts.sum() == pytest.approx(counts.sum().round()) and counts.sum() > 0
    models = [s for s, sensitivity in spy.statistics if sensitivity == pytest.approx(model_clip)]
    assert len(models) == 2  # one final model per client
    assert all(clip_joint(model, math.inf)[1] <= model_clip * (1 + 1e-9) for model in models)


def test_ccfc_sends_only_clipped_noised_updates(tmp_path: Path, spy: Spy) -> None:
    model_clip = 0.05
    summary = _run(
        tmp_path,
        {
            "method": "ccfc",
            "dataset": "digits",
            "num-clients": 3,
            "num-rounds": 4,
            "ccfc.pretrain-rounds": 1,
            "ccfc.batch-size": 32,
            "ccfc.local-steps": 2,
            "ccfc.latent-dim": 16,
            "ccfc.projector-hidden": 16,
            "ccfc.kmeans-samples": 200,
            "dp.model-clip": model_clip,
        },
    )
    privacy = _check_accountant(summary, "client")
    assert privacy["releases"] == privacy["planned_releases"] == 3 and privacy["clip"] == model_clip
    _check_client_level(spy, model_clip)
    # model delta and centroids are two parts of one release: sensitivity model-clip * sqrt(2)
    assert {round(s, 9) for _, s in spy.statistics} == {round(model_clip * math.sqrt(2), 9)}


def test_gfedntm_sends_only_clipped_noised_gradients(tmp_path: Path, spy: Spy) -> None:
    model_clip = 0.1
    summary = _run(
        tmp_path,
        {
            "method": "gfedntm",
            "dataset": "synthetic-lda-tiny",
            "num-clients": 3,
            "partition": "by-group",
            "num-rounds": 5,
            "eval-every": 4,
            "device": "cpu",
            "gfedntm.topics": 10,
            "gfedntm.batch-size": 30,
            "gfedntm.epochs": 1,
            "dp.model-clip": model_clip,
        },
    )
    privacy = _check_accountant(summary, "client")
    assert any("vocabulary" in item for item in privacy["not_covered"])
    _check_client_level(spy, model_clip)
    assert len(spy.statistics) == 3 * privacy["releases"]

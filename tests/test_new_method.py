"""The house's promise (docs/architecture.md): a method is four pieces plus one registry entry. The skeleton
method `means` (tests/skeleton/: its keys and DP schedule with its `MethodSpec`, a strategy, a client) is
registered by a fixture and nothing else in the project knows it; it runs in-process, under DP, and in
Flower's Ray simulation under SecAgg+, and each run ends with the final report written (every node's
assignments.csv, the saved model, label-free metrics)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedapp.launch.resolve import build_overrides
from fedapp.methods import METHODS, METHODS_ENV, MethodSpec, register, unregister
from simulation.runner import execute

ROOT = Path(__file__).resolve().parents[1]
SKELETON = "tests.skeleton.method"
KEYS = {"method": "means", "dataset": "digits", "num-clients": 3, "num-rounds": 4, "seed": 0}


@pytest.fixture
def means(monkeypatch: pytest.MonkeyPatch) -> Iterator[MethodSpec]:
    """The skeleton registered in this process and, through the environment, in every process of a run."""
    from tests.skeleton.method import SPEC

    register(SPEC)
    monkeypatch.setenv(METHODS_ENV, SKELETON)
    yield SPEC
    unregister(SPEC.name)


def _run(out: Path, engine: str, **extra: Any) -> dict[str, Any]:
    return execute(build_overrides({**KEYS, **extra}, out), engine, quiet=True)


def _assert_reported(out: Path, summary: dict[str, Any]) -> None:
    """The final report was written: every node's assignments of its 599 records, and the model."""
    assert summary["status"] == "completed", summary["status_reason"]
    for node in range(3):
        with (out / "nodes" / str(node) / "assignments.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == 599 and {int(row["cluster"]) for row in rows} <= set(range(10))
    assert json.loads((out / "model" / "model.json").read_text())["method"] == "means"


def test_nothing_outside_the_pieces_names_the_method() -> None:
    assert "means" not in METHODS  # only the fixture registers it
    for package in ("fedapp", "strategies", "clients", "simulation", "deploy"):
        for path in (ROOT / package).rglob("*.py"):
            assert "tests.skeleton" not in path.read_text(), path
    assert "[tool.flwr.app.config.means]" not in (ROOT / "pyproject.toml").read_text()  # keys left default


def test_the_skeleton_runs_in_process_plain_and_under_dp_with_its_report(
    means: MethodSpec, tmp_path: Path
) -> None:
    plain = _run(tmp_path / "plain", "inprocess")
    _assert_reported(tmp_path / "plain", plain)
    assert plain["metrics"]["nmi"] > 0.5  # 0.604: four Lloyd steps from the moments' draws
    assert plain["report"]["label_free"]["n_clusters_used"] == 10
    private = _run(tmp_path / "dp", "inprocess", **{"dp.epsilon": 8.0, "dp.noise-seed": 0})
    _assert_reported(tmp_path / "dp", private)
    dp = private["privacy"]["dp"]
    assert dp["releases"] == dp["planned_releases"] == 4 and dp["epsilon_spent"] <= 8.0
    assert 0.3 < private["metrics"]["nmi"] < plain["metrics"]["nmi"]  # 0.454 at eps = 8 (seeded noise)


@pytest.mark.e2e
def test_the_skeleton_runs_in_ray_under_secagg_with_its_report(means: MethodSpec, tmp_path: Path) -> None:
    secure = _run(tmp_path / "secure", "flwr", secagg=True)
    _assert_reported(tmp_path / "secure", secure)
    assert secure["secagg_clipped"] == 0
    plain = _run(tmp_path / "plain", "inprocess")
    assert abs(secure["metrics"]["nmi"] - plain["metrics"]["nmi"]) < 0.02  # SecAgg+'s quantisation only
    # the in-process engine runs the same ServerApp and ClientApp (SecAgg+'s workflow and client mod) over
    # a DirectGrid: Ray's numbers exactly, so the methods' SecAgg+ tests run in process (tests/test_secagg.py)
    same = _run(tmp_path / "secure-inprocess", "inprocess", secagg=True)
    assert same["metrics"] == pytest.approx(secure["metrics"], abs=1e-12)

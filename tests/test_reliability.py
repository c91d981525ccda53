"""Faults are normal: honest run status, dropouts, failed clients, minimum participation, bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

from fedapp.app.server_loop import FedappServer
from fedapp.config.run import parse_run_config
from fedapp.launch.resolve import build_overrides
from fedapp.report.records import EXIT_CODES, exit_code, write_json
from simulation.runner import execute
from strategies.ffcm import FFCMStrategy
from strategies.kfed import KFedStrategy
from tests.cli_timing import refusal_bound_s
from tests.flower_mocks import mock_manager, mock_proxy

ROOT = Path(__file__).resolve().parents[1]


def _centres_reply(pid: int, centres: np.ndarray) -> FitRes:
    arrays = [centres, np.full(len(centres), 5, dtype=np.int64)]
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 10, {"partition-id": pid, "k": 2})


def _run(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    return execute(build_overrides({"seed": 0, **overrides}, tmp_path), engine="inprocess", quiet=True)


# ------------------------------------------------------------------------------------------ status
def test_status_completed_converged_degraded(tmp_path: Path) -> None:
    completed = _run(tmp_path / "c", method="ffcm", dataset="digits", **{"num-clients": 3, "num-rounds": 3})
    assert completed["status"] == "completed" and completed["stop_reason"] == "max rounds (3)"
    converged = _run(tmp_path / "k", method="kfed", dataset="digits", **{"num-clients": 3, "num-rounds": 5})
    assert converged["status"] == "converged" and converged["stop_reason"] == "one-shot"
    assert converged["rounds"] == 1  # the loop stops as soon as the method is done
    degraded = _run(
        tmp_path / "d",
        method="ffcm",
        dataset="digits",
        **{"num-clients": 4, "num-rounds": 2, "dropout-rate": 0.5},
    )
    assert degraded["status"] == "degraded" and "sat out" in degraded["status_reason"]
    assert [exit_code(s) for s in (completed, converged, degraded)] == [0, 0, EXIT_CODES["degraded"]]
    # the files a person opens after the run are indented (while it runs they are rewritten on one line)
    assert (tmp_path / "c" / "summary.json").read_text().startswith('{\n  "')
    assert (tmp_path / "c" / "rounds.json").read_text().startswith("[\n  {")


def test_run_files_are_strict_json_on_one_line_while_running_and_indented_at_the_end(tmp_path: Path) -> None:
    payload = {"kappa": float("nan"), "scores": np.array([1.0, np.inf]), "pair": (1, -np.inf), "ok": 0.5}
    strict = {"kappa": None, "scores": [1.0, None], "pair": [1, None], "ok": 0.5}
    for compact in (True, False):
        write_json(tmp_path / "s.json", payload, compact=compact)
        text = (tmp_path / "s.json").read_text()
        assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in strict JSON")) == strict
        assert ("\n" in text) is not compact
    write_json(tmp_path / "s.json", {"round": 3, "metrics": {"nmi": 0.5}}, compact=True)
    assert (tmp_path / "s.json").read_text() == '{"round": 3, "metrics": {"nmi": 0.5}}'
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary file left behind


@pytest.mark.parametrize(
    ("method", "dataset", "table"),
    [("kfed", "digits", "kfed"), ("ffcm", "digits", "ffcm"), ("cefmc", "digits-mv", "cefmc")],
)
def test_dropout_half_completes_degraded_with_participation(
    tmp_path: Path, method: str, dataset: str, table: str
) -> None:
    keys = {"num-rounds": 6, "dropout-rate": 0.5, f"{table}.delta": 0.0} if table != "kfed" else {}
    summary = _run(tmp_path, method=method, dataset=dataset, **{"dropout-rate": 0.5, **keys})
    assert summary["status"] == "degraded" and summary["metrics"]
    first = summary["participation"]["1"]
    if method == "cefmc":  # the initialisation needs every view: dropout spares it
        assert first["dropped"] == [] and len(first["accepted"]) == 3
        later = summary["participation"]["2"]
        assert len(later["dropped"]) == 2 and len(later["accepted"]) == 1
        assert summary["stale_views"]  # rounds in which the missing views' last labels stood in
    else:
        assert len(first["dropped"]) == 5 and len(first["accepted"]) == 5  # 10 clients, rate 0.5
        assert set(first["dropped"]).isdisjoint(first["accepted"])


def test_a_crash_mid_run_is_recorded_as_failed(tmp_path: Path) -> None:
    strategy = KFedStrategy(parse_run_config({"out-dir": str(tmp_path), "num-clients": 2, "k": 2}))
    server = FedappServer(client_manager=mock_manager(["a", "b"]), strategy=strategy)
    with pytest.raises(ConnectionError):
        server.fit_round = MagicMock(side_effect=ConnectionError("SuperLink went away"))  # type: ignore[method-assign]
        server.fit(num_rounds=3, timeout=None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "SuperLink went away" in summary["status_reason"]
    assert "max rounds" not in summary["stop_reason"]


# ----------------------------------------------------------------------------- failed clients
def test_a_failed_client_is_excluded_and_the_rest_go_on(tmp_path: Path) -> None:
    strategy = FFCMStrategy(parse_run_config({"method": "ffcm", "out-dir": str(tmp_path), "k": 2}))
    manager = mock_manager(["a", "b", "c"])
    assert len(strategy.configure_fit(1, ndarrays_to_parameters([]), manager)) == 3
    replies = [(mock_proxy("a"), _mass_reply(0)), (mock_proxy("b"), _mass_reply(1))]
    parameters, _ = strategy.aggregate_fit(1, replies, [TimeoutError("c: message expired")])
    assert parameters is not None  # aggregated over the clients that answered
    assert strategy.roster.excluded == {"c": 1} and strategy.record.participation[1]["failed"] == ["c"]
    asked = [client.cid for client, _ in strategy.configure_fit(2, parameters, manager)]
    assert asked == ["a", "b"]  # c is not asked again, so it cannot cost another round-timeout


def _mass_reply(pid: int) -> FitRes:
    arrays = [np.array([[0.0, 0.0], [5.0, 5.0]]) + pid, np.array([3.0, 4.0])]
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 10, {"partition-id": pid, "k": 2})


def test_every_client_failing_stops_after_the_first_round_with_the_error(tmp_path: Path) -> None:
    """A client error that repeats identically (missing data, a bug) must not be retried for ever."""
    strategy = KFedStrategy(parse_run_config({"out-dir": str(tmp_path), "k": 2}))
    manager = mock_manager(["a", "b"])
    strategy.configure_fit(1, ndarrays_to_parameters([]), manager)
    errors = [ValueError("ClientAppException: no file /data/x.mat")] * 2
    assert strategy.aggregate_fit(1, [], errors)[0] is None
    assert strategy.configure_fit(2, ndarrays_to_parameters([]), manager) == []
    assert strategy.done and strategy.status == "failed"
    assert "no file /data/x.mat" in strategy.status_reason and "0 usable client" in strategy.status_reason


def test_too_few_valid_replies_lose_the_round(tmp_path: Path) -> None:
    strategy = KFedStrategy(parse_run_config({"out-dir": str(tmp_path), "k": 2, "min-fit-clients": 2}))
    strategy.configure_fit(1, ndarrays_to_parameters([]), mock_manager(["a", "b"]))
    centres = np.array([[0.0, 0.0], [1.0, 1.0]])
    parameters, stats = strategy.aggregate_fit(1, [(mock_proxy("a"), _centres_reply(0, centres))], [])
    assert parameters is None and stats["accepted"] == 1 and strategy.record.lost_rounds == [1]
    both = [(mock_proxy("a"), _centres_reply(0, centres)), (mock_proxy("b"), _centres_reply(1, centres + 9))]
    assert strategy.aggregate_fit(2, both, [])[0] is not None


def test_min_fit_fraction_counts_the_whole_federation(tmp_path: Path) -> None:
    cfg = parse_run_config({"out-dir": str(tmp_path), "k": 2, "min-fit-fraction": 0.75})
    strategy = KFedStrategy(cfg)
    strategy.configure_fit(1, ndarrays_to_parameters([]), mock_manager(["a", "b", "c", "d"]))
    assert strategy.roster.min_fit() == 3


# ---------------------------------------------------------------------------------- bad inputs
BAD_INPUTS = {
    "missing-data-dir": (["--dataset", "mnist", "--data-dir", "/nonexistent"], "missing mnist/train-images"),
    "corrupt-mat": (["--dataset", "mat:{corrupt}"], "not a MATLAB .mat file"),
    "ratio-not-numbers": (["--partition", "size-ratio", "--set", "ratio=abc"], "ratio 'abc'"),
    "ratio-vs-clients": (["--partition", "size-ratio", "--set", "ratio=6:4", "--clients", "3"], "2 parts"),
    "k-above-client-size": (["--set", "k=400", "--clients", "10"], "k=400 clusters but client"),
    "zero-clients": (["--clients", "0"], "--clients must be >= 1"),
    "unwritable-out": (["--out", "/proc/fedapp-cannot-write"], "is not writable"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_within_seconds_with_one_line(tmp_path: Path, case: str) -> None:
    args, message = BAD_INPUTS[case]
    corrupt = tmp_path / "corrupt.mat"
    corrupt.write_text("not a mat file")
    args = [arg.format(corrupt=corrupt) for arg in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    bound = refusal_bound_s()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "simulation", "run", "--method", "kfed", "--dataset", "digits", *args, *out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert elapsed < bound, f"{elapsed:.1f} s (bound {bound:.1f} s)"  # 5 s on an idle machine


# ------------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize(
    ("method", "dataset", "strategy_path"),
    [
        ("ffcm", "digits", "strategies.ffcm.FFCMStrategy"),  # stateless clients
        ("cefmc", "digits-mv", "strategies.cefmc.CeFMCStrategy"),  # clients keep H_v, y_v, C_v in state
    ],
)
def test_a_killed_run_resumes_from_its_checkpoint_to_the_same_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, dataset: str, strategy_path: str
) -> None:
    table = {"ffcm": "ffcm", "cefmc": "cefmc"}[method]
    keys = {
        "method": method,
        "dataset": dataset,
        "num-rounds": 6,
        f"{table}.delta": 0.0,
        "checkpoint-every": 1,
    }
    straight = _run(tmp_path / "straight", **keys)

    module_name, class_name = strategy_path.rsplit(".", 1)
    strategy_class = getattr(__import__(module_name, fromlist=[class_name]), class_name)
    original = strategy_class.aggregate_fit

    def crash_in_round_four(self: Any, server_round: int, results: Any, failures: Any) -> Any:
        if server_round == 4:
            raise KeyboardInterrupt("killed in round 4")
        return original(self, server_round, results, failures)

    monkeypatch.setattr(strategy_class, "aggregate_fit", crash_in_round_four)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "killed", **keys)
    crashed = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert crashed["status"] == "failed" and "killed in round 4" in crashed["status_reason"]
    monkeypatch.setattr(strategy_class, "aggregate_fit", original)

    resumed = _run(tmp_path / "killed", **keys, resume=True)
    assert resumed["status"] == "completed" and resumed["rounds"] == 6
    assert resumed["metrics"] == straight["metrics"]
    for field in ("centre_shift_per_round", "objective_per_round"):
        if field in straight:
            assert resumed[field] == straight[field]
    assert resumed["comm_bytes"]["up"] == straight["comm_bytes"]["up"]  # the ledger resumed too


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    from fedapp.config.run import ConfigError

    with pytest.raises(ConfigError, match="there is no checkpoint in"):
        _run(tmp_path, method="ffcm", dataset="digits", resume=True)


def test_each_round_configures_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server loop asks the strategy for each round's instructions exactly once (the ledger, the
    dropout draw and the participation record all count on it)."""
    calls: list[int] = []
    original = FFCMStrategy.configure_fit

    def counting(self: FFCMStrategy, server_round: int, *args: Any, **kwargs: Any) -> Any:
        calls.append(server_round)
        return original(self, server_round, *args, **kwargs)

    monkeypatch.setattr(FFCMStrategy, "configure_fit", counting)
    _run(tmp_path, method="ffcm", dataset="digits", **{"num-clients": 3, "num-rounds": 4, "ffcm.delta": 0.0})
    assert calls == [1, 2, 3, 4]

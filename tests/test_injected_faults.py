"""Faults at the message level (`fedapp.app.faults`): one client of a real run sends NaN, a wrong shape,
twice the arrays, a reply after the round timeout, or raises in fit / evaluate. The run goes on with the
others, names the client and the cause, and ends `degraded` (exit code 3). In-process here (every fault, a
horizontal and a vertical method). Flower's Ray simulation has its faults in the end-to-end Ray run, and the
loopback deployment's share one TLS deployment with a killed SuperNode (both in tests/test_e2e_flower.py);
the whole (method x fault) table is `simulation/bench/faults.py`'s (docs/faults.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedapp.app.faults import FAULTS_ENV, Fault, corrupted, parse_faults
from fedapp.launch.resolve import build_overrides
from fedapp.report.records import exit_code
from simulation.runner import execute

FFCM = {"method": "ffcm", "dataset": "digits", "seed": 0, "ffcm.delta": 0.0, "eval-every": 1}


def test_the_faults_parse_and_spoil_a_reply_as_documented() -> None:
    assert parse_faults("nan@1:2, raise-evaluate@0:*") == (
        Fault("nan", 1, 2),
        Fault("raise-evaluate", 0, None),
    )
    for bad in ("nan@x:2", "melt@1:2", "nan@1"):
        with pytest.raises(ValueError, match="KIND@PARTITION:ROUND"):
            parse_faults(bad)
    sums, counts = np.ones((3, 2), np.float32), np.arange(3)
    nan = corrupted([sums, counts], Fault("nan", 1, 2))
    assert np.isnan(nan[0][0, 0]) and nan[0].dtype == np.float32 and not np.isnan(sums).any()
    assert np.isnan(corrupted([counts], Fault("nan", 1, 2))[0][0])  # integers go as floats to hold it
    assert corrupted([sums, counts], Fault("shape", 1, 2))[0].shape == (2, 2)
    assert [a.shape for a in corrupted([sums, counts], Fault("double", 1, 2))] == [(3, 2), (3,), (3, 2), (3,)]


def _run(out: Path, engine: str, faults: str, monkeypatch: pytest.MonkeyPatch, **keys: Any) -> dict[str, Any]:
    monkeypatch.setenv(FAULTS_ENV, faults)
    return execute(build_overrides(keys, out), engine, quiet=True)


def test_every_fault_in_one_run_is_named_and_the_others_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = "nan@1:2,shape@1:3,double@1:4,raise-fit@3:3,raise-evaluate@2:2,late@2:5"
    keys = {**FFCM, "num-clients": 4, "num-rounds": 6, "round-timeout": 3.0}
    summary = _run(tmp_path, "inprocess", faults, monkeypatch, **keys)
    assert summary["status"] == "degraded" and exit_code(summary) == 3
    assert summary["rounds"] == 6 and summary["metrics"]["nmi"] > 0.5  # the others carried it through
    assert summary["rejections"] == [
        "partition-id 1: reply rejected: 'sums' contains NaN or infinite values",
        "partition-id 1: reply rejected: 'sums' has shape (9, 64), expected (10, 64)",
        "partition-id 1: reply rejected: expected 2 arrays, got 4: first extra has shape (10, 64)",
    ]
    assert summary["failure_messages"] == [
        "partition-id 3: InjectedFaultError: injected fault raise-fit@3:3: fit raises",
        "partition-id 2: no reply within the round timeout (3 s)",
    ]
    assert summary["evaluation_failures"] == [
        "partition-id 2: InjectedFaultError: injected fault raise-evaluate@2:2: evaluate raises"
    ]
    taken = summary["participation"]
    assert [len(taken[r]["rejected"]) for r in "23456"] == [1, 1, 1, 0, 0]
    assert [len(taken[r]["accepted"]) for r in "23456"] == [3, 2, 2, 2, 2]  # 3, then 2 left out for good
    reason = summary["status_reason"]
    assert "first client error: partition-id 3: InjectedFaultError" in reason
    assert "first rejected reply: partition-id 1: reply rejected: 'sums' contains NaN" in reason
    assert "1 client evaluation(s) failed; first: partition-id 2: InjectedFaultError" in reason
    assert summary["report"]["assigned_rows"] == {"0": 450, "1": 449}  # the report: the two still asked


def test_a_vertical_federation_keeps_a_broken_views_last_reply_and_says_whose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = {"method": "fedcmv", "dataset": "digits-mv", "seed": 0, "num-rounds": 5, "fedcmv.delta": 0.0}
    summary = _run(tmp_path, "inprocess", "nan@1:2,raise-fit@2:3", monkeypatch, **keys)
    assert summary["status"] == "degraded" and summary["rounds"] == 5
    assert summary["rejections"] == [
        "partition-id 1: reply rejected: 'partial distances' contains NaN or infinite values"
    ]
    assert summary["failure_messages"] == [
        "partition-id 2: InjectedFaultError: injected fault raise-fit@2:3: fit raises"
    ]
    assert summary["stale_views"]  # the views that did not answer are represented by their last reply


def test_a_message_the_superlink_let_expire_is_a_late_reply_naming_its_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a deployment a reply after the round timeout never comes: the SuperLink answers for the node
    that its message expired (its TTL is the round timeout), which read as Flower's "Message Unavailable"."""
    from types import SimpleNamespace

    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.common.constant import ErrorCode
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.supercore.task_identity import TaskIdentity

    from fedapp.app.server_loop import exchange

    for field in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, field, 1)

    class ExpiringGrid:
        def push_messages(self, messages: list[Any]) -> list[str]:
            return [f"message-{i}" for i, _ in enumerate(messages)]

        def pull_messages(self, ids: list[str]) -> list[Any]:
            error = SimpleNamespace(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="Error: Message Unavailable")
            return [
                SimpleNamespace(
                    metadata=SimpleNamespace(reply_to_message_id=i), has_error=lambda: True, error=error
                )
                for i in ids
            ]

    proxy = GridClientProxy(7, ExpiringGrid(), 1)  # type: ignore[arg-type]
    results, failures = exchange([(proxy, FitIns(ndarrays_to_parameters([]), {}))], 2, 3.0)
    assert results == [] and len(failures) == 1
    assert (
        str(failures[0])
        == "client 7: no reply within the round timeout (3 s); the SuperLink let its message expire"
    )

"""A run says why it ended: a duplicate partition id names both nodes (and the missing id is waited for,
not run without), SIGINT/SIGTERM give status `interrupted` with the signal, a lost SuperLink gives
`failed` with "SuperLink connection lost", and the console's last line states the status."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.common import Context, RecordDict
from flwr.server.client_manager import SimpleClientManager

from fedapp.app.client_app import client_fn
from fedapp.app.inprocess import InProcessClientProxy
from fedapp.app.server_app import server_fn
from fedapp.app.server_loop import FedappServer
from fedapp.launch.resolve import build_overrides

ROOT = Path(__file__).resolve().parents[1]


def _run_with_partitions(tmp_path: Path, partitions: list[int], **extra: Any) -> dict[str, Any]:
    """k-FED on digits, one in-process client per entry of `partitions` (its claimed partition-id)."""
    overrides = build_overrides({"method": "kfed", "dataset": "digits", "num-clients": 3}, tmp_path)
    run_config = {**overrides, **extra}
    components = server_fn(
        Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    )
    manager = SimpleClientManager()
    for node, partition in enumerate(partitions):
        node_config = {
            "partition-id": partition,
            "num-partitions": 3,
            "node-out-dir": str(tmp_path / f"n{node}"),
        }
        context = Context(
            run_id=0, node_id=node + 1, node_config=node_config, state=RecordDict(), run_config=run_config
        )
        manager.register(InProcessClientProxy(f"node-{node}", client_fn, context))
    server = FedappServer(client_manager=manager, strategy=components.server.strategy)  # type: ignore[union-attr]
    server.set_max_workers(1)
    with contextlib.suppress(Exception):  # a run that fails says so in its summary
        server.fit(num_rounds=components.config.num_rounds, timeout=None)  # type: ignore[union-attr]
    return json.loads((tmp_path / "summary.json").read_text())


def test_a_duplicate_partition_is_refused_naming_both_nodes_and_the_missing_one_is_waited_for(
    tmp_path: Path,
) -> None:
    summary = _run_with_partitions(tmp_path / "three", [0, 1, 1], **{"round-timeout": 1.0})
    assert summary["status"] == "failed"
    reason = summary["status_reason"]
    assert "partition-id(s) [2] never reported" in reason
    assert "client node-2 claims partition-id 1, which client node-1 holds: refused" in reason
    assert summary["report"].get("assigned_rows") is None  # it did not run without partition 2
    # num-clients = 0 (every node that comes): the duplicate is refused and the others go on
    summary = _run_with_partitions(tmp_path / "any", [0, 1, 1], **{"num-clients": 0})
    assert summary["status"] == "degraded" and "node-2 claims partition-id 1" in summary["status_reason"]
    assert summary["report"]["assigned_rows"] == {"0": 599, "1": 599}


def _runner(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "simulation", "run", "--method", "ffcm", "--dataset", "digits"]
    command += ["--clients", "3", "--rounds", "500", "--set", "ffcm.delta=0", *extra, "--out", str(tmp_path)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _until_round(process: subprocess.Popen[str], number: int) -> list[str]:
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith(f"round {number}/"):
            return seen
    raise AssertionError("".join(seen[-20:]))


@pytest.mark.e2e
@pytest.mark.sequential  # mostly waits on Ray and Flower: beside the workers
def test_a_lost_superlink_gives_failed_superlink_connection_lost(tmp_path: Path) -> None:
    process = _runner(tmp_path)
    _until_round(process, 2)
    superlinks = [
        int(entry.name)
        for entry in Path("/proc").glob("[0-9]*")
        if _parent(entry) == process.pid and b"flower-superlink" in _read(entry / "cmdline")
    ]
    assert len(superlinks) == 1
    os.kill(superlinks[0], signal.SIGKILL)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "SuperLink connection lost" in summary["status_reason"]
    assert "SuperLink connection lost" in output.strip().splitlines()[-1]
    time.sleep(0.5)


def _parent(entry: Path) -> int:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.mark.e2e
@pytest.mark.sequential
@pytest.mark.slow  # the duplicate-partition check above (same strategy code), in a loopback deployment
def test_a_deployment_with_two_supernodes_claiming_partition_1_ends_naming_the_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deploy.run_local as run_local

    own_config = run_local.node_config

    def duplicated(index: int, num_clients: int, out_dir: Path, node_data: str | None) -> str:
        return own_config(1 if index == 2 else index, num_clients, out_dir, node_data)  # nodes 1, 2: id 1

    monkeypatch.setattr(run_local, "node_config", duplicated)
    # the refused duplicate and the silent partition end the run without waiting for the timeout; a
    # loaded machine starts a ClientApp process slower than 15 s (then the run would only be degraded)
    settings = {"method": "kfed", "dataset": "digits", "num-clients": 3, "num-rounds": 2, "round-timeout": 45}
    overrides = build_overrides(settings, tmp_path / "out")
    run_local.deploy(overrides, 3, tmp_path / "work")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed", summary["status_reason"]
    assert "claims partition-id 1, which client" in summary["status_reason"]
    assert "partition-id(s) [2] never reported" in summary["status_reason"]

"""End to end through Flower's runtime: Ray simulation via `flwr run`, and a real loopback deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulation.runner import build_overrides, execute

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _is_gone(pid: int) -> bool:
    """True when the process no longer exists (or is a zombie awaiting its parent's wait)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z"


def test_flwr_simulation_runs_ffcm_rounds_and_writes_summary(tmp_path: Path) -> None:
    overrides = build_overrides(
        {"method": "ffcm", "dataset": "digits", "num-clients": 3, "num-rounds": 3, "seed": 1}, tmp_path
    )
    summary = execute(overrides, engine="flwr", quiet=True)
    assert summary["method"] == "ffcm" and summary["num_clients"] == 3
    assert summary["rounds"] == 3
    assert summary["metrics"]["nmi"] > 0.6
    assert summary["comm_bytes"]["up"] > 0 and summary["comm_bytes"]["down"] > 0
    rounds = json.loads((tmp_path / "rounds.json").read_text())
    assert [entry["round"] for entry in rounds] == [1, 2, 3]
    assert (tmp_path / "metrics.png").stat().st_size > 0
    # the in-process engine runs the same classes: identical metrics for the same seed
    same = execute(build_overrides({**overrides, "out-dir": ""}, tmp_path / "inprocess"), engine="inprocess")
    assert same["metrics"] == pytest.approx(summary["metrics"], abs=1e-12)


def test_loopback_deployment_kfed_three_supernodes(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    result = subprocess.run(
        [
            sys.executable,
            "deploy/run_local.py",
            "--method",
            "kfed",
            "--dataset",
            "digits",
            "--clients",
            "3",
            "--rounds",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "kfed" and summary["num_clients"] == 3
    assert set(summary["metrics"]) == {"acc", "nmi", "ari", "purity", "kappa"}
    assert summary["metrics"]["nmi"] > 0.6
    pids = json.loads((out / "deploy-pids.json").read_text())
    assert len(pids) == 4  # SuperLink + 3 SuperNodes
    assert all(_is_gone(pid) for pid in pids.values()), pids

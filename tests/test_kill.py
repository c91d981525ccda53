"""SIGKILL of an entry point (no `finally` runs): its watchdog stops every process of the run, removes
the temporary FLWR_HOME within 15 s and marks summary.json `killed` (with the phase it last saw)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedapp.launch.processes import RUN_TOKEN_ENV, child_environment, processes_with_token

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e
LIMIT_S = 15


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "simulation", "run", "--method", "ffcm", "--dataset", "digits", "--clients", "3"],
        pytest.param(
            ["deploy/run_local.py", "--method", "ffcm", "--dataset", "digits", "--clients", "2"],
            marks=pytest.mark.sequential,
        ),
    ],
    ids=["simulation", "deployment"],
)
def test_sigkill_of_the_entry_point_leaves_no_process_and_no_flwr_home(
    tmp_path: Path, command: list[str]
) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            *command,
            "--rounds",
            "500",
            "--set",
            "ffcm.delta=0",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:  # until the federation is really running: its first round has ended
        if line.startswith("round 1/"):
            break
    token, home = child_environment(process.pid, RUN_TOKEN_ENV), child_environment(process.pid, "FLWR_HOME")
    assert token and home and Path(home).is_dir() and processes_with_token(token)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    killed = time.monotonic()
    while time.monotonic() - killed < LIMIT_S and (
        _alive(processes_with_token(token)) or Path(home).exists()
    ):
        time.sleep(0.2)
    elapsed = time.monotonic() - killed
    print(f"{command[0]}: everything gone {elapsed:.1f} s after SIGKILL")
    assert _alive(processes_with_token(token)) == [], (
        f"processes of the run survived SIGKILL ({elapsed:.1f} s)"
    )
    assert not Path(home).exists(), f"{home} was not removed"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())  # the watchdog marked it
    assert summary["status"] == "killed" and "SIGKILL" in summary["status_reason"], summary["status_reason"]
    if command[0] == "-m":  # the simulation runner keeps the phase for the watchdog
        assert summary["phase"].startswith("in round "), summary["phase"]

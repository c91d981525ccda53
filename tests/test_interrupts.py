"""Interrupts and kills (issue 40, item 2): the sweep finds a run's processes that lost the run token and
their parent (as Ray's agents did) and says only what it verified; an interrupt during start-up of a Ray
run leaves summary.json `interrupted` with the signal and the phase, and no process of the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedapp.launch.phase import RunPhase, read_phase
from fedapp.launch.processes import RUN_TOKEN_ENV, child_environment
from fedapp.launch.sweep import run_processes, stop_run
from fedapp.report.records import mark_summary, start_summary

ROOT = Path(__file__).resolve().parents[1]
# an orphan that ignores SIGTERM, holds a file open under the home, and carries no run token
ORPHAN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork():
    os._exit(0)
log = open(os.path.join(sys.argv[1], "agent.log"), "w")
print(os.getpid(), flush=True)
devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(devnull, 1), os.dup2(devnull, 2)  # let the launcher's pipe close
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_sweep_stops_an_orphan_without_the_token_that_ignores_sigterm(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != RUN_TOKEN_ENV}
    launcher = subprocess.run(
        [sys.executable, "-c", ORPHAN, str(tmp_path)], env=env, capture_output=True, text=True, timeout=30
    )
    orphan = int(launcher.stdout.split()[0])
    try:
        assert _alive(orphan) and orphan in run_processes("no-such-token", tmp_path)
        report = stop_run("no-such-token", tmp_path, [], grace=1.0)
        assert not _alive(orphan) and report.clean and orphan in report.found
        assert report.describe().endswith("(checked: none left)")
        assert stop_run("no-such-token", tmp_path, []).describe() == "no process of the run was left to stop"
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_a_summary_marked_before_the_server_wrote_one_names_signal_and_phase(tmp_path: Path) -> None:
    start_summary(tmp_path, {"method": "ffcm"}, "starting the federation")
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "running"
    summary = mark_summary(tmp_path, "interrupted", "interrupted by SIGINT", "starting the federation")
    assert summary is not None and summary["status"] == "interrupted"
    assert summary["status_reason"].startswith("interrupted by SIGINT while starting the federation")
    # the watchdog marks only a summary that still says running
    kept = mark_summary(tmp_path, "killed", "killed", "in round 2", only_running=True)
    assert kept is not None and kept["status"] == "interrupted"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_the_federation_starts_is_recorded_and_leaves_no_process(
    tmp_path: Path, sig: signal.Signals
) -> None:
    command = [sys.executable, "-m", "simulation", "run", "--method", "ffcm", "--dataset", "digits"]
    command += ["--clients", "2", "--rounds", "500", "--set", "ffcm.delta=0", "--out", str(tmp_path)]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    token = home = None
    deadline = time.monotonic() + 60
    while not (token and home) and time.monotonic() < deadline and process.poll() is None:
        token = token or child_environment(process.pid, RUN_TOKEN_ENV)
        home = home or child_environment(process.pid, "FLWR_HOME")
        time.sleep(0.1)
    assert token and home, "the run started no Flower process"
    time.sleep(3.0)  # the SuperLink is up, `flwr run` and Ray are starting: before round 1 ends
    os.killpg(process.pid, sig)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + sig, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["phase"] in ("starting the SuperLink", "starting the federation", "in round 1")
    assert summary["status_reason"].startswith(f"interrupted by {sig.name} while {summary['phase']}")
    lines = output.strip().splitlines()
    assert lines[-1] == f"status: interrupted ({summary['status_reason']})"
    assert lines[-2].endswith("(checked: none left)") or lines[-2].endswith("was left to stop"), lines[-2]
    assert run_processes(token, home) == []


def test_the_phase_follows_flowers_output_into_its_file(tmp_path: Path) -> None:
    phase = RunPhase(tmp_path / "phase", "starting the federation")
    assert read_phase(tmp_path / "phase") == "starting the federation"
    phase.see("INFO :      Starting Flower ServerApp, config: num_rounds=3, round_timeout=1800.0s")
    assert read_phase(tmp_path / "phase") == "in round 1"
    phase.see("INFO :      round 1: acc=0.7785  nmi=0.7297")  # not a progress line
    assert phase.text == "in round 1"
    phase.see("INFO :      [fedapp] round 2/3 |   0.13 s | acc 78.35 | 3/3 clients")
    assert read_phase(tmp_path / "phase") == "in round 3"
    phase.see("INFO :      [fedapp] round 3/3 |   0.18 s | acc 78.52 | 3/3 clients")
    assert phase.text == "in the final report" and read_phase(tmp_path / "missing") is None

"""End to end through Flower's runtime: Ray simulation via `flwr run`, and a real loopback deployment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedapp.app.faults import FAULTS_ENV
from fedapp.launch.processes import RUN_TOKEN_ENV, child_environment
from fedapp.launch.resolve import build_overrides
from simulation.runner import execute

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def _is_gone(pid: int) -> bool:
    """True when the process no longer exists (or is a zombie awaiting its parent's wait)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z"


def test_a_ray_simulation_names_faulty_clients_goes_on_and_equals_the_in_process_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Ray simulation (`flwr run`) for the end-to-end path and for the faults at the message level in
    Ray (tests/test_injected_faults.py has every fault in-process): client 1 sends NaN in round 2 and twice
    the arrays in round 3 (rejected, named), client 2 raises in fit in round 3 (named, not asked again),
    client 0 raises in evaluate in round 4. The run goes on with the others and ends degraded, with every
    output written. The in-process engine runs the same classes: same faults and seed, identical metrics."""
    monkeypatch.setenv(FAULTS_ENV, "nan@1:2,double@1:3,raise-fit@2:3,raise-evaluate@0:4")
    keys = {"method": "ffcm", "dataset": "digits", "num-clients": 3, "num-rounds": 5, "seed": 1}
    overrides = build_overrides({**keys, "ffcm.delta": 0.0, "eval-every": 1}, tmp_path)
    summary = execute(overrides, engine="flwr", quiet=True)
    assert summary["method"] == "ffcm" and summary["num_clients"] == 3
    assert summary["status"] == "degraded" and summary["rounds"] == 5
    assert [line.split(": reply rejected: ")[0] for line in summary["rejections"]] == ["partition-id 1"] * 2
    assert summary["failure_messages"] == [
        "partition-id 2: InjectedFaultError: injected fault raise-fit@2:3: fit raises"
    ]
    assert summary["evaluation_failures"][0].startswith("partition-id 0: InjectedFaultError")
    assert summary["metrics"]["nmi"] > 0.6
    assert summary["comm_bytes"]["up"] > 0 and summary["comm_bytes"]["down"] > 0
    rounds = json.loads((tmp_path / "rounds.json").read_text())
    assert [entry["round"] for entry in rounds] == [1, 2, 3, 4, 5]
    assert (tmp_path / "metrics.png").stat().st_size > 0
    page = (tmp_path / "report.html").read_text()  # the page, with the wire bytes written after the loop
    assert "On the wire, per message kind" in page and "ffcm on digits" in page
    assert all((tmp_path / "nodes" / str(site) / "report.html").is_file() for site in range(2))
    assert not (tmp_path / "nodes" / "2").exists()  # the client that raised in fit is not asked again
    apart = {**overrides, "out-dir": "", "node-out-dir": ""}  # its own folder and node folders
    same = execute(build_overrides(apart, tmp_path / "inprocess"), engine="inprocess")
    assert same["metrics"] == pytest.approx(summary["metrics"], abs=1e-12)
    for key in ("status", "rejections", "failure_messages", "evaluation_failures"):
        assert same[key] == summary[key], key


def _tokened(token: str) -> list[int]:
    from fedapp.launch.processes import processes_with_token

    return [pid for pid in processes_with_token(token) if not _is_gone(pid)]


def test_sigterm_stops_the_runner_and_every_process_it_started(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "simulation", "run", "--method", "ffcm", "--dataset", "digits"]
    command += ["--clients", "3", "--rounds", "500", "--set", "ffcm.delta=0", "--out", str(tmp_path / "out")]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:  # wait until the federation is really running
        if line.startswith("round 2/"):
            break
    token = child_environment(process.pid, RUN_TOKEN_ENV)
    assert token and _tokened(token), "no Flower process carries the run token"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    elapsed = time.monotonic() - started
    assert process.returncode == 128 + signal.SIGTERM and elapsed < 10, (process.returncode, elapsed)
    time.sleep(1)
    assert _tokened(token) == [], "processes of the run survived SIGTERM"
    # the run says how it ended: status interrupted, with the signal, in summary.json and on its last line
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["status_reason"].startswith("interrupted by SIGTERM"), summary["status_reason"]
    assert output.strip().splitlines()[-1] == f"status: interrupted ({summary['status_reason']})"


@pytest.mark.sequential
def test_a_secure_deployment_refuses_a_stranger_names_faulty_clients_and_a_killed_supernode_costs_one_round(
    tmp_path: Path,
) -> None:
    """One loopback deployment (TLS, SuperNode authentication) for the checks that need real SuperNodes: a
    fifth SuperNode whose key was never registered is refused; in round 2 one client's reply has a wrong
    shape (rejected, named), one raises in fit (named, not asked again), one raises in evaluate (named), and
    the fourth SuperNode is SIGKILLed (its round waits for Flower's heartbeat, at most the round timeout,
    and the node is not asked again: the final report asks the other two); the run completes with the
    others, status degraded (exit code 3), and every process the script started is gone afterwards. The
    fault table (every method, every fault) is docs/faults.md's; tests/test_injected_faults.py checks each
    fault in-process, the Ray run above the Ray simulation's."""
    timeout = 60  # first rounds (process start-up, imports) must never hit it, even on a loaded machine
    out = tmp_path / "killed"
    command = [sys.executable, "deploy/run_local.py", "--method", "ffcm", "--dataset", "digits"]
    command += ["--clients", "4", "--rounds", "2", "--set", "ffcm.delta=0", "--set", "eval-every=1"]
    command += ["--set", f"round-timeout={timeout}", "--tls", "--auth", "--unregistered-nodes", "1"]
    faults = {FAULTS_ENV: "shape@1:2,raise-fit@2:2,raise-evaluate@0:2"}
    process = subprocess.Popen(
        [*command, "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, **faults},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    victim, killed_at, lines = None, None, []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("SuperNode 3 pid"):
            victim = int(line.split()[3])
        if line.startswith("round 1/") and victim is not None and killed_at is None:
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
    code = process.wait(timeout=60)
    output = "".join(lines)
    assert killed_at is not None, "".join(lines[-20:])
    assert code == 3, "".join(lines[-30:])
    assert "(TLS, SuperNode auth)" in output and "unregistered SuperNode 4: refused" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "degraded" and summary["rounds"] == 2 and summary["metrics"]["nmi"] > 0.6
    assert summary["rejections"] == [
        "partition-id 1: reply rejected: 'sums' has shape (9, 64), expected (10, 64)"
    ]
    raised, lost = sorted(summary["failure_messages"])  # partition-id 2 sorts before 3
    assert raised.startswith("partition-id 2: InjectedFaultError: injected fault raise-fit"), raised
    assert lost.startswith("partition-id 3: "), lost  # Flower's "Node Unavailable", or the round timeout
    assert summary["evaluation_failures"][0].startswith("partition-id 0: InjectedFaultError")
    failed = {int(r): rec["failed"] for r, rec in summary["participation"].items() if rec["failed"]}
    assert list(failed) == [2] and len(failed[2]) == 2 and len(summary["excluded_clients"]) == 2, failed
    assert summary["report"]["assigned_rows"].keys() == {"0", "1"}  # the report asks only the two left
    seconds = {int(line.split()[1].split("/")[0]): float(line.split("|")[1].split()[0]) for line in lines
               if line.startswith("round ")}  # fmt: skip
    assert seconds[2] - seconds[1] < 2 * timeout, seconds  # the kill cost <= 2 x timeout
    pids = json.loads((out / "deploy-pids.json").read_text())
    assert len(pids) == 6  # SuperLink + 4 SuperNodes + the refused one
    assert all(_is_gone(pid) for pid in pids.values()), pids


def test_secagg_ffcm_matches_the_plain_sums_up_to_quantisation(tmp_path: Path) -> None:
    """FFCM under Flower's SecAgg+ (the server sees only the average of the clients' uploads) follows
    the same path as FFCM with exact sums and the same initialisation, up to SecAgg+'s quantisation."""
    keys = {"method": "ffcm", "dataset": "digits", "num-clients": 3, "num-rounds": 6, "ffcm.delta": 0.0}
    plain = execute(
        build_overrides({**keys, "ffcm.init": "moments"}, tmp_path / "plain"), engine="inprocess", quiet=True
    )
    secure = execute(  # SecAgg+ over the in-process DirectGrid (= Ray's: tests/test_new_method.py)
        build_overrides({**keys, "secagg": True}, tmp_path / "secure"), engine="inprocess", quiet=True
    )
    assert secure["status"] == "completed" and secure["config"]["secagg"] is True
    assert abs(secure["metrics"]["nmi"] - plain["metrics"]["nmi"]) < 0.02
    # Quantisation error is absolute (a fraction of the value range), so compare on the scale of
    # the largest shift rather than relative to each (shrinking) late-round shift.
    scale = max(plain["centre_shift_per_round"])
    assert secure["centre_shift_per_round"] == pytest.approx(
        plain["centre_shift_per_round"], abs=0.05 * scale
    )

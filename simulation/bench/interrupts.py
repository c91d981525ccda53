"""Interrupts of a Ray run at fixed times (issue 40, item 2), measured and printed as a table:

    python -m simulation.bench.interrupts [--at 5 15 30] [--signals SIGINT SIGTERM SIGKILL] [--after 15]

Each trial starts `python -m simulation run` (FFCM on digits, 3 clients, endless rounds) in its own
process group, sends the signal to that group `--at` seconds after the start, and reports the exit code,
summary.json's status and phase, when the runner exited and when the last process of the run was gone,
and how many are alive `--after` seconds after the signal. The run's processes: every descendant of the
runner seen while it ran (the watchdog included) plus whatever the sweep finds by the run's token and
private FLWR_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fedapp.config.run import PROJECT_ROOT
from fedapp.launch.processes import RUN_TOKEN_ENV, child_environment
from fedapp.launch.sweep import run_processes

COMMAND = ["-m", "simulation", "run", "--method", "ffcm", "--dataset", "digits", "--clients", "3"]
COMMAND += ["--rounds", "500", "--set", "ffcm.delta=0"]
POLL_S = 0.1


@dataclass
class Trial:
    at: float
    signal: str
    exit_code: int | None = None
    exit_s: float | None = None  # seconds from the signal to the runner's exit
    status: str = "(no summary.json)"
    phase: str = ""
    gone_s: float | None = None  # seconds from the signal until no process of the run was alive
    left: int = 0


def _descendants(root: int) -> set[int]:
    """The live descendants of `root` (one /proc snapshot)."""
    parent = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        for child in (c for c, p in parent.items() if p == pid and c not in found):
            found.add(child)
            frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def run_trial(at: float, sig: signal.Signals, after: float, out: Path) -> Trial:
    """One run, one signal; see the module docstring."""
    trial = Trial(at, sig.name)
    process = subprocess.Popen(
        [sys.executable, *COMMAND, "--out", str(out)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    began, seen, token, home = time.monotonic(), set(), None, None
    while time.monotonic() - began < at and process.poll() is None:
        seen |= _descendants(process.pid)
        token = token or child_environment(process.pid, RUN_TOKEN_ENV)
        home = home or child_environment(process.pid, "FLWR_HOME")
        time.sleep(POLL_S)
    signalled = time.monotonic()
    os.killpg(process.pid, sig)
    while (elapsed := time.monotonic() - signalled) < after:
        running = process.poll() is None  # once per poll: exit and "all gone" are judged on one state
        if running:
            seen |= _descendants(process.pid)
        elif trial.exit_code is None:
            trial.exit_code = 128 - process.returncode if process.returncode < 0 else process.returncode
            trial.exit_s = elapsed
        if running or _left(seen, token, home):
            trial.gone_s = None
        elif trial.gone_s is None:
            trial.gone_s = elapsed
        time.sleep(POLL_S)
    trial.left = len(_left(seen, token, home))
    _read_summary(out / "summary.json", trial)
    if process.poll() is None:  # the runner itself did not stop: do not leave it behind
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return trial


def _left(seen: set[int], token: str | None, home: str | None) -> set[int]:
    """The run's processes alive now: those seen as the runner's descendants, and what the sweep finds."""
    left = {pid for pid in seen if _alive(pid)}
    return left | set(run_processes(token, home)) if token else left


def _read_summary(path: Path, trial: Trial) -> None:
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    trial.status = str(summary.get("status"))
    trial.phase = str(summary.get("phase", ""))


def table(trials: list[Trial]) -> str:
    lines = [
        "| signal at | signal | exit code | runner exited after | all gone after | summary status | phase "
        "| processes left after 15 s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        exited = f"{t.exit_s:.1f} s" if t.exit_s is not None else "did not exit"
        gone = f"{t.gone_s:.1f} s" if t.gone_s is not None else "not gone"
        cells = [f"{t.at:g} s", t.signal, str(t.exit_code), exited, gone, t.status, t.phase, str(t.left)]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.bench.interrupts", description=__doc__)
    parser.add_argument("--at", type=float, nargs="+", default=[5.0, 15.0, 30.0])
    parser.add_argument("--signals", nargs="+", default=["SIGINT", "SIGTERM", "SIGKILL"])
    parser.add_argument("--after", type=float, default=15.0)
    args = parser.parse_args(argv)
    trials = []
    with tempfile.TemporaryDirectory(prefix="fedapp-interrupts-") as tmp:
        for at in args.at:
            for name in args.signals:
                out = Path(tmp) / f"{name}-{at:g}"
                trials.append(run_trial(at, signal.Signals[name], args.after, out))
                print(table(trials[-1:]).splitlines()[-1], flush=True)
    print(table(trials))
    return 0 if all(t.left == 0 for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Finding and stopping every process of a run, Ray's included, and saying only what was verified.

A run's processes leave the entry point's process group and session (Flower's SuperExec calls setsid, Ray
starts its daemons from `flwr-simulation`), so they are found in /proc (Linux) by three marks, because no
single one is enough:

1. the run token (`RUN_TOKEN_ENV`) in the environment, which every child inherits;
2. an open file or the working directory under the run's private FLWR_HOME, where Ray keeps its
   session (`RAY_TMPDIR` = FLWR_HOME/ray): every Ray process holds its session's log files open;
3. being a descendant of a process found by 1 or 2 (taken from one snapshot, before anything is stopped).

Mark 1 alone missed Ray's agents: `ray::DashboardAgent` and `ray::RuntimeEnvAgent` rename themselves
(setproctitle), which on some starts zeroes their /proc/PID/environ. When the raylet they belong to died
first they were orphans (parent 1) without the token, and they ignore SIGTERM while their raylet is gone:
measured alive 35-59 s after the run "stopped every process". Marks 2 and 3 find them.

`stop_run` signals SIGTERM, rescans (a process forked meanwhile is found too), SIGKILLs what is left after
the grace period and returns a `StopReport` from a last scan: the console says every process stopped only
when that scan found none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from fedapp.launch.processes import RUN_TOKEN_ENV

SCAN_INTERVAL_S = 0.1
KILL_WAIT_S = 3.0  # after SIGKILL: how long to wait for the kernel to take the processes down


@dataclass
class ProcInfo:
    """What one /proc entry says about a process (the fields the marks need)."""

    pid: int
    ppid: int
    state: str
    marked: bool  # carries the token or touches the private home


@dataclass
class StopReport:
    """What `stop_run` did and what its last scan saw."""

    found: set[int] = field(default_factory=set)  # every process of the run it saw alive
    leftovers: list[int] = field(default_factory=list)  # alive at the last scan (normally none)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.leftovers

    def describe(self) -> str:
        """One line for the console, true by construction (it states the last scan's result)."""
        if self.leftovers:
            return f"{len(self.leftovers)} process(es) of the run are still alive: {self.leftovers}"
        if not self.found:
            return "no process of the run was left to stop"
        return f"stopped the run's {len(self.found)} processes in {self.seconds:.1f} s (checked: none left)"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # gone meanwhile, or another user's process
        return b""


def _touches(entry: Path, home: str) -> bool:
    """The process has its working directory or an open file under `home` (its arguments do not count: the
    watchdog names the home it removes)."""
    for link in [entry / "cwd", *_fds(entry)]:
        with suppress(OSError):
            target = os.readlink(link)
            if target == home or target.startswith(home + os.sep):
                return True
    return False


def _fds(entry: Path) -> Iterable[Path]:
    try:
        return list((entry / "fd").iterdir())
    except OSError:
        return []


def _snapshot(token: str, home: str | None) -> dict[int, ProcInfo]:
    """Every readable process of this user, with its parent, state and whether it carries a mark."""
    needle = f"{RUN_TOKEN_ENV}={token}".encode()
    uid = os.getuid()
    table = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if entry.stat().st_uid != uid:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except (OSError, ValueError):
            continue
        marked = needle in _read(entry / "environ").split(b"\0") or bool(home and _touches(entry, home))
        table[int(entry.name)] = ProcInfo(int(entry.name), int(fields[1]), fields[0], marked)
    return table


def run_processes(token: str, home: Path | str | None = None) -> list[int]:
    """PIDs of the run's live processes (not zombies): marked by its token or private `home`, and their
    descendants. This process and its ancestors are never included. Linux only (elsewhere: [])."""
    home_text = str(Path(home).resolve()) if home else None
    table = _snapshot(token, home_text)
    members = {pid for pid, info in table.items() if info.marked}
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    frontier = list(members)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in members:
                members.add(child)
                frontier.append(child)
    members -= _self_and_ancestors(table)
    return sorted(pid for pid in members if table[pid].state != "Z")


def _self_and_ancestors(table: dict[int, ProcInfo]) -> set[int]:
    chain, pid = set(), os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        pid = table[pid].ppid if pid in table else 0
    return chain


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _signal_groups(started: Iterable[subprocess.Popen], sig: int) -> None:
    """The process groups the entry point started (each started in its own session)."""
    for process in started:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


def stop_run(
    token: str, home: Path | None, started: list[subprocess.Popen], grace: float = 5.0
) -> StopReport:
    """Stop every process of the run: SIGTERM to the groups the entry point started and to every process
    `run_processes` finds, rescanning until none is left; SIGKILL to the rest after `grace` seconds.

    A process that a dying parent forks meanwhile is found by the next scan, so the loop ends only on a
    scan that finds nothing alive (or KILL_WAIT_S after SIGKILL). The report's `leftovers` come from a
    last scan after that."""
    began = time.monotonic()
    report = StopReport()
    _signal_groups(started, signal.SIGTERM)
    terminated: set[int] = set()
    kill_from = began + grace
    while True:
        alive = run_processes(token, home)
        report.found.update(alive)
        now = time.monotonic()
        if not alive or now > kill_from + KILL_WAIT_S:
            break
        if now < kill_from:
            _signal_all(set(alive) - terminated, signal.SIGTERM)  # once each: a second TERM cuts cleanup
            terminated.update(alive)
        else:
            _signal_groups(started, signal.SIGKILL)
            _signal_all(alive, signal.SIGKILL)
        time.sleep(SCAN_INTERVAL_S)
    for process in started:
        process.poll()  # reap our own children, so they are not counted as zombies
    report.leftovers = run_processes(token, home)
    report.seconds = time.monotonic() - began
    return report

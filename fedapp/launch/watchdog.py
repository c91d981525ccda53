"""A guard that outlives the entry point: if it dies without cleaning up (SIGKILL, the OOM killer), the run's
processes are stopped, its temporary folders removed and its summary.json marked `killed`.

An entry point's `finally` blocks stop what it started on a normal end, an error, Ctrl-C or SIGTERM. A
SIGKILL runs no `finally`: SuperLink, SuperExec, the simulation and Ray's workers would finish the run
unwatched, leave a temporary FLWR_HOME behind and a summary.json that says `running` for ever. So the
entry point starts this watchdog first, in its own session and without the run token (so that stopping
the run's processes does not stop the guard):

    python -m fedapp.launch.watchdog --parent PID --token TOKEN [--home DIR] [--remove DIR ...]
                                     [--out DIR] [--phase-file FILE]

It checks every `POLL_S` whether it still has its parent (a dead parent's children are handed to
another process, so `getppid` changes; PID reuse cannot fool it). When the parent is gone it reads the
run's last phase (`--phase-file`) and stops every process of the run (`sweep.stop_run`: the token, the
private `--home`, descent). If `--out`/summary.json said `running` when the parent died, it marks it
`killed` with that phase (the ServerApp may write `failed` while it is being stopped). Then it removes
the folders: who sees them gone finds the summary marked. A parent that ends normally stops the guard
(`stop_watchdog`) after cleaning up itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fedapp.launch.phase import read_phase
from fedapp.launch.processes import RUN_TOKEN_ENV
from fedapp.launch.sweep import stop_run
from fedapp.report.records import mark_summary

POLL_S = 0.5
KILLED_REASON = "the entry point was killed (SIGKILL or the OOM killer)"


def start_watchdog(
    token: str,
    remove: list[Path],
    *,
    home: Path | None = None,
    out_dir: Path | None = None,
    phase_file: Path | None = None,
) -> subprocess.Popen:
    """Start the guard for this process's run `token`: if this process dies it stops the run's processes
    (also found by their private `home`), removes `remove` and marks `out_dir`/summary.json `killed`."""
    env = {key: value for key, value in os.environ.items() if key != RUN_TOKEN_ENV}
    command = [sys.executable, "-m", "fedapp.launch.watchdog", "--parent", str(os.getpid()), "--token", token]
    for flag, value in (("--home", home), ("--out", out_dir), ("--phase-file", phase_file)):
        if value is not None:
            command += [flag, str(Path(value).resolve())]
    for path in remove:
        command += ["--remove", str(path)]
    return subprocess.Popen(
        command,
        env=env,
        cwd=Path(__file__).resolve().parents[2],  # the project root: `fedapp` imports from there
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_watchdog(guard: subprocess.Popen) -> None:
    """The parent cleaned up itself: the guard's job is over."""
    guard.kill()
    guard.wait(timeout=5)


def watch(args: argparse.Namespace) -> None:
    """Wait for the parent to die, then clean up after it (the phase is read before its file is removed)."""
    while os.getppid() == args.parent:
        time.sleep(POLL_S)
    phase = read_phase(args.phase_file) if args.phase_file else None
    running = args.out is not None and _status(args.out) == "running"  # before the ServerApp is stopped
    report = stop_run(args.token, args.home, [], grace=3.0)
    if running:  # what the ServerApp wrote while being stopped ("failed: KeyboardInterrupt") is not the cause
        reason = f"{KILLED_REASON}; the watchdog: {report.describe()}"
        mark_summary(args.out, "killed", reason, phase)
    for path in args.remove:  # last: once the run's folders are gone, its summary says how it ended
        shutil.rmtree(path, ignore_errors=True)


def _status(out_dir: Path) -> str | None:
    """summary.json's status when the entry point died: only a run still `running` was killed by it."""
    try:
        return json.loads((out_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedapp.launch.watchdog", description=__doc__)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--home", type=Path, help="the run's private FLWR_HOME (finds Ray's processes)")
    parser.add_argument("--remove", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path, help="the run's output directory (its summary.json)")
    parser.add_argument("--phase-file", type=Path, help="where the entry point keeps the run's phase")
    watch(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())

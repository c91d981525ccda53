"""A guard that outlives the entry point: if it dies without cleaning up (SIGKILL, the OOM killer), the run's
processes are stopped and its temporary folders removed.

An entry point's `finally` blocks stop what it started on a normal end, an error, Ctrl-C or SIGTERM. A
SIGKILL runs no `finally`: SuperLink, SuperExec, the simulation and Ray's workers would finish the run
unwatched and leave a temporary FLWR_HOME behind. So the entry point starts this watchdog first, in its
own session and without the run token (so that stopping the run's processes does not stop the guard):

    python -m fedapp.launch.watchdog --parent PID --token TOKEN --remove DIR [--remove DIR ...]

It checks every `POLL_S` whether it still has its parent (a dead parent's children are handed to
another process, so `getppid` changes; PID reuse cannot fool it). When the parent is gone it stops every
process carrying the token (`stop_run`) and removes the folders. A parent that ends normally stops the
guard (`stop_watchdog`) after cleaning up itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fedapp.launch.processes import RUN_TOKEN_ENV, stop_run

POLL_S = 0.5


def start_watchdog(token: str, remove: list[Path]) -> subprocess.Popen:
    """Start the guard for this process's run `token`; it removes `remove` if this process dies."""
    env = {key: value for key, value in os.environ.items() if key != RUN_TOKEN_ENV}
    command = [sys.executable, "-m", "fedapp.launch.watchdog", "--parent", str(os.getpid()), "--token", token]
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


def watch(parent: int, token: str, remove: list[Path]) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    stop_run(token, [], grace=3.0)
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedapp.launch.watchdog", description=__doc__)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--remove", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    watch(args.parent, args.token, args.remove)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Starting and stopping Flower's processes (SuperLink, SuperNodes) owned by this project's scripts.

Every process is started in its own session so that stopping it by PID also stops the children it
spawned (flower-superexec, flwr-serverapp/-clientapp, flwr-simulation).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class ProcessError(RuntimeError):
    """A Flower process failed to start or answer."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower processes: private home, offline, quiet Ray."""
    env = dict(os.environ)
    env.update(
        {
            "FLWR_HOME": str(flwr_home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
            "RAY_TMPDIR": str(flwr_home / "ray"),
            "RAY_DEDUP_LOGS": "0",
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
            # one BLAS thread per client process: Ray gives each client one CPU, and spinning BLAS threads
            # on an oversubscribed machine made CeFMC's rounds ~25x slower (measured on 2 cores)
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            # Flower's components spawn each other by name (flower-superexec, flwr-simulation)
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
    )
    (flwr_home / "ray").mkdir(parents=True, exist_ok=True)
    return env


def console_script(name: str) -> str:
    """A console script from this interpreter's environment (the venv), else from PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def wait_for_health(port: int, process: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ProcessError(f"{what} exited with code {process.returncode} during start-up")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise ProcessError(f"{what} did not answer on 127.0.0.1:{port}/health within {timeout:.0f} s")


def stop_process(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group (the process and its superexec children), SIGKILL after `timeout`."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def start_logged(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start `command` in a new session (so `stop_process` also stops its children), output to `log_path`."""
    with log_path.open("w") as log_file:
        return subprocess.Popen(
            command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def run_filtered(
    command: list[str], env: dict[str, str], log_path: Path, *, quiet: bool, cwd: Path | None = None
) -> int:
    """Run `command`; every output line (ANSI codes removed) goes to `log_path`, progress lines to stdout.

    Progress lines are those the strategy marks with `fedapp.results.PROGRESS_MARKER`; Flower's own
    chatter (history dumps, per-round sampling notes, repeated warnings) stays in the log file.
    """
    from fedapp.results import PROGRESS_MARKER, progress_text

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            clean = _ANSI.sub("", line)
            log_file.write(clean)
            log_file.flush()
            if not quiet and PROGRESS_MARKER in clean:
                print(progress_text(clean), flush=True)
        return process.wait()

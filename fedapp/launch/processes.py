"""Starting and stopping Flower's processes (SuperLink, SuperNodes) owned by this project's scripts.

Every process is started in its own session so that stopping it by PID also stops the children it
spawned (flower-superexec, flwr-serverapp/-clientapp, flwr-simulation). Ray's workers leave those
sessions, so every process of a run also carries a run token in its environment (`RUN_TOKEN_ENV`):
`fedapp.launch.sweep.stop_run` finds them all by it and by the run's private FLWR_HOME (on Linux, via
/proc) and stops them too, leaving other processes alone.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fedapp.report.records import FINISHED, defer_while_writing, exit_code, mark_summary, status_line

RUN_TOKEN_ENV = "FEDAPP_RUN_TOKEN"
REPORT_GRACE_S = 15.0  # a signal in the final report waits this long for it (`records.await_report`)


class ProcessError(RuntimeError):
    """A Flower process failed to start or answer."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower processes: private home, offline, quiet Ray, a fresh run token."""
    env = dict(os.environ)
    env.update(
        {
            RUN_TOKEN_ENV: uuid.uuid4().hex,
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


def wait_for_health(
    port: int, process: subprocess.Popen, timeout: float, what: str, ca_file: Path | None = None
) -> None:
    """Poll the SuperLink's /health (over TLS, trusting `ca_file`, when given) until it answers 200."""
    import ssl

    scheme = "https" if ca_file else "http"
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ProcessError(f"{what} exited with code {process.returncode} during start-up")
        try:
            url = f"{scheme}://127.0.0.1:{port}/health"
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise ProcessError(f"{what} did not answer on 127.0.0.1:{port}/health within {timeout:.0f} s")


def stop_process(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group (the process and its superexec children), SIGKILL after `timeout`.

    The group is signalled even when its leader has already exited: its children may still be running.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            process.poll()
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
    command: list[str],
    env: dict[str, str],
    log_path: Path,
    *,
    quiet: bool,
    cwd: Path | None = None,
    started: list[subprocess.Popen] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> int:
    """Run `command`; every output line (ANSI codes removed) goes to `log_path`, progress lines to stdout.

    Progress lines are those the strategy marks with `fedapp.report.records.PROGRESS_MARKER`; Flower's own
    chatter (history dumps, per-round sampling notes, repeated warnings) stays in the log file. The
    process runs in its own session and is appended to `started`; if this call is interrupted, it stops it.
    `on_line` sees every clean line (how the runner follows the run's phase).
    """
    from fedapp.report.records import PROGRESS_MARKER, progress_text

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        if started is not None:
            started.append(process)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                clean = _ANSI.sub("", line)
                log_file.write(clean)
                log_file.flush()
                if on_line is not None:
                    on_line(clean)
                if not quiet and PROGRESS_MARKER in clean:
                    print(progress_text(clean), flush=True)
            return process.wait()
        finally:
            if process.poll() is None:
                stop_process(process, timeout=5.0)


def processes_with_token(token: str) -> list[int]:
    """PIDs whose environment holds RUN_TOKEN_ENV=token (Linux /proc; elsewhere an empty list)."""
    needle = f"{RUN_TOKEN_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or another user's process
            continue
    return [pid for pid in found if pid != os.getpid()]


def child_environment(pid: int, name: str) -> str | None:
    """`name` from the environment of any child of `pid` (Linux /proc; None elsewhere or when no child
    has it): how a supervisor finds the run token and FLWR_HOME of the processes a runner started."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1]) != pid:
                continue
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(name.encode() + b"="):
                    return item.split(b"=", 1)[1].decode()
        except (OSError, ValueError):  # gone meanwhile, or another user's process
            continue
    return None


class Interrupted(BaseException):  # noqa: N818 (it is what happened, not an error)
    """SIGINT or SIGTERM reached an entry point; its `finally` blocks stop what it started.

    A BaseException, as KeyboardInterrupt is: the handler raises it wherever the main thread is, and an
    `except Exception` there must not swallow it. logging's `Handler.emit` is one: a run whose signal came
    while a progress line was written went on, its clients failing with "the run was interrupted", and
    ended `failed` with exit 1 instead of `interrupted` with 130 (a quarter of the signals sent into a
    loop of log calls were swallowed there).

    The code that knows more fills in `phase` (where the run was: "starting the federation", "in round 3")
    and `stopped` (the sweep's verified line, `StopReport.describe()`), so the console says only what is
    known."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.phase: str | None = None
        self.stopped: str | None = None

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def reason(self) -> str:
        """summary.json's `status_reason`: the signal and, when known, the phase it came in."""
        return f"{self}{f' while {self.phase}' if self.phase else ''}"


def report_interrupt(exc: Interrupted, out: Path | None) -> int:
    """Two lines on stderr — what the sweep verified about the run's processes, then the status, which
    summary.json (written at the start, so it exists once anything started) says too — and the exit code.
    A run that had run through when the signal came keeps its status, and the exit code is its status's."""
    summary = mark_summary(out, "interrupted", str(exc), exc.phase) if out else None
    stopped = exc.stopped or "it had started no other process"
    if summary is not None and summary.get("status") in FINISHED:
        print(f"{exc} after the run had ended: {stopped}", file=sys.stderr)
        print(status_line(summary), file=sys.stderr)
        return exit_code(summary)
    phase = (summary or {}).get("phase") or exc.phase
    print(f"{exc}{f' while {phase}' if phase else ''}: {stopped}", file=sys.stderr)
    fallback = {"status": "interrupted", "status_reason": f"{exc}{f' while {phase}' if phase else ''}"}
    print(status_line(summary or fallback), file=sys.stderr)
    return exc.exit_code


INTERRUPTED = threading.Event()  # set by `interruptible`'s handler: work waiting on other threads (the
# in-process engine's clients, `fedapp.app.inprocess`) stops waiting, so the exit is not held up by them


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `Interrupted` for the duration (so cleanup code runs), then restore.

    After the first signal both are ignored until the end: a second Ctrl-C (or a SIGINT to the whole
    process group followed by a SIGTERM) must not break off the cleanup that stops the run's processes."""

    def handler(signum: int, frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        INTERRUPTED.set()
        interrupted = Interrupted(signum)
        if not defer_while_writing(interrupted):  # outputs being written are finished first
            raise interrupted

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        INTERRUPTED.clear()  # what waited on it has ended with the block
        for sig, old in previous.items():
            signal.signal(sig, old)


def local_superlinks(flwr_home: Path) -> list[int]:
    """PIDs of simulation SuperLinks that a plain `flwr run` started for this FLWR_HOME (and this user).

    `flwr run` with the default `local` connection starts `flower-superlink --simulation` detached and
    leaves it running; it is recognised by its command line and its FLWR_HOME, so nothing else is hit.
    """
    wanted = str(flwr_home.expanduser().resolve())
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(arg.endswith(b"flower-superlink") for arg in argv[:2]) or b"--simulation" not in argv:
                continue
            environ = dict(
                item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item
            )
            home = environ.get(b"FLWR_HOME", str(Path.home() / ".flwr").encode()).decode()
            if str(Path(home).expanduser().resolve()) == wanted:
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found

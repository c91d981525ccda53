"""Run experiments: one run (`run`), a TOML experiment file (`experiment`), or list datasets/methods.

Engines:
- `flwr` (default): Flower's Ray simulation through `flwr run`, against a local simulation SuperLink
  that this runner starts on free loopback ports with a private FLWR_HOME and always stops by PID.
- `inprocess`: the same strategy/client classes under Flower's legacy `Server` loop without Ray
  (fedapp/app/inprocess.py) — for seed sweeps; results are identical in kind.
Centralized references (method `kmeans`) run directly, without Flower.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomli_w

from fedapp.launch.app_dir import flower_app_dir
from fedapp.launch.options import ClientResources
from fedapp.launch.outputs import clear_outputs
from fedapp.launch.phase import PHASE_FILE, RunPhase
from fedapp.launch.processes import (
    REPORT_GRACE_S,
    RUN_TOKEN_ENV,
    Interrupted,
    ProcessError,
    console_script,
    flower_env,
    free_port,
    run_filtered,
    start_logged,
    stop_process,
    wait_for_health,
)
from fedapp.launch.resolve import ResolvedRun, validate
from fedapp.launch.sweep import StopReport, stop_run
from fedapp.launch.watchdog import start_watchdog, stop_watchdog
from fedapp.methods import method_spec
from fedapp.report.records import await_report, mark_summary, start_summary

SUPERLINK_START_TIMEOUT_S = 60
LOG_NAME = "flower.log"  # everything Flower prints goes here; the terminal gets one line per round


class RunError(ProcessError):
    """A run did not produce its summary.json."""


def execute(
    run: ResolvedRun,
    engine: str = "flwr",
    *,
    quiet: bool = False,
    resources: ClientResources | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Validate, run, and return the parsed summary.json.

    The terminal gets one line per round (unless `quiet`); everything Flower prints goes to
    `<out-dir>/flower.log`. `overwrite`: an earlier run's outputs in the folder are removed first
    (`fedapp.launch.outputs`); without it (or `resume`) such a folder is refused. A federated run's
    summary.json says `running` and its phase from the start, so an interrupt (the `Interrupted` raised
    here carries the phase) or a kill always finds one to mark.
    """
    import json

    resources = resources or ClientResources()
    cfg = validate(run, engine, resources, overwrite=overwrite)
    if overwrite:
        clear_outputs(cfg)
    out_dir = Path(cfg.out_dir)
    summary_path = out_dir / "summary.json"
    if summary_path.exists():
        summary_path.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / LOG_NAME
    if not method_spec(cfg.method).federated:
        from fedapp.app.centralized import run_centralized

        run_centralized(cfg)
    else:
        _run_federated(run, engine, resources, log_path, quiet=quiet)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if "rounds" not in summary:  # only the entry point's own start record: the ServerApp wrote nothing
        mark_summary(out_dir, "failed", "the ServerApp wrote no summary", only_running=True)
        raise RunError(f"the run wrote no {summary_path}; see {log_path}\n{_log_tail(log_path)}")
    if summary.get("status", "running") == "running" and method_spec(cfg.method).federated:
        raise RunError(
            f"the run broke off after round {summary.get('rounds')} of {cfg.num_rounds} without finishing; "
            f"see {log_path}\n{_log_tail(log_path)}"
        )
    return summary


def _run_federated(
    run: ResolvedRun, engine: str, resources: ClientResources, log_path: Path, *, quiet: bool
) -> None:
    """Run on `engine` with summary.json marked `running` first; an interrupt learns the phase it came in,
    a run that breaks off is marked `failed` (unless the ServerApp already said how it ended)."""
    cfg = run.config
    header = {"method": cfg.method, "dataset": cfg.dataset, "num_clients": cfg.num_clients}
    phase = RunPhase(None, "starting the federation")
    start_summary(log_path.parent, {**header, "num_rounds": cfg.num_rounds}, phase.text)
    try:
        if engine == "inprocess":
            _run_inprocess(run, log_path, phase, quiet=quiet)
        else:
            _run_flwr(run, resources, log_path, phase, quiet=quiet)
    except Interrupted as exc:
        exc.phase = exc.phase or phase.text
        raise
    except RunError as exc:
        mark_summary(log_path.parent, "failed", str(exc).splitlines()[0], phase.text, only_running=True)
        raise


def _log_tail(log_path: Path, lines: int = 25) -> str:
    """The last lines of the run's log, for an error message."""
    if not log_path.exists():
        return ""
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def _run_inprocess(run: ResolvedRun, log_path: Path, phase: RunPhase, *, quiet: bool) -> None:
    from fedapp.app import client_app, server_app
    from fedapp.app.inprocess import run_inprocess, run_messages_inprocess

    phase.set("in round 1")
    with flower_log_to_file(log_path, quiet=quiet, on_line=phase.see):
        if run.config.secagg:  # SecAgg+ is Flower's message layer: the apps themselves, over a DirectGrid
            run_messages_inprocess(server_app.main, client_app.app, run, run.config.num_clients)
        else:
            run_inprocess(server_app.server_fn, client_app.client_fn, run, run.config.num_clients)


@contextmanager
def flower_log_to_file(
    log_path: Path, *, quiet: bool, on_line: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Flower's logger writes to `log_path` only; the terminal gets the per-round progress lines and
    `on_line` sees every message (how the runner follows the phase)."""
    import logging
    import sys

    from flwr.common.logger import FLOWER_LOGGER

    from fedapp.report.records import PROGRESS_MARKER

    saved = (list(FLOWER_LOGGER.handlers), FLOWER_LOGGER.level)
    file_handler = logging.FileHandler(log_path, mode="w")
    file_handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s: %(message)s"))
    handlers: list[logging.Handler] = [file_handler]
    if not quiet:
        console = logging.StreamHandler(sys.stdout)
        console.addFilter(lambda record: PROGRESS_MARKER in record.getMessage())
        console.setFormatter(_ProgressFormatter())
        handlers.append(console)
    if on_line is not None:
        follower = logging.Handler()
        follower.emit = lambda record: on_line(record.getMessage())  # type: ignore[method-assign]
        handlers.append(follower)
    FLOWER_LOGGER.handlers = handlers
    FLOWER_LOGGER.setLevel(logging.INFO)
    try:
        yield
    finally:
        file_handler.close()
        FLOWER_LOGGER.handlers, level = saved
        FLOWER_LOGGER.setLevel(level)


class _ProgressFormatter:
    """Only the text after the progress marker."""

    def format(self, record: Any) -> str:
        from fedapp.report.records import progress_text

        return progress_text(record.getMessage())


@contextmanager
def local_simulation_superlink(flwr_home: Path, env: dict[str, str]):
    """Start `flower-superlink --simulation` as `flwr run` would, but on free ports and owned by us."""
    http_port, control_port = free_port(), free_port()
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(http_port)
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(control_port)
    log_path = flwr_home / "superlink.log"
    command = [
        console_script("flower-superlink"),
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--control-api-address",
        f"127.0.0.1:{control_port}",
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--disable-runtime-dependency-installation",
    ]
    process = start_logged(command, env, log_path)
    try:
        wait_for_health(http_port, process, SUPERLINK_START_TIMEOUT_S, f"flower-superlink (log: {log_path})")
        yield process
    finally:
        stop_process(process)


def _run_flwr(
    run: ResolvedRun, resources: ClientResources, log_path: Path, phase: RunPhase, *, quiet: bool
) -> None:
    flwr_home = Path(tempfile.mkdtemp(prefix="fedapp-flwr-home-"))
    env = flower_env(flwr_home)
    if resources.ray_address:  # Flower's Ray backend calls ray.init(): it joins the cluster RAY_ADDRESS names
        env["RAY_ADDRESS"] = resources.ray_address
    phase.path = flwr_home / PHASE_FILE  # the watchdog reads it after a SIGKILL
    phase.set("starting the SuperLink")
    guard = start_watchdog(
        env[RUN_TOKEN_ENV], [flwr_home], home=flwr_home, out_dir=log_path.parent, phase_file=phase.path
    )
    started: list[subprocess.Popen] = []
    lost = ""  # the SuperLink died on its own: said once every process of the run has stopped
    interrupted: Interrupted | None = None
    try:
        run_config = flwr_home / "run-config.toml"
        run_config.write_text(tomli_w.dumps(dict(run)))
        federation = resources.federation_config(run.config.num_clients)
        app_dir = flower_app_dir(flwr_home)  # the app's packages, copied
        with local_simulation_superlink(flwr_home, env) as superlink:
            started.append(superlink)
            phase.set("starting the federation")
            command = [
                console_script("flwr"),
                "run",
                str(app_dir),
                "--stream",
                "--federation-config",
                federation,
                "--run-config",
                str(run_config),
            ]
            try:
                returncode = run_filtered(
                    command, env, log_path, quiet=quiet, cwd=app_dir, started=started, on_line=phase.see
                )
            except Interrupted:  # in the final report, the run has run through: let it keep its outputs
                await_report(log_path.parent, REPORT_GRACE_S)
                raise
            if returncode != 0 and superlink.poll() is not None:  # it died on its own, mid-run
                lost = f"SuperLink connection lost (flower-superlink exit code {superlink.returncode})"
        if returncode != 0 and not lost:
            raise RunError(f"flwr run exited with code {returncode}; see {log_path}\n{_log_tail(log_path)}")
    except Interrupted as exc:
        interrupted = exc  # told below what the sweep verified
        raise
    finally:
        _clean_up(stop_run(env[RUN_TOKEN_ENV], flwr_home, started), interrupted)
        shutil.rmtree(flwr_home, ignore_errors=True)
        stop_watchdog(guard)
    if lost:  # the ServerApp is gone now: nothing overwrites the cause any more
        mark_summary(log_path.parent, "failed", lost, phase.text)
        raise RunError(f"{lost}; see {log_path}")


def _clean_up(report: StopReport, interrupted: Interrupted | None) -> None:
    """Say what the sweep verified: to the interrupt (whose handler prints it) or, if processes are left
    after a normal end, as a warning."""
    if interrupted is not None:
        interrupted.stopped = report.describe()
    elif not report.clean:
        print(f"warning: {report.describe()}", file=sys.stderr)

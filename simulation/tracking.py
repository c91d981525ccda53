"""`--track mlflow`: each finished run logged where users track their runs, from the files it wrote.

After a run (or each run of an experiment) the run's resolved configuration becomes MLflow parameters, its
per-round metrics, seconds and bytes become metrics with the round as their step (the k selection's
criteria with k as their step), its status and reason become tags, and summary.json, rounds.json, the
plots, report.html and model/ become artifacts. Never a node's folder: its records stay where they are.

The store is MLflow's own `MLFLOW_TRACKING_URI` when set; else an embedded SQLite store with its artifacts
in `mlruns/` beside the run folders (`results/mlruns` for `--out results/x`), never the current directory
unasked: `mlflow ui --backend-store-uri sqlite:///results/mlruns/mlflow.db` lists the runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedapp.config.run import ConfigError

TRACKERS = ("mlflow",)
EXTRA = "pip install 'fedapp[track]'"
STORE_FOLDER, STORE_FILE = "mlruns", "mlflow.db"
RUN_EXPERIMENT = "fedapp"  # the MLflow experiment of single `fedapp run`s
ARTIFACTS = (
    "summary.json",
    "rounds.json",
    "report.html",
    "metrics.png",
    "tune.png",
    "tune.json",
    "wire_bytes.json",
)
MLFLOW_STATUS = {"completed": "FINISHED", "converged": "FINISHED", "degraded": "FINISHED", "failed": "FAILED"}
PARAM_LIMIT = 6000  # MLflow's longest parameter value


def check_tracker(name: str | None) -> None:
    """Before any process starts: the tracker's package is installed, else one line naming it."""
    if name is None:
        return
    if name not in TRACKERS:
        raise ConfigError(f"--track {name}: unknown tracker (one of {', '.join(TRACKERS)})")
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(
            f"--track mlflow needs MLflow, which is not installed: {EXTRA} (or pip install mlflow)"
        )


def store(root: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact root): MLFLOW_TRACKING_URI as MLflow reads it, else a SQLite store and its
    artifacts in `root/mlruns/`."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], None
    folder = Path(root).resolve() / STORE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / STORE_FILE}", (folder / "artifacts").as_uri()


class MlflowTracker:
    """Logs finished runs into one MLflow experiment (a `fedapp run`'s, or one per experiment file)."""

    def __init__(self, experiment: str, root: Path) -> None:
        import logging

        import mlflow

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store set-up lines are not ours to print
        self.uri, artifacts = store(root)
        self.client = mlflow.MlflowClient(self.uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            self.experiment_id = found.experiment_id
        else:
            location = f"{artifacts}/{experiment}" if artifacts else None
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        self.experiment = experiment

    def log_run(self, out_dir: Path, run_name: str, tags: Mapping[str, str] | None = None) -> str:
        """One run folder into a new MLflow run; returns its run id."""
        from mlflow.entities import Metric, Param

        summary = _read(out_dir / "summary.json") or {}
        history = _read(out_dir / "rounds.json") or []
        status = str(summary.get("status", "unknown"))
        all_tags = {
            "fedapp.status": status,
            "fedapp.status_reason": str(summary.get("status_reason", ""))[:PARAM_LIMIT],
            "fedapp.method": str(summary.get("method", "")),
            "fedapp.dataset": str(summary.get("dataset", "")),
            "fedapp.out_dir": str(Path(out_dir).resolve()),
            **(tags or {}),
        }
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        run_id = run.info.run_id
        params = [
            Param(key, str(value)[:PARAM_LIMIT]) for key, value in (summary.get("config") or {}).items()
        ]
        metrics = [Metric(key, value, 0, step) for key, value, step in run_metrics(summary, history)]
        for start in range(0, max(len(params), len(metrics)), 100):  # MLflow's batch limits
            self.client.log_batch(
                run_id, metrics=metrics[start : start + 100], params=params[start : start + 100]
            )
        for name in ARTIFACTS:
            if (out_dir / name).is_file():
                self.client.log_artifact(run_id, str(out_dir / name))
        if (out_dir / "model").is_dir():
            self.client.log_artifacts(run_id, str(out_dir / "model"), "model")
        self.client.set_terminated(run_id, MLFLOW_STATUS.get(status, "KILLED"))
        return run_id


def run_metrics(
    summary: Mapping[str, Any], history: Iterable[Mapping[str, Any]]
) -> list[tuple[str, float, int]]:
    """(name, value, step) of every number a run's files hold per round: evaluated metrics, seconds and
    bytes per round, the final metrics at the last step, the k selection's criteria at step k."""
    found: list[tuple[str, float, int]] = []
    for entry in history:
        for key, value in (entry.get("metrics") or {}).items():
            found.append((key, value, int(entry.get("round", 0))))
    for step, seconds in (summary.get("timing") or {}).items():
        found.append(("round_seconds", seconds.get("round_s"), int(step)))
    for step, traffic in ((summary.get("comm_bytes") or {}).get("per_round") or {}).items():
        found += [("bytes_up", traffic.get("up"), int(step)), ("bytes_down", traffic.get("down"), int(step))]
    last = int(summary.get("rounds") or 0)
    for key, value in (summary.get("metrics") or {}).items():
        found.append((f"final.{key}", value, last))
    for candidate in (summary.get("k_selection") or {}).get("candidates") or []:
        for key, value in candidate.items():
            if key != "k":
                found.append((f"k_selection.{key}", value, int(candidate["k"])))
    return [(name, float(value), step) for name, value, step in found if _finite(value)]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

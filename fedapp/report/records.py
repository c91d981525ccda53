"""Run outputs: `summary.json`, `rounds.json` and `metrics.png` in the run's output directory.

Written by the ServerApp after every evaluated round, so an interrupted run still leaves its last
complete state on disk.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedapp.report.pages.run import update_run_report

METRIC_KEYS = ("acc", "nmi", "ari", "purity", "kappa")
PROGRESS_MARKER = "[fedapp]"  # log lines the runners show on the terminal (the rest goes to the log file)


# Exit codes of the entry points (2 is a bad input, refused before anything starts).
EXIT_CODES = {"completed": 0, "converged": 0, "failed": 1, "degraded": 3}
FINISHED = ("completed", "converged", "degraded")  # a run that ran through, as its ServerApp said
REPORT_PHASE = "in the final report"  # after the method's last round: assignments and label-free metrics


def start_summary(out_dir: Path, header: Mapping[str, Any], phase: str) -> None:
    """summary.json before any process starts: status `running` and the phase. The ServerApp replaces it
    after its first evaluated round; until then an interrupt or a kill still finds a record to mark."""
    summary = {**header, "status": "running", "status_reason": f"started; {phase}", "phase": phase}
    write_json(Path(out_dir) / "summary.json", summary)


def mark_summary(
    out_dir: Path, status: str, reason: str, phase: str | None = None, *, only_running: bool = False
) -> dict[str, Any] | None:
    """Set the status of a run that its entry point (or its watchdog) saw end: a signal, a kill, a lost
    SuperLink; the server could not say why. `phase`: where the entry point saw the run, used until the
    ServerApp writes its own (it knows better: the console's progress lines lag behind its rounds).
    `only_running`: leave a summary alone unless it still says `running` (the watchdog must not overwrite
    an entry point's own ending). A run whose ServerApp had already said how it ended (`FINISHED`) keeps
    that. Returns the summary, or None when the run wrote none."""
    path = Path(out_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if summary.get("status") in FINISHED:  # it finished before the end came
        return summary
    if only_running and summary.get("status", "running") != "running":
        return summary
    phase = summary.get("phase") if "rounds" in summary and summary.get("phase") else phase
    where = f" while {phase}" if phase else ""
    counts = f"{summary.get('rounds', 0)} round(s) run, {summary.get('evaluated_rounds', 0)} evaluated"
    summary["status"] = status
    summary["status_reason"] = f"{reason}{where} ({counts})"
    if phase:
        summary["phase"] = phase
    write_json(path, summary)
    if "config" in summary:  # the ServerApp wrote its summary: its page says how the run ended
        update_run_report(Path(out_dir))
    return summary


def await_report(out_dir: Path, grace_s: float) -> bool:
    """A signal that comes in the final report, after the method's last round: give the ServerApp up to
    `grace_s` to finish it (every node's assignments.csv, the summary), so that a run which has run
    through keeps its outputs. True when summary.json then says the run ended."""
    path = Path(out_dir) / "summary.json"
    deadline = time.monotonic() + grace_s
    while True:
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        if summary.get("status", "running") != "running":
            return True
        if summary.get("phase") != REPORT_PHASE or time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def status_line(summary: Mapping[str, Any]) -> str:
    """The console's last line: the status and reason, as summary.json has them."""
    warnings = summary.get("warnings") or []
    noted = f"; {len(warnings)} warning{'s' * (len(warnings) > 1)} in summary.json" if warnings else ""
    return f"status: {summary.get('status')} ({summary.get('status_reason', '')}{noted})"


def exit_code(summary: Mapping[str, Any]) -> int:
    """0 only for a run that completed (or converged) with every client; see EXIT_CODES."""
    return EXIT_CODES.get(str(summary.get("status")), 1)


def progress_text(line: str) -> str:
    """The text after the progress marker (drops Flower's `INFO :` prefix and the marker itself)."""
    return line.split(PROGRESS_MARKER, 1)[-1].strip()


def default_out_dir(method: str, dataset: str, seed: int) -> Path:
    safe_dataset = dataset.replace(":", "_").replace("/", "_")
    return Path("results") / f"{method}-{safe_dataset}-s{seed}"


def write_json(path: Path, payload: Any, *, compact: bool = False) -> None:
    """Atomic write: readers (the runner) never see a half-written file. `compact`: on one line, for the
    files rewritten after every round while a run goes on, whose per-round records grow with the rounds
    (json.dumps takes the C encoder only for an unindented one-shot encoding, json.dump never)."""
    indent = None if compact else 2
    try:  # the NaN/inf walk only where the encoder meets one (or a type it cannot take)
        text = json.dumps(payload, indent=indent, default=_jsonable, allow_nan=False)
    except (ValueError, TypeError):
        text = json.dumps(_finite(payload), indent=indent, default=_jsonable)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _finite(value: Any) -> Any:
    """NaN/inf -> null, so the files are strict JSON (kappa is NaN for a one-class table)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    if hasattr(value, "tolist"):  # a numpy array or scalar: its values, walked the same way
        return _finite(value.tolist())
    return value


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


class _Writing:
    """The main thread's open `writing_outputs` blocks, and an interrupt that came meanwhile."""

    depth = 0
    deferred: BaseException | None = None


@contextmanager
def writing_outputs() -> Iterator[None]:
    """Outputs written in the main thread are finished before an interrupt is raised there: the handler
    (`fedapp.launch.processes.interruptible`) hands it to `defer_while_writing`, and it is raised when the
    outermost block ends. A SIGINT raised inside the first `import matplotlib` had left the module half
    imported, and writing the interrupted run's outputs then failed (AttributeError, not exit 130)."""
    if threading.current_thread() is not threading.main_thread():  # handlers run in the main thread only
        yield
        return
    _Writing.depth += 1
    try:
        yield
    finally:
        _Writing.depth -= 1
        if not _Writing.depth and _Writing.deferred is not None:
            deferred, _Writing.deferred = _Writing.deferred, None
            raise deferred


def defer_while_writing(exc: BaseException) -> bool:
    """Keep `exc` for the end of the open `writing_outputs` block; False (raise it now) when none is open."""
    if not _Writing.depth:
        return False
    _Writing.deferred = _Writing.deferred or exc
    return True


def write_run_outputs(
    out_dir: Path,
    summary: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    *,
    plot: bool = True,
    compact: bool = False,
) -> None:
    """summary.json + rounds.json (`compact`: on one line, while the run goes on); when `plot`,
    metrics.png (metric vs round; it takes ~0.3 s) and report.html (the page a person opens,
    `fedapp.report.pages.run`), drawn from those files. An interrupt waits for them (`writing_outputs`)."""
    with writing_outputs():
        write_json(out_dir / "summary.json", dict(summary), compact=compact)
        write_json(out_dir / "rounds.json", list(history), compact=compact)
        if plot:
            plot_metrics(
                out_dir / "metrics.png", history, title=f"{summary.get('method')} on {summary.get('dataset')}"
            )
            update_run_report(out_dir)


def plot_metrics(path: Path, history: Sequence[Mapping[str, Any]], title: str = "") -> None:
    """Every metric of the history against the round: integer round ticks, and a marker and line style
    per curve so that curves lying on top of each other (ACC and purity often do) stay visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    evaluated = [h for h in history if "metrics" in h]
    keys = list(dict.fromkeys(k for h in evaluated for k in h["metrics"]))
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1))), ("x", "-")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for index, key in enumerate(keys):
        points = [(int(h["round"]), h["metrics"].get(key)) for h in evaluated]
        points = [(r, value) for r, value in points if value is not None]
        if points:
            marker, line = styles[index % len(styles)]
            rounds, values = zip(*points, strict=True)
            ax.plot(rounds, values, marker=marker, linestyle=line, markersize=5, label=key, alpha=0.85)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("score")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if keys:
        ax.legend(loc="best")
    save_figure(fig, path)


def save_figure(fig: Any, path: Path, dpi: int = 100) -> None:
    """Lay `fig` out, write it to `path` (making its folder) and close it: every plot fedapp draws."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def format_metrics_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of final metrics (percentages), one row per summary."""
    header = "| method | dataset | clients | rounds | " + " | ".join(METRIC_KEYS) + " | comm MB | wall s |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        metrics = row.get("metrics", {})
        comm = row.get("comm_bytes", {})
        cells = [
            str(row.get("method")),
            str(row.get("dataset")),
            str(row.get("num_clients")),
            str(row.get("rounds")),
            *(f"{100 * metrics[k]:.2f}" if k in metrics else "-" for k in METRIC_KEYS),
            f"{comm.get('total_mb', 0.0):.3f}",
            f"{row.get('wall_seconds', 0.0):.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    free = [(row, row.get("report", {}).get("label_free")) for row in rows]
    if any(metrics for _, metrics in free):  # the label-free metrics, on a table of their own
        lines += ["", "| method | dataset | " + " | ".join(LABEL_FREE_KEYS) + " | clusters used |"]
        lines.append("|" + "---|" * (len(LABEL_FREE_KEYS) + 3))
        for row, metrics in free:
            if metrics:
                values = [_number(metrics.get(key)) for key in (*LABEL_FREE_KEYS, "n_clusters_used")]
                lines.append(f"| {row.get('method')} | {row.get('dataset')} | " + " | ".join(values) + " |")
    return "\n".join(lines)


LABEL_FREE_KEYS = ("inertia", "calinski_harabasz", "davies_bouldin", "simplified_silhouette")


def _number(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.4g}"

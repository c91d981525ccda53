"""TOML experiment files: several runs x seeds -> per-run summaries + a table (mean ± std), in markdown and
as a page (table.html) linking each run's report.

File layout (see simulation/experiments/*.toml):

    [experiment]
    name = "mnist-baselines"
    engine = "inprocess"          # or "flwr"
    seeds = [0, 1, 2]
    metrics = ["acc", "nmi", "kappa"]

    [defaults]                    # run-config keys shared by every run
    dataset = "mnist"
    [defaults.fstc]               # a method's own keys: only for the runs whose method reads them
    init-merge = "weighted"

    [[runs]]
    label = "k-FED p=0"           # a row of the table
    method = "kfed"               # any other key is a run-config override
    p = 0.0
    kfed.local-k = 20             # a method's own keys: dotted (or a [runs.kfed] table)
    preset = "cefmc-paper"        # optional: a named preset under the run's own keys
    paper = { nmi = 0.5081, kappa = 0.5026 }   # optional: the paper's numbers, shown beside ours
"""

from __future__ import annotations

import json
import statistics
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.common.config import flatten_dict

from fedapp.config.run import ConfigError, parse_run_config
from fedapp.launch.options import ClientResources
from fedapp.launch.outputs import describe, earlier_outputs
from fedapp.launch.presets import apply_preset, load_preset
from fedapp.launch.resolve import ResolvedRun, build_overrides, validate
from fedapp.methods import METHODS, config_tables, method_spec
from fedapp.report.pages.experiment import TABLE_PAGE, RowRuns, build_experiment_page
from fedapp.report.pages.html import write_page
from fedapp.report.pages.run import REPORT_FILE
from simulation.runner import RunError, execute

DEFAULT_METRICS = ("acc", "nmi", "ari", "purity", "kappa")


class ExperimentError(ValueError):
    """A malformed experiment file."""


@dataclass
class RunSpec:
    label: str
    overrides: dict[str, Any]
    paper: dict[str, float] = field(default_factory=dict)


@dataclass
class Experiment:
    name: str
    engine: str
    seeds: list[int]
    metrics: list[str]
    runs: list[RunSpec]


def load_experiment(path: Path) -> Experiment:
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ExperimentError(f"cannot read experiment file {path}: {exc}") from exc
    head = doc.get("experiment", {})
    defaults = doc.get("defaults", {})
    if not doc.get("runs"):
        raise ExperimentError(f"{path}: no [[runs]] entries")
    runs = []
    for index, entry in enumerate(doc["runs"]):
        entry = dict(entry)
        label = str(entry.pop("label", f"run{index}"))
        paper = {str(k): float(v) for k, v in dict(entry.pop("paper", {})).items()}
        preset = entry.pop("preset", defaults.get("preset"))
        try:  # every run's configuration is checked before the first run starts
            keys = run_keys(defaults, entry, preset)
            overrides = apply_preset(preset, keys)
            parse_run_config(overrides)
        except ConfigError as exc:
            raise ExperimentError(f"{path}: run '{label}': {exc}") from None
        runs.append(RunSpec(label, overrides, paper))
    return Experiment(
        name=str(head.get("name", path.stem)),
        engine=str(head.get("engine", "inprocess")),
        seeds=[int(s) for s in head.get("seeds", [0])],
        metrics=[str(m) for m in head.get("metrics", DEFAULT_METRICS)],
        runs=runs,
    )


def run_keys(defaults: Mapping[str, Any], entry: Mapping[str, Any], preset: str | None) -> dict[str, Any]:
    """One run's flat keys: [defaults] under the row's own, key by key (a row's `fstc.lambda` leaves the
    other `[defaults.fstc]` keys in place). A method's own table under [defaults] reaches only the runs
    whose method reads it, so one file can pin FSTC's keys beside baselines that have none."""
    shared = flatten_dict({k: v for k, v in defaults.items() if k != "preset"})
    own = flatten_dict({k: v for k, v in entry.items() if k != "preset"})
    method = own.get("method", shared.get("method")) or (load_preset(preset).method if preset else None)
    own_table = method_spec(method).config_table if method in METHODS else None
    other_tables = set(config_tables()) - {own_table}
    shared = {k: v for k, v in shared.items() if k.partition(".")[0] not in other_tables or "." not in k}
    return {**shared, **own}


def run_dir(out_root: Path, label: str, seed: int) -> Path:
    """The output directory of one run x seed."""
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)
    return out_root / f"{slug}-s{seed}"


def finished_summary(out_dir: Path, run: ResolvedRun) -> dict[str, Any] | None:
    """The run's summary if it finished with metrics and this very configuration, else None.

    "This very configuration" is every resolved key, defaults included: a run made before a default
    changed (or before a key existed) is run again rather than reported as today's.
    """
    path = out_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a half-written or foreign file: run it again
    resolved = run.config.to_dict()
    stored = summary.get("config", {})
    same = all(key in stored and stored[key] == value for key, value in resolved.items())
    finished = summary.get("status") in ("completed", "converged", "degraded")
    return summary if finished and summary.get("metrics") and same else None


def seed_run(spec: RunSpec, seed: int, out_root: Path) -> tuple[Path, ResolvedRun]:
    """One run x seed: its output directory and its configuration, resolved once."""
    out_dir = run_dir(out_root, spec.label, seed)
    return out_dir, build_overrides({**spec.overrides, "seed": seed}, out_dir)


def finished_runs(experiment: Experiment, spec: RunSpec, out_root: Path) -> list[dict[str, Any]] | None:
    """Every seed's finished summary of `spec` under `out_root`, or None if any seed is missing or stale."""
    summaries = []
    for seed in experiment.seeds:
        if not (run_dir(out_root, spec.label, seed) / "summary.json").is_file():
            return None  # never run: skip resolving its overrides (a vertical method reads its data)
        summary = finished_summary(*seed_run(spec, seed, out_root))
        if summary is None:
            return None
        summaries.append(summary)
    return summaries


def check_fresh_runs(experiment: Experiment, out_root: Path, only: set[str] | None) -> None:
    """Run folders holding an earlier sweep's outputs would mix two sweeps: refused (one line) before
    the first run, unless the caller reuses them (`--resume`) or replaces them (`--overwrite`)."""
    for spec in experiment.runs:
        if only and spec.label not in only:
            continue
        for seed in experiment.seeds:
            if not run_dir(out_root, spec.label, seed).exists():
                continue  # never run: skip resolving its overrides (a vertical method reads its data)
            out_dir, run = seed_run(spec, seed, out_root)
            if found := earlier_outputs(run.config):
                raise ExperimentError(
                    f"run '{spec.label}' seed {seed}: {out_dir} holds an earlier run's outputs "
                    f"({describe(found, out_dir)}): add --resume to reuse the finished runs, --overwrite to "
                    "run them again (only fedapp's own files are removed), or choose another --out"
                )


def clears(run: ResolvedRun, *, resume: bool, overwrite: bool) -> bool:
    """Whether a run of this sweep that is not reused starts from a cleared directory: with --resume or
    --overwrite its directory is the sweep's own (a run that resumes its own checkpoint keeps it)."""
    return (resume or overwrite) and not run.config.resume


def check_experiment(
    experiment: Experiment,
    out_root: Path,
    *,
    engine: str | None = None,
    only: set[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> int:
    """A dry run: every run x seed's configuration and data checked, nothing run; returns the count."""
    if only and (unknown := sorted(only - {spec.label for spec in experiment.runs})):
        raise ExperimentError(f"--only {unknown[0]!r}: no run with that label in '{experiment.name}'")
    if not (resume or overwrite):
        check_fresh_runs(experiment, out_root, only)
    count = 0
    for spec in experiment.runs:
        if only and spec.label not in only:
            continue
        for seed in experiment.seeds:
            _, run = seed_run(spec, seed, out_root)
            try:
                clear = clears(run, resume=resume, overwrite=overwrite)
                validate(run, engine or experiment.engine, ClientResources(), overwrite=clear)
            except ValueError as exc:
                raise ExperimentError(f"run '{spec.label}' seed {seed}: {exc}") from None
            count += 1
    return count


def run_experiment(
    experiment: Experiment,
    out_root: Path,
    *,
    engine: str | None = None,
    resume: bool = False,
    only: set[str] | None = None,
    progress: Callable[[str], None] = print,
    overwrite: bool = False,
    on_run: Callable[[str, int, Path], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Execute every run x seed; returns label -> list of summaries. Writes table.md, table.html (the
    table, each metric's spread over seeds, links to every run's report.html) and results.json.

    `resume`: a run x seed whose directory already holds a finished summary of the same configuration is
    reused, so a sweep of hour-long runs can be interrupted and restarted; any other run's directory is
    cleared of its earlier outputs and run again. `overwrite`: every run runs again, into a cleared
    directory. Without either, run directories holding earlier outputs are refused before the first
    run. `only`: run these labels alone; with `resume` the table and results.json still list every other
    label whose runs are all finished for these seeds, so a sweep run a label at a time ends with one
    whole table. `on_run(label, seed, out_dir)` is called after every run this call ran (not reused).
    """
    if only and (unknown := sorted(only - {spec.label for spec in experiment.runs})):
        raise ExperimentError(f"--only {unknown[0]!r}: no run with that label in '{experiment.name}'")
    if not (resume or overwrite):
        check_fresh_runs(experiment, out_root, only)
    results: dict[str, list[dict[str, Any]]] = {}
    for spec in experiment.runs:
        if only and spec.label not in only:
            if resume and (done := finished_runs(experiment, spec, out_root)) is not None:
                results[spec.label] = done
            continue
        for seed in experiment.seeds:
            out_dir, run = seed_run(spec, seed, out_root)
            summary = finished_summary(out_dir, run) if resume else None
            reused = summary is not None
            if summary is None:
                clear = clears(run, resume=resume, overwrite=overwrite)
                summary = execute(run, engine or experiment.engine, quiet=True, overwrite=clear)
                if on_run is not None:
                    on_run(spec.label, seed, out_dir)
            if summary.get("status") == "failed":
                raise RunError(f"run '{spec.label}' seed {seed} failed: {summary.get('status_reason')}")
            results.setdefault(spec.label, []).append(summary)
            shown = "  ".join(f"{m}={100 * summary['metrics'][m]:.2f}" for m in experiment.metrics)
            seconds = "reused" if reused else f"{summary['wall_seconds']:.1f} s"
            status = "" if summary.get("status") in ("completed", "converged") else f"  [{summary['status']}]"
            progress(f"[{experiment.name}] {spec.label} seed={seed}: {shown}  ({seconds}){status}")
    out_root.mkdir(parents=True, exist_ok=True)
    table = results_table(experiment, results)
    (out_root / "table.md").write_text(table + "\n")
    (out_root / "results.json").write_text(json.dumps(results, indent=2))
    write_page(out_root / TABLE_PAGE, results_page(experiment, results, out_root))
    return results


def results_page(experiment: Experiment, results: Mapping[str, list[dict[str, Any]]], out_root: Path) -> str:
    """table.html: the table with each metric's per-seed spread and a link to every run's report.html."""
    papers = {spec.label: spec.paper for spec in experiment.runs}
    rows = []
    for label, summaries in results.items():
        runs = [
            (summary, f"{run_dir(out_root, label, int(summary.get('seed', 0))).name}/{REPORT_FILE}")
            for summary in summaries
        ]
        rows.append(RowRuns(label, papers.get(label, {}), runs))
    return build_experiment_page(experiment.name, experiment.metrics, experiment.seeds, rows)


def mean_std(values: list[float]) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def results_table(experiment: Experiment, results: Mapping[str, list[dict[str, Any]]]) -> str:
    """Markdown: one row per run label, metrics in percent (mean ± std over seeds), paper beside ours."""
    papers = {spec.label: spec.paper for spec in experiment.runs}
    with_paper = any(papers.values())
    header = ["run"]
    for metric in experiment.metrics:
        header.append(metric.upper())
        if with_paper:
            header.append(f"{metric.upper()} (paper)")
    header += ["comm MB", "wall s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, summaries in results.items():
        row = [label]
        for metric in experiment.metrics:
            row.append(mean_std([100 * s["metrics"][metric] for s in summaries]))
            if with_paper:
                paper = papers.get(label, {}).get(metric)
                row.append(f"{100 * paper:.2f}" if paper is not None else "—")
        row.append(f"{statistics.fmean(s['comm_bytes']['total_mb'] for s in summaries):.3f}")
        row.append(f"{statistics.fmean(s['wall_seconds'] for s in summaries):.1f}")
        lines.append("| " + " | ".join(row) + " |")
    seeds = ", ".join(str(s) for s in experiment.seeds)
    lines.append("")
    lines.append(f"Seeds: {seeds}; metrics in percent, mean ± std over seeds.")
    return "\n".join(lines)

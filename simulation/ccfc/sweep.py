"""Run a TOML experiment file like `python -m simulation experiment`, but resumable: a run x seed whose
output directory already holds a summary.json with metrics for the same configuration is not run again.

CCFC runs take minutes to hours on a CPU, so a sweep is run once, in the background, and may be
interrupted and restarted; `--only LABEL` runs (or re-tables) a subset of the rows.

    python -m simulation.ccfc.sweep simulation/ccfc/p_sweep.toml --out results/ccfc-p-sweep
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from simulation.experiments import Experiment, load_experiment, results_table
from simulation.runner import build_overrides, execute


def run_dir(root: Path, label: str, seed: int) -> Path:
    """The output directory of one run x seed (the same names as `simulation experiment`)."""
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)
    return root / f"{slug}-s{seed}"


def finished_summary(out_dir: Path, overrides: dict[str, Any]) -> dict[str, Any] | None:
    """The run's summary if it completed with this very configuration, else None."""
    path = out_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    same = all(summary.get("config", {}).get(key) == value for key, value in overrides.items())
    return summary if summary.get("metrics") and same else None


def run_resumable(
    experiment: Experiment, out_root: Path, only: set[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every (selected) run x seed, reusing finished ones; writes table.md and results.json."""
    out_root.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for spec in experiment.runs:
        if only and spec.label not in only:
            continue
        for seed in experiment.seeds:
            out_dir = run_dir(out_root, spec.label, seed)
            overrides = build_overrides({**spec.overrides, "seed": seed}, out_dir)
            summary = finished_summary(out_dir, overrides)
            reused = summary is not None
            if summary is None:
                summary = execute(overrides, experiment.engine, quiet=True)
            results.setdefault(spec.label, []).append(summary)
            shown = "  ".join(f"{m}={100 * summary['metrics'][m]:.2f}" for m in experiment.metrics)
            note = "reused" if reused else f"{summary['wall_seconds']:.0f} s"
            print(f"[{experiment.name}] {spec.label} seed={seed}: {shown}  ({note})", flush=True)
    (out_root / "table.md").write_text(results_table(experiment, results) + "\n")
    (out_root / "results.json").write_text(json.dumps(results, indent=2))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output root")
    parser.add_argument("--only", action="append", help="run only this label (repeatable)")
    parser.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of the file's")
    args = parser.parse_args(argv)
    experiment = load_experiment(args.file)
    if args.seeds:
        experiment = dataclasses.replace(experiment, seeds=list(args.seeds))
    run_resumable(experiment, args.out, set(args.only) if args.only else None)
    print((args.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The real-data-shapes table of `simulation/papers/fstc/skew.toml`: one row per setting, FSTC's variants
beside FSBERT k-FED, and the default's rule (no more than 1 NMI below FSBERT k-FED) checked per row.

Reads whatever runs have finished under the experiment's output root (any seeds, possibly fewer than the
file's), so a sweep that is still going can be tabulated; each cell says how many seeds it holds.

    python -m simulation.papers.fstc.skew_table results/fstc-skew
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from simulation.experiments import load_experiment, run_dir

EXPERIMENT = Path(__file__).with_name("skew.toml")
BASELINE = "FSBERT k-FED"
DEFAULT = "FSTC uniform"
RULE_NMI = 1.0  # the default may trail the one-shot baseline by at most this much NMI


def collect(out_root: Path) -> dict[str, dict[str, list[dict[str, float]]]]:
    """setting -> variant -> [{'acc', 'nmi'} in percent, one per finished seed]."""
    experiment = load_experiment(EXPERIMENT)
    table: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(dict)
    for spec in experiment.runs:
        setting, _, variant = spec.label.partition(" · ")
        runs = []
        for seed in experiment.seeds:
            path = run_dir(out_root, spec.label, seed) / "summary.json"
            if path.is_file():
                summary = json.loads(path.read_text())
                if summary.get("status") in ("completed", "converged") and summary.get("metrics"):
                    runs.append({m: 100 * summary["metrics"][m] for m in ("acc", "nmi")})
        table[setting][variant] = runs
    return table


def cell(runs: list[dict[str, float]]) -> str:
    if not runs:
        return "—"
    parts = []
    for metric in ("acc", "nmi"):
        values = [r[metric] for r in runs]
        spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
        parts.append(f"{statistics.fmean(values):.2f}{spread}")
    return " / ".join(parts) + f" ({len(runs)})"


def render(table: dict[str, dict[str, list[dict[str, float]]]]) -> str:
    variants = [v for v in next(iter(table.values())) if any(row.get(v) for row in table.values())]
    lines = [
        "| setting | " + " | ".join(variants) + f" | {DEFAULT} − {BASELINE} NMI |",
        "|---|" + "---|" * (len(variants) + 1),
    ]
    for setting, row in table.items():
        if not any(row.values()):
            continue
        gap, shown = nmi_gap(row, DEFAULT), "—"
        if gap is not None:
            shown = f"{gap:+.2f}" + (" ✓" if gap >= -RULE_NMI else " ✗")
        lines.append(f"| {setting} | " + " | ".join(cell(row.get(v, [])) for v in variants) + f" | {shown} |")
    lines += ["", "Cells: ACC / NMI in percent, mean ± std over (n) seeds; — not run (settings and variants"]
    lines[-1] += " with no finished run are left out)."
    tally = rule_tally(table)
    if tally:
        lines += ["", f"Rows within {RULE_NMI:g} NMI of {BASELINE} (mean over seeds), of the rows each ran: "]
        lines[-1] += "; ".join(f"{variant} {held}/{ran}" for variant, (held, ran) in tally.items()) + "."
    return "\n".join(lines)


def nmi_gap(row: dict[str, list[dict[str, float]]], variant: str) -> float | None:
    """Mean NMI of `variant` minus the baseline's in one row; None unless both have a finished run."""
    if not row.get(variant) or not row.get(BASELINE):
        return None
    return statistics.fmean(r["nmi"] for r in row[variant]) - statistics.fmean(
        r["nmi"] for r in row[BASELINE]
    )


def rule_tally(table: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, tuple[int, int]]:
    """variant -> (rows where its mean NMI is at most RULE_NMI below the baseline's, rows it ran), so the
    default can be chosen from the table rather than from a single setting."""
    tally: dict[str, tuple[int, int]] = {}
    for row in table.values():
        for variant in row:
            gap = nmi_gap(row, variant) if variant != BASELINE else None
            if gap is not None:
                held, ran = tally.get(variant, (0, 0))
                tally[variant] = (held + (gap >= -RULE_NMI), ran + 1)
    return tally


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_root", type=Path, help="the experiment's --out directory")
    out_root = parser.parse_args(argv).out_root
    if not out_root.is_dir():
        parser.error(f"{out_root} is not a directory (the --out of simulation/papers/fstc/skew.toml)")
    table = collect(out_root)
    if not any(any(row.values()) for row in table.values()):
        parser.error(f"no finished run of simulation/papers/fstc/skew.toml under {out_root}")
    print(render(table))


if __name__ == "__main__":
    main()

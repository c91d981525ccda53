"""What a k selection leaves behind: `tune.json` (every candidate's criteria, the rule, the choice, how
sure it is and the cost) and `tune.png` (each criterion against k, the choice and the stability plateau
marked, the verdict in the title), written by `fedapp tune` and by a run that chose its k
(`strategies.k_choice`), and the table `fedapp tune` prints. A vertical run's selection holds one such
table per party (`views`) and their consensus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.maths.selection import CRITERIA
from fedapp.report.records import writing_outputs

TUNE_JSON, TUNE_PNG = "tune.json", "tune.png"


def _verdict_line(selection: dict[str, Any]) -> str:
    sure = selection.get("confidence") or {}
    if not sure:
        return ""
    line = f"confidence: {sure.get('verdict')} ({sure.get('why')})"
    if sure.get("plateau"):
        low, high = sure["plateau"]
        line += f"; as stable within the tolerance: k = {low}..{high}"
    if sure.get("runner_up"):
        line += f"; runner-up k: {', '.join(str(k) for k in sure['runner_up'])}"
    if sure.get("gap") is not None:
        line += f"; gap over a cloud without clusters: {sure['gap']:.3f}"
    if sure.get("extended"):
        ext = sure["extended"]
        line += f"; range extended from k-max {ext['from']} to {ext['to']} ({ext['passes']} passes)"
    return line


def format_table(selection: dict[str, Any]) -> str:
    """One line per candidate (`Selection.to_json()` form): k, inertia and each criterion; the choice
    marked; then the range tried and how sure the choice is. A vertical selection: each party's line."""
    if "views" in selection:
        lines = [
            f"party {pid}: chosen k = {view['chosen_k']} ({view.get('confidence', {}).get('verdict', '-')})"
            for pid, view in selection["views"].items()
        ]
        lines.append(f"chosen k = {selection['chosen_k']} (rule: {selection['rule']})")
        lines.append(_verdict_line(selection))
        return "\n".join(line for line in lines if line)
    names = ("inertia", *CRITERIA)
    lines = [f"{'k':>4}  " + "  ".join(f"{name:>21}" for name in names)]
    for row in selection["candidates"]:
        cells = "  ".join(f"{'-' if row.get(n) is None else f'{row[n]:.6g}':>21}" for n in names)
        lines.append(
            f"{row['k']:>4}  {cells}" + ("   <- chosen" if row["k"] == selection["chosen_k"] else "")
        )
    ks = [row["k"] for row in selection["candidates"]]
    lines.append(f"chosen k = {selection['chosen_k']} in {min(ks)}..{max(ks)} (rule: {selection['rule']})")
    lines.append(_verdict_line(selection))
    return "\n".join(line for line in lines if line)


def _curves(selection: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The candidate rows to plot, by label: the run's, or each party's."""
    if "views" in selection:
        return {f"party {pid}": view["candidates"] for pid, view in selection["views"].items()}
    return {"": selection["candidates"]}


def write_selection(out_dir: Path, selection: dict[str, Any]) -> None:
    """tune.json and tune.png (each criterion against k, the chosen k marked, the stability plateau
    shaded and the null's stability dotted, the verdict in the title) into `out_dir`; an interrupt waits."""
    with writing_outputs():
        _write_selection(out_dir, selection)


def _write_selection(out_dir: Path, selection: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TUNE_JSON).write_text(json.dumps(selection, indent=2) + "\n")
    chosen = selection["chosen_k"]
    sure = selection.get("confidence") or {}
    figure, axes = plt.subplots(1, len(CRITERIA), figsize=(4 * len(CRITERIA), 3.4))
    for axis, name in zip(axes, CRITERIA, strict=True):
        for label, rows in _curves(selection).items():
            values = [np.nan if row.get(name) is None else row[name] for row in rows]
            axis.plot([row["k"] for row in rows], values, marker=".", label=label or None)
        axis.axvline(chosen, color="tab:red", linestyle="--", label=f"chosen k={chosen}")
        if name == "stability" and len(_curves(selection)) == 1:  # one table: its null beside it
            rows = next(iter(_curves(selection).values()))
            nulls = [np.nan if row.get("null_stability") is None else row["null_stability"] for row in rows]
            if not np.isnan(nulls).all():
                axis.plot(
                    [row["k"] for row in rows], nulls, color="grey", linestyle=":", label="null (no clusters)"
                )
        if name == "stability" and sure.get("plateau"):
            low, high = sure["plateau"]
            axis.axvspan(low - 0.5, high + 0.5, color="tab:green", alpha=0.12, label="as stable")
        axis.set_xlabel("k")
        axis.set_title(name.replace("_", " "))
    axes[0].legend(fontsize=7)
    if sure:
        figure.suptitle(f"chosen k = {chosen}: {sure.get('verdict')} ({sure.get('why')})", fontsize=9)
    figure.tight_layout()
    figure.savefig(out_dir / TUNE_PNG, dpi=100)
    plt.close(figure)

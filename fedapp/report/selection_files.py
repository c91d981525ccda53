"""What a k selection leaves behind: `tune.json` (every candidate's criteria, the rule, the choice and the
cost) and `tune.png` (each criterion against k, the choice marked), written by `fedapp tune` and by a run
that chose its k (`strategies.k_choice`), and the table `fedapp tune` prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.maths.selection import CRITERIA

TUNE_JSON, TUNE_PNG = "tune.json", "tune.png"


def format_table(selection: dict[str, Any]) -> str:
    """One line per candidate (`Selection.to_json()` form): k, inertia and each criterion; the choice
    marked."""
    names = ("inertia", *CRITERIA)
    lines = [f"{'k':>4}  " + "  ".join(f"{name:>21}" for name in names)]
    for row in selection["candidates"]:
        cells = "  ".join(f"{'-' if row[n] is None else f'{row[n]:.6g}':>21}" for n in names)
        lines.append(
            f"{row['k']:>4}  {cells}" + ("   <- chosen" if row["k"] == selection["chosen_k"] else "")
        )
    lines.append(f"chosen k = {selection['chosen_k']} (rule: {selection['rule']})")
    return "\n".join(lines)


def write_selection(out_dir: Path, selection: dict[str, Any]) -> None:
    """tune.json and tune.png (each criterion against k, the chosen k marked) into `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TUNE_JSON).write_text(json.dumps(selection, indent=2) + "\n")
    rows = selection["candidates"]
    ks = [row["k"] for row in rows]
    chosen = selection["chosen_k"]
    figure, axes = plt.subplots(1, len(CRITERIA), figsize=(4 * len(CRITERIA), 3.2))
    for axis, name in zip(axes, CRITERIA, strict=True):
        axis.plot(ks, [np.nan if row[name] is None else row[name] for row in rows], marker=".")
        axis.axvline(chosen, color="tab:red", linestyle="--", label=f"chosen k={chosen}")
        axis.set_xlabel("k")
        axis.set_title(name.replace("_", " "))
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(out_dir / TUNE_PNG, dpi=100)
    plt.close(figure)

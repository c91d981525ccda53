"""Print what `select = best` saw in finished runs: both candidates' Calinski–Harabasz (in the start's
space), their NMI when the data are labelled, and which was kept (`report.select` of summary.json).

    python -m simulation.bench.select_table results/select/*/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(run: Path) -> str:
    summary = json.loads((run / "summary.json").read_text())
    select = summary["report"].get("select") or {}
    scores, labelled = select.get("scores") or {}, select.get("labelled") or {}
    start, final = scores.get("start"), scores.get("final")
    ratio = f"{final / start:.3f}" if start and final else "—"

    def nmi(name: str) -> str:
        value = labelled.get(name, {}).get("nmi")
        return "—" if value is None else f"{100 * value:.2f}"

    def ch(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    return (
        f"| {run.name} | {ch(start)} | {ch(final)} | {ratio} | {nmi('start')} | {nmi('final')} | "
        f"{select.get('kept', '—')} |"
    )


def main(argv: list[str]) -> int:
    runs = [Path(arg) for arg in argv if (Path(arg) / "summary.json").exists()]
    print("| run | CH start | CH final | final / start | NMI start | NMI final | kept |")
    print("|---|---|---|---|---|---|---|")
    for run in sorted(runs):
        print(row(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""An experiment's `table.html`: its table (mean ± std over seeds, the paper's figure beside ours), each
metric's per-seed spread as a dot plot, and a link to every run's own `report.html`."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedapp.report.pages.charts import dot_rows
from fedapp.report.pages.html import Raw, page, section, status_badge, table, text

TABLE_PAGE = "table.html"


@dataclass
class RowRuns:
    """One row of the table: its label, the paper's figures and each seed's summary with its page."""

    label: str
    paper: Mapping[str, float] = field(default_factory=dict)
    runs: list[tuple[Mapping[str, Any], str]] = field(default_factory=list)  # (summary, link to its page)


def build_experiment_page(
    name: str, metrics: Sequence[str], seeds: Sequence[int], rows: Sequence[RowRuns]
) -> str:
    """The page: metrics in percent as in table.md, a spread plot per metric, the runs with their links."""
    with_paper = any(row.paper for row in rows)
    headers = ["run"]
    for metric in metrics:
        headers += [metric.upper(), *([f"{metric.upper()} (paper)"] if with_paper else [])]
    headers += ["comm MB", "wall s", "runs"]
    body_rows = []
    for row in rows:
        cells: list[Any] = [row.label]
        for metric in metrics:
            cells.append(_mean_std([_percent(summary, metric) for summary, _ in row.runs]))
            if with_paper:
                paper = row.paper.get(metric)
                cells.append("—" if paper is None else f"{100 * paper:.2f}")
        cells.append(_mean([(s.get("comm_bytes") or {}).get("total_mb") for s, _ in row.runs], 3))
        cells.append(_mean([s.get("wall_seconds") for s, _ in row.runs], 1))
        links = " ".join(
            f'<a href="{text(link)}">seed {text(summary.get("seed"))}</a>' for summary, link in row.runs
        )
        cells.append(Raw(links))
        body_rows.append(cells)
    overview = table(headers, body_rows)
    overview += (
        f'<p class="note">Seeds: {", ".join(str(s) for s in seeds)}; metrics in percent, mean ± std.</p>'
    )
    spread = "".join(
        dot_rows(
            metric.upper(),
            [
                (
                    row.label,
                    [v for v in (_percent(s, metric) for s, _ in row.runs) if v is not None],
                    100 * row.paper[metric] if metric in row.paper else None,
                )
                for row in rows
            ],
            f"{metric.upper()} (%)",
        )
        for metric in metrics
    )
    runs = table(
        ("run", "seed", "status", "page"),
        [
            (row.label, summary.get("seed"), Raw(status_badge(str(summary.get("status")))), Raw(_link(link)))
            for row in rows
            for summary, link in row.runs
        ],
    )
    sections = [
        ("table", "Table", section("table", "Table", overview)),
        ("spread", "Spread", section("spread", "Spread over seeds", f'<div class="charts">{spread}</div>')),
        (
            "runs",
            "Runs",
            section("runs", "Runs", runs, "Each run's own page: the run as its server holds it."),
        ),
    ]
    return page(f"fedapp experiment: {name}", f"fedapp experiment: {name}", [], sections)


def _link(target: str) -> str:
    return f'<a href="{text(target)}">{text(target)}</a>'


def _percent(summary: Mapping[str, Any], metric: str) -> float | None:
    value = (summary.get("metrics") or {}).get(metric)
    return 100 * float(value) if isinstance(value, int | float) else None


def _mean_std(values: Sequence[float | None]) -> str:
    finite = [v for v in values if v is not None]
    if not finite:
        return "—"
    spread = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return f"{statistics.fmean(finite):.2f} ± {spread:.2f}"


def _mean(values: Sequence[Any], digits: int) -> str:
    finite = [float(v) for v in values if isinstance(v, int | float)]
    return f"{statistics.fmean(finite):.{digits}f}" if finite else "—"

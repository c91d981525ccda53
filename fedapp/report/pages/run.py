"""`OUT/report.html`: the run as the server holds it, read from the files the run wrote.

The page is a view of `summary.json`, `rounds.json`, `wire_bytes.json` and `model/model.json`: it holds
nothing they do not (aggregates, the model's words, who answered when), so it is exactly what the server
may show, and `fedapp report OUT` rebuilds it at any time. Fields it does not know (a method's own block,
new fields of the k selection) are shown generically rather than dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

from fedapp.report.pages.charts import Cell, Chart, Series, grid, line_chart, swatches
from fedapp.report.pages.html import (
    Raw,
    bulleted,
    human_bytes,
    key_values,
    number,
    page,
    section,
    status_badge,
    table,
    text,
    write_page,
)

REPORT_FILE = "report.html"
LABELLED = ("acc", "nmi", "ari", "purity", "kappa")
LABEL_FREE = ("inertia", "calinski_harabasz", "davies_bouldin", "simplified_silhouette", "n_clusters_used")
# summary.json's fields this page shows in their own sections; any other is a method's own block
KNOWN = {
    "method",
    "dataset",
    "num_clients",
    "rounds",
    "seed",
    "k",
    "metrics",
    "status",
    "status_reason",
    "stop_reason",
    "num_rounds",
    "excluded_clients",
    "config",
    "comm_bytes",
    "wall_seconds",
    "failure_messages",
    "participation",
    "timing",
    "report",
    "k_selection",
    "warnings",
    "privacy",
    "phase",
}
TAKEN = ("accepted", "#2e7d32", "answered")
MISSED = (  # participation keys, their colour and meaning, worst last (a cell shows the worst)
    ("dropped", "#b0bec5", "sat out (dropout)"),
    ("excluded", "#37474f", "excluded"),
    ("rejected", "#ef6c00", "reply rejected"),
    ("failed", "#c62828", "failed or timed out"),
)
WIRE_NOTE = (
    "Protobuf size of every message's content as the SuperLink stores it, per message kind (SecAgg+'s "
    "key set-up and shares included); round 0 is the final report, -1 the choice of k."
)


class RunFiles:
    """The files of one run folder that the page reads; a missing or unreadable one reads as empty."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.summary: dict[str, Any] = self._json("summary.json") or {}
        self.rounds: list[dict[str, Any]] = self._json("rounds.json") or []
        self.wire: dict[str, Any] = self._json("wire_bytes.json") or {}
        self.model: dict[str, Any] = self._json("model/model.json") or {}
        self.present = [
            name
            for name in ("summary.json", "rounds.json", "wire_bytes.json", "model/model.json")
            if (self.out_dir / name).is_file()
        ]

    def _json(self, name: str) -> Any:
        try:
            return json.loads((self.out_dir / name).read_text())
        except (OSError, ValueError):
            return None


def build_run_report(out_dir: Path) -> str:
    """The page of the run in `out_dir` (its summary.json must exist)."""
    files = RunFiles(out_dir)
    if not files.summary:
        raise FileNotFoundError(f"{Path(out_dir) / 'summary.json'}: no run summary to report on")
    summary = files.summary
    title = f"{summary.get('method')} on {summary.get('dataset')}"
    lines = [
        f"{status_badge(str(summary.get('status')))} {text(summary.get('status_reason', ''))}",
        f"Run folder <code>{text(Path(out_dir).resolve())}</code>",
    ]
    sections = [
        ("identity", "Run", section("identity", "Run", identity(files))),
        ("results", "Results", results(summary)),
        ("clusters", "Clusters", clusters(summary, files.model)),
        ("rounds", "Rounds", curves(summary, files.rounds)),
        ("k-selection", "Choice of k", k_selection(summary.get("k_selection"))),
        ("select", "Start or final", start_or_final((summary.get("report") or {}).get("select"))),
        ("privacy", "Privacy", privacy(summary)),
        ("participation", "Participation", participation(summary)),
        ("communication", "Communication", communication(summary, files.wire)),
        ("method", "Method", method_block(summary)),
        ("config", "Configuration", configuration(summary)),
    ]
    footer = section(
        "about",
        "About this page",
        f'<p class="note">Built from {", ".join(text(name) for name in files.present)} in the run folder: '
        "what the server holds (aggregates, the model, who answered when), never a node's records; each "
        "node's own records are on its own page, <code>nodes/&lt;partition-id&gt;/report.html</code>, on "
        "that node's machine. Rebuild it with <code>fedapp report OUT</code>.</p>",
    )
    sections.append(("about", "About", footer))
    return page(f"fedapp: {title}", f"fedapp run report: {title}", lines, sections)


def write_run_report(out_dir: Path) -> Path:
    """Build and write `out_dir/report.html`; returns its path."""
    return write_page(Path(out_dir) / REPORT_FILE, build_run_report(out_dir))


def rebuild_pages(folder: Path) -> list[Path]:
    """`fedapp report`: redraw the pages of a run folder (its own and `nodes/*/`) or of one node's
    folder from the files beside them; returns the pages written."""
    from fedapp.report.pages.node import NODE_DATA, rebuild_node_page  # numpy: not for every summary write

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    written = []
    if (folder / "summary.json").is_file():
        written.append(write_run_report(folder))
    nodes = sorted(
        (folder / "nodes").glob(f"*/{NODE_DATA}"), key=lambda p: (len(p.parent.name), p.parent.name)
    )
    for data in [folder / NODE_DATA, *nodes]:
        if data.is_file():
            written.append(rebuild_node_page(data.parent))
    if not written:
        raise FileNotFoundError(
            f"{folder}: neither a run folder (summary.json) nor a node folder ({NODE_DATA}) to draw from"
        )
    return written


def update_run_report(out_dir: Path) -> Path | None:
    """`write_run_report` where a run goes on regardless: a page that cannot be drawn is a logged
    warning, never the run's failure (the page is a view of files the run has already written)."""
    if not (Path(out_dir) / "summary.json").is_file():  # the run wrote nothing yet: nothing to show
        return None
    try:
        return write_run_report(out_dir)
    except Exception as exc:  # noqa: BLE001 - any fault drawing a view must not end a run
        from flwr.common import log

        log(WARNING, "report.html not written: %s: %s", type(exc).__name__, exc)
        return None


# ------------------------------------------------------------------------------------------ sections
def identity(files: RunFiles) -> str:
    summary, config = files.summary, files.summary.get("config") or {}
    versions = files.model.get("versions") or {}
    rounds = f"{number(summary.get('rounds'))} of {number(summary.get('num_rounds'))} configured"
    k_text = number(summary.get("k"))
    if summary.get("k_selection"):
        k_text += f" (chosen without labels by {summary['k_selection'].get('rule', 'a rule')})"
    rows: list[tuple[str, Any]] = [
        ("method", summary.get("method")),
        ("data", summary.get("dataset")),
        ("partition", config.get("partition", "—")),
        ("clients", number(summary.get("num_clients"))),
        ("rounds", rounds),
        ("k", k_text),
        ("seed", number(summary.get("seed"))),
        (
            "status",
            Raw(f"{status_badge(str(summary.get('status')))} {text(summary.get('status_reason', ''))}"),
        ),
        ("stopped because", summary.get("stop_reason", "—") or "—"),
        ("wall time", f"{number(summary.get('wall_seconds'), 3)} s"),
        ("versions", ", ".join(f"{name} {v}" for name, v in versions.items()) or "not recorded (no model/)"),
    ]
    if summary.get("phase") and summary.get("status") not in ("completed", "converged"):
        rows.append(("last phase", summary["phase"]))
    if summary.get("excluded_clients"):
        rows.append(
            ("excluded clients", "; ".join(f"{c}: {why}" for c, why in summary["excluded_clients"].items()))
        )
    warnings = summary.get("warnings") or []
    notes = f"<h3>Warnings</h3>{bulleted(warnings, 'warnings')}" if warnings else ""
    return table(("", ""), rows) + notes


def results(summary: Mapping[str, Any]) -> str:
    metrics = summary.get("metrics") or {}
    report = summary.get("report") or {}
    free = {k: v for k, v in (report.get("label_free") or {}).items() if not isinstance(v, list)}
    labelled = [(key, metrics[key]) for key in LABELLED if key in metrics]
    others = [
        (k, v) for k, v in metrics.items() if k not in LABELLED and k not in LABEL_FREE and k not in free
    ]
    parts = []
    if labelled:
        parts.append("<h3>Against the labels</h3>")
        parts.append(
            '<p class="note">Computed from the clients\' summed contingency tables (predicted cluster × '
            "class counts); labels never left a client.</p>"
        )
        parts.append(table(("metric", "value", "percent"), ((k, v, 100 * v) for k, v in labelled), (0, 1, 1)))
    if free:
        noisy = " These come from differentially private (noisy) totals." if report.get("noisy") else ""
        parts.append("<h3>Without labels</h3>")
        parts.append(
            '<p class="note">From per-cluster sums only (equal to the pooled data\'s); Calinski–Harabasz '
            f"and the silhouette: higher is better, Davies–Bouldin and inertia: lower.{noisy}</p>"
        )
        parts.append(table(("metric", "value"), free.items(), (0, 1)))
    if others:
        parts.append("<h3>The method's own</h3>" + table(("metric", "value"), others, (0, 1)))
    if not parts:
        return ""
    return section("results", "Results", "".join(parts))


def cluster_words(summary: Mapping[str, Any], model: Mapping[str, Any]) -> tuple[list[list[str]], str]:
    """Each cluster's words and what they are: the report's keywords, else a topic model's top words."""
    report = summary.get("report") or {}
    if report.get("keywords"):
        return report["keywords"], "keywords (c-TF-IDF of the clients' summed term document counts)"
    for words in (model.get("topic_words"), model.get("keywords"), summary.get("top_words")):
        if words:
            return words, "topic words (the model's top words per topic)"
    return [], ""


def clusters(summary: Mapping[str, Any], model: Mapping[str, Any]) -> str:
    report = summary.get("report") or {}
    sizes = report.get("cluster_sizes") or model.get("cluster_sizes") or []
    words, kind = cluster_words(summary, model)
    count = max(len(sizes), len(words))
    if not count:
        return ""
    total = sum(s for s in sizes if isinstance(s, int | float)) or 0
    largest = max((s for s in sizes if isinstance(s, int | float)), default=0) or 1
    rows = []
    for index in range(count):
        size = sizes[index] if index < len(sizes) else None
        share = size / total if total and isinstance(size, int | float) else None
        bar = Raw(f'<div class="bar" style="width:{160 * (size or 0) / largest:.0f}px"></div>')
        shown = ", ".join(words[index]) if index < len(words) else ""
        rows.append((index, size, "—" if share is None else f"{100 * share:.1f} %", bar, shown))
    notes = [f"{number(total)} records in {count} clusters"] if total else []
    if kind:
        notes.append(f"words: {kind}")
    if report.get("withheld_records"):
        notes.append(
            f"{number(report['withheld_records'])} records in clusters under the privacy floor sent no sums"
        )
    if report.get("noisy"):
        notes.append("sizes are differentially private (noisy) totals")
    if not words:  # no words for this kind of data: no empty column
        rows = [row[:-1] for row in rows]
    headers = ("cluster", "size", "share", "", "words")[: 5 if words else 4]
    body = table(headers, rows, (1, 1, 0, 0, 0))
    return section("clusters", "Clusters", body, "; ".join(notes))


def curves(summary: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
    """Per-round charts: the evaluated metrics, seconds, bytes and a method's own per-round values."""
    charts = []
    evaluated = [h for h in history if isinstance(h.get("metrics"), Mapping)]
    keys = list(dict.fromkeys(k for h in evaluated for k in h["metrics"]))
    rounds = [h.get("round") for h in evaluated]
    unit = [k for k in keys if all(_in_unit(h["metrics"].get(k)) for h in evaluated)]
    if unit:
        series = [Series(k, rounds, [h["metrics"].get(k) for h in evaluated]) for k in unit]
        charts.append(line_chart(Chart("metrics per evaluated round", "round", "score", series)))
    for key in [k for k in keys if k not in unit]:
        series = [Series(key, rounds, [h["metrics"].get(key) for h in evaluated])]
        charts.append(line_chart(Chart(key, "round", key, series)))
    timing = summary.get("timing") or {}
    if timing:
        ordered = sorted(timing, key=_round_key)
        names = [
            ("round_s", "round"),
            ("client_fit_max_s", "slowest client fit"),
            ("server_aggregate_s", "server"),
        ]
        series = [
            Series(label, [int(r) for r in ordered], [timing[r].get(key) for r in ordered])
            for key, label in names
        ]
        charts.append(line_chart(Chart("seconds per round", "round", "seconds", series)))
    per_round = (summary.get("comm_bytes") or {}).get("per_round") or {}
    if per_round:
        ordered = sorted(per_round, key=_round_key)
        xs = [int(r) for r in ordered]
        series = [Series(d, xs, [per_round[r].get(d, 0) / 1e3 for r in ordered]) for d in ("up", "down")]
        charts.append(line_chart(Chart("kB per round (the last: the final report)", "round", "kB", series)))
    own = method_curves(summary)
    if not any(charts) and not own:
        return ""
    body = f'<div class="charts">{"".join(charts)}</div>'
    if own:
        body += "<details><summary>the method's own values per round</summary>"
        body += f'<div class="charts">{own}</div></details>'
    note = "Metrics are drawn at the evaluated rounds (`eval-every`); hover a point for its value."
    return section("rounds", "Rounds", body, note)


def method_curves(summary: Mapping[str, Any]) -> str:
    """Charts of a method's own per-round values: lists of records with a round (e.g. FSTC's training
    losses, against the round) and lists of numbers (e.g. FFCM's centre shifts, against their position)."""
    charts = []
    for name, block in summary.items():
        if name in KNOWN or not isinstance(block, Mapping):
            continue
        for field, values in block.items():
            if not isinstance(values, list) or len(values) < 2:
                continue
            if all(isinstance(r, Mapping) and "round" in r for r in values):
                xs = [r["round"] for r in values]
                keys = list(
                    dict.fromkeys(k for r in values for k, v in r.items() if k != "round" and _number(v))
                )
                for key in keys:
                    ys = [r.get(key) for r in values]
                    if len({y for y in ys if _number(y)}) > 1:  # a constant says nothing drawn
                        chart = Chart(f"{name}.{field}: {key}", "round", key, [Series(key, xs, ys)])
                        charts.append(line_chart(chart))
            elif all(_number(v) or v is None for v in values):
                series = [Series(field, list(range(1, len(values) + 1)), values)]
                charts.append(line_chart(Chart(f"{name}.{field}", "entry", field, series)))
    return "".join(charts)


def k_selection(selection: Mapping[str, Any] | None) -> str:
    """The k selection: each criterion against k with the choice marked, the candidates, and every other
    field of the selection (rule, cost, and whatever it says about its confidence) as it is."""
    if not selection:
        return ""
    candidates = [c for c in selection.get("candidates") or [] if isinstance(c, Mapping) and "k" in c]
    chosen = selection.get("chosen_k")
    charts = []
    criteria = list(dict.fromkeys(k for c in candidates for k, v in c.items() if k != "k" and _number(v)))
    ks = [c["k"] for c in candidates]
    for name in criteria:
        marks = [(chosen, f"chosen k = {chosen}")] if _number(chosen) else []
        series = [Series(name, ks, [c.get(name) for c in candidates])]
        marker = " (the rule)" if name == selection.get("rule") else ""
        charts.append(line_chart(Chart(f"{name}{marker}", "k", name, series, marks)))
    details = {k: v for k, v in selection.items() if k != "candidates"}
    body = key_values(details) if details else ""
    body += f'<div class="charts">{"".join(charts)}</div>'
    if candidates:
        rows = [[c["k"], *(c.get(name) for name in criteria)] for c in candidates]
        body += "<details><summary>every candidate</summary>"
        body += table(("k", *criteria), rows, (True,) * (len(criteria) + 1)) + "</details>"
    rule = selection.get("rule", "?")
    note = f"k = {chosen} chosen by {rule} among {len(candidates)} candidates before round 1."
    return section("k-selection", "Choice of k", body, note)


def start_or_final(select: Mapping[str, Any] | None) -> str:
    """`select = best`: which model was kept, and each score of the start beside the final's."""
    if not select:
        return ""
    compared, rest = [], {}
    for key, value in select.items():
        if isinstance(value, Mapping) and {"start", "final"} <= set(value):
            start, final = value["start"], value["final"]
            if isinstance(start, Mapping) or isinstance(final, Mapping):
                start, final = start or {}, final or {}
                for sub in dict.fromkeys([*start, *final]):
                    compared.append((f"{key}.{sub}", start.get(sub), final.get(sub)))
            else:
                compared.append((key, start, final))
        else:
            rest[key] = value
    body = key_values(rest) if rest else ""
    if compared:
        body += table(("", "start", "final"), compared, (False, True, True))
    kept = select.get("kept", "?")
    note = (
        f"Kept: the {text(kept)} model. The starting clustering is kept when training made it clearly worse."
    )
    return section("select", "Start or final", body, note)


def privacy(summary: Mapping[str, Any]) -> str:
    config = summary.get("config") or {}
    report = summary.get("report") or {}
    rows: list[tuple[str, Any]] = [
        ("SecAgg+ (the server sees only sums)", "on" if config.get("secagg") else "off"),
        ("privacy floor (min-cluster-size)", number(config.get("min-cluster-size", "—"))),
    ]
    if "withheld_records" in report:
        rows.append(
            ("records under the floor in the final report (no sums sent)", number(report["withheld_records"]))
        )
    dp = (summary.get("privacy") or {}).get("dp")
    spent = ""
    if isinstance(dp, Mapping) and "epsilon_spent" in dp:
        spent = f": ε {number(dp['epsilon_spent'])} spent of {number(dp.get('epsilon_target'))}"
        spent += f", δ {number(dp.get('delta'))}"
    rows.append(("differential privacy", "off" if not dp else f"on{spent}"))
    body = table(("", ""), rows)
    extra = {k: v for k, v in (summary.get("privacy") or {}).items() if v is not None}
    if report.get("secagg"):
        extra["report.secagg"] = report["secagg"]
    if report.get("dp") and not (isinstance(dp, Mapping) and dp.get("report") == report["dp"]):
        extra["report.dp"] = report["dp"]
    if extra:
        body += key_values(extra)
    return section("privacy", "Privacy", body)


def participation(summary: Mapping[str, Any]) -> str:
    """Which client answered which round (a grid), each failure's one line, the report's stragglers."""
    taken = summary.get("participation") or {}
    rounds = sorted(taken, key=_round_key)
    clients = sorted({c for r in rounds for key in ("sampled", "excluded") for c in taken[r].get(key, [])})
    cells = {}
    counts = {key: 0 for key, _, _ in (TAKEN, *MISSED)}
    for column, r in enumerate(rounds):
        record = taken[r]
        for row, client in enumerate(clients):
            state = TAKEN if client in record.get("accepted", []) else None
            for missed in MISSED:
                if client in record.get(missed[0], []):
                    state = missed
            if state is not None:
                counts[state[0]] += 1
                cells[(column, row)] = Cell(state[1], f"round {r}, {client}: {state[2]}")
    legend = swatches([(fill, f"{meaning} ({counts[key]})") for key, fill, meaning in (TAKEN, *MISSED)])
    body = grid("clients × fit rounds", [str(r) for r in rounds], clients, cells) if cells else ""
    body += f"<p>{legend}</p>" if cells else ""
    failures = summary.get("failure_messages") or []
    if failures:
        body += f"<h3>Failures ({len(failures)})</h3>" + bulleted(failures, "failures")
    problems = {k: v for k, v in ((summary.get("report") or {}).get("problems") or {}).items() if v}
    if problems:
        body += "<h3>Missing from the final report</h3>" + key_values(problems)
    rows = (summary.get("report") or {}).get("assigned_rows") or {}
    if rows:
        body += "<h3>Records each partition labelled in the final report</h3>"
        body += table(("partition", "records"), sorted(rows.items(), key=lambda i: _round_key(i[0])), (0, 1))
    if not body:
        return ""
    return section(
        "participation", "Participation", body, "Hover a cell for the round, the client and what happened."
    )


def communication(summary: Mapping[str, Any], wire: Mapping[str, Any]) -> str:
    comm = summary.get("comm_bytes") or {}
    parts = []
    totals = [(k, v) for k, v in comm.items() if k != "per_round" and _number(v)]
    if totals:
        shown = [(k, number(v), human_bytes(v) if not k.endswith("_mb") else "") for k, v in totals]
        parts.append(
            "<h3>The methods' own messages (ledger)</h3>"
            '<p class="note">Arrays and config/metrics values the strategies sent and received: up/down '
            "the algorithm, eval_ evaluation, report_ the final report.</p>"
            + table(("", "bytes", ""), shown, (False, True, False))
        )
    if wire:
        kinds: dict[str, dict[str, int]] = {}
        for per_kind in wire.values():
            for kind, counts in per_kind.items():
                total = kinds.setdefault(kind, {"messages": 0, "up": 0, "down": 0})
                for key in total:
                    total[key] += int(counts.get(key, 0))
        rows = [
            (k, v["messages"], v["up"], v["down"], human_bytes(v["up"] + v["down"])) for k, v in kinds.items()
        ]
        parts.append(
            "<h3>On the wire, per message kind</h3>"
            f'<p class="note">{WIRE_NOTE}</p>'
            + table(("message kind", "messages", "bytes up", "bytes down", "total"), rows, (0, 1, 1, 1, 0))
        )
        ordered = sorted(wire, key=_round_key)
        series = [
            Series(kind, [_round_key(r) for r in ordered], [_wire_kb(wire[r].get(kind)) for r in ordered])
            for kind in kinds
        ]
        parts.append(line_chart(Chart("kB on the wire per round and message kind", "round", "kB", series)))
    if not parts:
        return ""
    return section("communication", "Communication", "".join(parts))


def method_block(summary: Mapping[str, Any]) -> str:
    own = {k: v for k, v in summary.items() if k not in KNOWN}
    if not own:
        return ""
    return section("method", "Method", key_values(own), "The method's own fields of summary.json.")


def configuration(summary: Mapping[str, Any]) -> str:
    config = summary.get("config") or {}
    if not config:
        return ""
    body = f"<details><summary>{len(config)} keys</summary>{key_values(config)}</details>"
    return section("config", "Configuration", body, "The resolved run configuration (defaults included).")


# --------------------------------------------------------------------------------------------- helpers
def _round_key(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -(10**9)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _in_unit(value: Any) -> bool:
    return value is None or (_number(value) and -0.05 <= value <= 1.05)


def _wire_kb(counts: Mapping[str, Any] | None) -> float | None:
    if not counts:
        return None
    return (int(counts.get("up", 0)) + int(counts.get("down", 0))) / 1e3

"""The few HTML pieces every page is made of: escaping, a page shell with its inline style, sections,
tables and numbers as people read them. No templates and no script: a page is a string built here."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

STYLE = """
:root { --ink: #1d2430; --muted: #5b6473; --line: #dde1e7; --soft: #f5f7fa; --accent: #2f6fb3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       background: #fff; }
header { padding: 18px 28px 12px; border-bottom: 1px solid var(--line); background: var(--soft); }
header h1 { margin: 0 0 4px; font-size: 21px; }
header p { margin: 2px 0; color: var(--muted); }
nav { padding: 6px 28px; border-bottom: 1px solid var(--line); font-size: 13px; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
main { padding: 4px 28px 32px; max-width: 1180px; }
section { margin-top: 22px; }
h2 { font-size: 17px; margin: 0 0 8px; padding-bottom: 3px; border-bottom: 1px solid var(--line); }
h3 { font-size: 14px; margin: 14px 0 6px; }
p.note { color: var(--muted); margin: 4px 0 8px; font-size: 13px; }
table { border-collapse: collapse; margin: 4px 0 10px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status { display: inline-block; padding: 1px 9px; border-radius: 10px; color: #fff; font-weight: 600; }
.status.good { background: #2e7d32; } .status.warn { background: #b26a00; }
.status.bad { background: #c62828; }
.status.other { background: #546e7a; }
ul.warnings li { color: #8a4b00; }
ul.failures li { color: #a11d1d; font-family: ui-monospace, monospace; font-size: 12px; }
.bar { height: 12px; background: var(--accent); border-radius: 2px; }
.charts { display: flex; flex-wrap: wrap; gap: 14px; }
figure { margin: 0; }
figcaption { font-size: 12px; color: var(--muted); }
svg text { font: 11px system-ui, sans-serif; fill: var(--ink); }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
.example { font-size: 12px; max-width: 760px; }
img.thumb { image-rendering: pixelated; width: 48px; height: 48px; border: 1px solid var(--line);
            margin: 2px; }
details summary { cursor: pointer; color: var(--accent); }
footer { margin-top: 28px; color: var(--muted); font-size: 12px; }
"""

LISTED = 12  # a list longer than this is shown by its length
STATUS_CLASS = {"completed": "good", "converged": "good", "degraded": "warn", "failed": "bad"}


def text(value: Any) -> str:
    """`value` as escaped HTML text."""
    return escape(str(value), quote=True)


def number(value: Any, digits: int = 4) -> str:
    """A number as people read it: integers with thousands separators, floats to `digits` significant
    digits; None and non-finite values as a dash; anything else as its text."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:.{digits}g}"
    return str(value)


def human_bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def status_badge(status: str) -> str:
    return f'<span class="status {STATUS_CLASS.get(status, "other")}">{text(status)}</span>'


def section(anchor: str, title: str, body: str, note: str = "") -> str:
    """One titled section (its `anchor` is the navigation's target)."""
    lead = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{text(anchor)}"><h2>{text(title)}</h2>{lead}{body}</section>'


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[bool] = ()) -> str:
    """A table; cells are escaped unless they are `Raw`; `numeric` columns are right-aligned numbers."""
    head = "".join(f"<th>{text(h)}</th>" for h in headers) if any(headers) else ""
    body = []
    for row in rows:
        cells = []
        for index, cell in enumerate(row):
            is_number = index < len(numeric) and numeric[index]
            shown = cell if isinstance(cell, Raw) else text(number(cell) if is_number else cell)
            cells.append(f'<td class="num">{shown}</td>' if is_number else f"<td>{shown}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""  # a list of (name, value) needs no header
    return f"<table>{thead}<tbody>{''.join(body)}</tbody></table>"


class Raw(str):
    """HTML that a table puts in a cell as it is (already escaped by whoever built it)."""


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of a nested mapping, leaves only; a short list of mappings by index, a list of
    numbers or words joined, a long list summarised by its length."""
    rows: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows += flatten(value, f"{name}.") if value else [(name, "{}")]
        elif (
            isinstance(value, list | tuple)
            and len(value) <= LISTED
            and all(isinstance(v, Mapping) for v in value)
        ):
            rows += flatten({str(index): item for index, item in enumerate(value)}, f"{name}.") or [
                (name, "[]")
            ]
        elif isinstance(value, list | tuple) and (len(value) > LISTED or any(_nested(v) for v in value)):
            rows.append((name, f"[{len(value)} items]"))
        elif isinstance(value, list | tuple):
            rows.append((name, ", ".join(number(v) for v in value) or "[]"))
        else:
            rows.append((name, value))
    return rows


def _nested(value: Any) -> bool:
    return isinstance(value, Mapping | list | tuple)


def key_values(mapping: Mapping[str, Any]) -> str:
    """A two-column table of a mapping's leaves (numbers formatted)."""
    return table(("key", "value"), ((key, number(value)) for key, value in flatten(mapping)))


def bulleted(items: Iterable[str], css_class: str = "") -> str:
    shown = "".join(f"<li>{text(item)}</li>" for item in items)
    return f'<ul class="{css_class}">{shown}</ul>' if shown else ""


def page(title: str, heading: str, lines: Sequence[str], sections: Sequence[tuple[str, str, str]]) -> str:
    """The whole document: a header (`heading`, `lines` of raw HTML under it), a navigation bar and the
    `sections` ((anchor, title, html) as `section` made them; empty html leaves the section out)."""
    shown = [(anchor, name, html) for anchor, name, html in sections if html]
    links = "".join(f'<a href="#{text(anchor)}">{text(name)}</a>' for anchor, name, _ in shown)
    lead = "".join(f"<p>{line}</p>" for line in lines)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # nothing on the page may reach the network: a policy that forbids every fetch says so to the browser
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{text(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>{text(heading)}</h1>{lead}</header><nav>{links}</nav><main>"
        + "".join(html for _, _, html in shown)
        + "</main></body></html>\n"
    )


def write_page(path: Path, document: str, mode: int | None = None) -> Path:
    """Write a page atomically (a browser never opens half a file); `mode`: its permission bits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(document)
    if mode is None:  # mkstemp's 0600 would hide the server's page from its readers: the usual bits
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return path

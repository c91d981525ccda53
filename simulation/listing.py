"""Human-readable listings of the configuration: methods with their keys and presets, and the TOML tables."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from fedapp.config.keys import ConfigSection, KeySpec
from fedapp.config.run import RunConfig, config_sections
from fedapp.datasets import DatasetInfo
from fedapp.launch.presets import available_presets
from fedapp.methods import METHODS, method_spec, methods_for_kind


def _value(value: Any) -> str:
    """A value as TOML writes it (strings quoted, booleans lower-case)."""
    return json.dumps(value) if isinstance(value, str | bool) else repr(value)


def _key_lines(specs: tuple[KeySpec, ...], prefix: str = "") -> list[str]:
    rows = [(f"{prefix}{spec.name}", spec.kind.__name__, _value(spec.default), spec) for spec in specs]
    width = max((len(name) for name, *_ in rows), default=0)
    lines = []
    for name, kind, default, spec in rows:
        allowed = f" ({spec.allowed()})" if spec.restricted else ""
        lines.append(f"  {name:<{width}}  {kind:<5} {default:<22} {spec.doc}{allowed}")
    return lines


def describe_methods(name: str | None = None) -> str:
    """Each method (or one) with its description, its own keys (defaults, docs, ranges) and presets."""
    presets = available_presets()
    names = [method_spec(name).name] if name else list(METHODS)
    out: list[str] = []
    if name is None:
        out += ['common keys (every method; `--set key=value` or `--run-config "key=value"`):']
        out += _key_lines(RunConfig.key_specs())
        out.append("")
        for table, section in config_sections().items():
            if table not in {spec.config_table for spec in METHODS.values()}:  # shared tables (dp)
                out.append(f"keys [tool.flwr.app.config.{table}] (methods that support it):")
                out += _key_lines(section.key_specs(), f"{table}.")
                out.append("")
    for method in names:
        spec = METHODS[method]
        kind = "vertical" if spec.vertical else "horizontal" if spec.federated else "centralized"
        out.append(f"{method}  [{kind}; datasets of kind {', '.join(spec.modalities)}]")
        out.append(f"  {spec.description}")
        if spec.extra:
            out.append(
                f"  needs the '{spec.extra}' extra: pip install 'fedapp[{spec.extra}]' (setup.sh has it)"
            )
        if spec.when:
            out += textwrap.wrap(
                f"when to use it: {spec.when}", 110, initial_indent="  ", subsequent_indent="    "
            )
        if spec.config is not None:
            shared = f" (shared with {spec.config_table})" if spec.config_table != method else ""
            out.append(f"  keys [tool.flwr.app.config.{spec.config_table}]{shared}:")
            out += ["  " + line for line in _key_lines(spec.config.key_specs(), f"{spec.config_table}.")]
        else:
            out.append("  keys: none of its own")
        mine = [p for p in presets.values() if p.method == method]
        for preset in mine:
            out.append(f"  preset {preset.name}: {preset.description}")
        out.append("")
    return "\n".join(out).rstrip()


def _toml_table(header: str, section: type[ConfigSection]) -> list[str]:
    lines = [f"[{header}]"]
    specs = section.key_specs()
    width = max(len(f"{s.name} = {_value(s.default)}") for s in specs)
    for spec in specs:
        assignment = f"{spec.name} = {_value(spec.default)}"
        lines.append(f"{assignment:<{width}}  # {spec.doc}")
    return lines


def render_config_toml() -> str:
    """The `[tool.flwr.app.config]` tables that pyproject.toml must hold, generated from the code."""
    lines = _toml_table("tool.flwr.app.config", RunConfig)
    for table, section in config_sections().items():
        lines += ["", *_toml_table(f"tool.flwr.app.config.{table}", section)]
    return "\n".join(lines)


def format_dataset_table(infos: tuple[DatasetInfo, ...], width: int = 160) -> str:
    """One row per dataset: name, kind, methods, files (one per line), description wrapped to `width`."""
    headers = ("name", "kind", "methods", "files", "description")
    rows = [
        [
            [info.name],
            [info.kind],
            textwrap.wrap(", ".join(methods_for_kind(info.kind)), 28) or ["-"],
            list(info.files) or ["(embedded)"],
        ]
        for info in infos
    ]
    widths = [max(len(line) for row in rows for line in row[col]) for col in range(4)]
    widths = [max(w, len(h)) for w, h in zip(widths, headers, strict=False)]
    description_width = max(30, width - sum(widths) - 2 * len(widths) - 1)
    for row, info in zip(rows, infos, strict=True):
        row.append(textwrap.wrap(info.description, description_width))

    def render(cells: list[list[str]]) -> list[str]:
        height = max(len(cell) for cell in cells)
        lines = []
        for i in range(height):
            parts = [
                (cell[i] if i < len(cell) else "").ljust(w) for cell, w in zip(cells, widths, strict=False)
            ]
            parts.append(cells[4][i] if i < len(cells[4]) else "")
            lines.append("  ".join(parts).rstrip())
        return lines

    out = render([[h] for h in headers])
    out.append("  ".join("-" * w for w in widths) + "  " + "-" * min(description_width, 40))
    for row in rows:
        out.extend(render(row))
    return "\n".join(out)


def dataset_markdown(infos: tuple[DatasetInfo, ...]) -> str:
    """The README's dataset table."""
    lines = [
        "| dataset | kind | methods | files (under the data directory) | description |",
        "|---|---|---|---|---|",
    ]
    for info in infos:
        files = "<br>".join(f"`{name}`" for name in info.files) or "(embedded)"
        methods = ", ".join(methods_for_kind(info.kind)) or "-"
        lines.append(f"| `{info.name}` | {info.kind} | {methods} | {files} | {info.description} |")
    return "\n".join(lines)

"""Named presets: TOML files under `simulation/presets/` holding run-config values for one method.

    [preset]
    method = "cefmc"
    description = "the paper's literal Alg. 1 and stopping rule"

    [config]                  # any run-config keys; a method's own keys in its table
    num-rounds = 100
    [config.cefmc]
    mm-factor = 1.0

A preset may name `extends = "OTHER"` under [preset]: it starts from OTHER's values (same method) and its
own [config] wins, so a variant states only what it changes.

`python -m simulation run --preset NAME` (and `fedapp deploy --preset NAME`) applies a preset under the
command line's own options (those win); `python -m simulation methods` lists the presets of each method.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any

from flwr.common.config import flatten_dict

from fedapp.config.run import PROJECT_ROOT, ConfigError, parse_run_config

PRESETS_DIR = PROJECT_ROOT / "simulation" / "presets"  # beside the CLI that lists them; deploy reads them too


@dataclass(frozen=True)
class Preset:
    name: str
    method: str
    description: str
    overrides: dict[str, Any]  # flat Flower keys, method included


def available_presets() -> dict[str, Preset]:
    """Every preset file, by name (the file's stem)."""
    return {path.stem: load_preset(path.stem) for path in sorted(PRESETS_DIR.glob("*.toml"))}


def load_preset(name: str, _chain: tuple[str, ...] = ()) -> Preset:
    """Read and validate one preset; an unknown name lists the known ones."""
    if name in _chain:
        raise ConfigError(f"preset '{name}' extends itself: {' -> '.join((*_chain, name))}")
    path = PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))
        raise ConfigError(f"unknown preset '{name}'; choose one of {known}")
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"preset file {path}: {exc}") from exc
    head = doc.get("preset", {})
    method = head.get("method")
    if not isinstance(method, str):
        raise ConfigError(f"preset file {path}: [preset] needs a method")
    overrides = {**flatten_dict(doc.get("config", {})), "method": method}
    base_name = head.get("extends")
    if base_name is not None:
        try:
            base = load_preset(str(base_name), (*_chain, name))
        except ConfigError as exc:  # name the preset that points at the broken one
            raise ConfigError(f"preset '{name}' extends '{base_name}': {exc}") from None
        if base.method != method:
            raise ConfigError(
                f"preset '{name}' ({method}) extends '{base.name}', a preset for '{base.method}'"
            )
        overrides = {**base.overrides, **overrides}
    try:
        parse_run_config(overrides, cross_checks=False)  # the dataset may come from the command line
    except ConfigError as exc:
        raise ConfigError(f"preset '{name}' ({path}): {exc}") from None
    return Preset(name, method, str(head.get("description", "")), overrides)


def apply_preset(name: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """`options` (the command line's keys) over the preset's; a preset for another method is an error."""
    if not name:
        return dict(options)
    preset = load_preset(name)
    method = options.get("method")
    if method is not None and method != preset.method:
        raise ConfigError(f"preset '{name}' is for method '{preset.method}', not '{method}'")
    return {**preset.overrides, **options}

"""Declaring run-config keys: one frozen dataclass per config table, each key with type, range and doc.

The common keys (`fedapp.config.run.RunConfig`) and every method's own table (`fedapp/methods/<method>.py`)
are declared the same way:

    @dataclass(frozen=True)
    class FFCMConfig(ConfigSection):
        fuzziness: float = config_key(1.1, gt=1.0, doc="fuzzifier m")

A field's Flower key is its name with `_` -> `-` unless `name=` says otherwise (`lam` -> `lambda`). Values
are coerced and range-checked by `ConfigSection.parse`, and every error names the key, the value and what
is allowed, so a typo fails before any process starts.
"""

from __future__ import annotations

import difflib
import functools
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Self


class ConfigError(ValueError):
    """A run-config value is unknown, missing, of the wrong type or out of range."""


def config_key(
    default: Any,
    *,
    doc: str,
    name: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Iterable[str] | None = None,
) -> Any:
    """A dataclass field that is a run-config key (bounds are inclusive `ge`/`le`, exclusive `gt`/`lt`)."""
    metadata = {
        "doc": doc,
        "name": name,
        "bounds": (ge, gt, le, lt),
        "choices": tuple(choices) if choices is not None else None,
    }
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class KeySpec:
    """One declared key: its Flower name, Python type, default, bounds and one-line doc."""

    attr: str
    name: str
    kind: type
    default: Any
    doc: str
    bounds: tuple[float | None, float | None, float | None, float | None] = (None, None, None, None)
    choices: tuple[str, ...] | None = None

    @property
    def restricted(self) -> bool:
        """Whether the key has a range or a list of choices."""
        return self.choices is not None or any(bound is not None for bound in self.bounds)

    def allowed(self) -> str:
        """What values are allowed, in words (for errors and listings)."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        ge, gt, le, lt = self.bounds
        low = f">= {ge:g}" if ge is not None else f"> {gt:g}" if gt is not None else ""
        high = f"<= {le:g}" if le is not None else f"< {lt:g}" if lt is not None else ""
        if low and high:
            left = "[" if ge is not None else "("
            right = "]" if le is not None else ")"
            return f"in {left}{ge if ge is not None else gt:g}, {le if le is not None else lt:g}{right}"
        return low or high or f"any {self.kind.__name__}"

    def coerce(self, value: Any, full_name: str) -> Any:
        """Check type and range of `value` for key `full_name`; integral floats become ints for int keys."""
        kind = self.kind
        if kind is str:
            if not isinstance(value, str):
                raise ConfigError(f"run-config '{full_name}' must be a string, got {value!r}")
        elif kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"run-config '{full_name}' must be true or false, got {value!r}")
        else:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"run-config '{full_name}' must be a number, got {value!r}")
            if kind is int:
                if not math.isfinite(value) or float(value) != int(value):
                    raise ConfigError(f"run-config '{full_name}' must be an integer, got {value!r}")
                value = int(value)
            else:
                value = float(value)
                if not math.isfinite(value):
                    raise ConfigError(f"run-config '{full_name}' must be a finite number, got {value!r}")
        if not self._in_range(value):
            shown = repr(value) if isinstance(value, str) else f"{value:g}" if kind is float else value
            raise ConfigError(f"run-config '{full_name}' must be {self.allowed()}, got {shown}")
        return value

    def _in_range(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        if self.kind not in (int, float):
            return True
        ge, gt, le, lt = self.bounds
        return (
            (ge is None or value >= ge)
            and (gt is None or value > gt)
            and (le is None or value <= le)
            and (lt is None or value < lt)
        )


@dataclass(frozen=True)
class ConfigSection:
    """Base of every config table; subclasses are frozen dataclasses of `config_key` fields."""

    @classmethod
    def key_specs(cls) -> tuple[KeySpec, ...]:
        """The declared keys, in declaration order (fields without `config_key` are not keys)."""
        return _key_specs(cls)

    @classmethod
    def defaults(cls, prefix: str = "") -> dict[str, Any]:
        """Flower key -> default value (with `prefix.` in front for a method table)."""
        return {_join(prefix, spec.name): spec.default for spec in cls.key_specs()}

    @classmethod
    def parse(cls, raw: Mapping[str, Any], prefix: str = "", **extra: Any) -> Self:
        """Values from `raw` (Flower names, without the prefix) over the defaults, each checked.

        `raw` must hold only this section's keys; `extra` fills fields that are not config keys.
        """
        specs = {spec.name: spec for spec in cls.key_specs()}
        unknown = sorted(set(raw) - set(specs))
        if unknown:
            raise ConfigError(
                unknown_key_message(_join(prefix, unknown[0]), [_join(prefix, n) for n in specs])
            )
        values = {
            spec.attr: spec.coerce(raw[name], _join(prefix, name)) if name in raw else spec.default
            for name, spec in specs.items()
        }
        return cls(**values, **extra)

    def with_keys(self, changes: Mapping[str, Any]) -> Self:
        """This section with some keys (Flower names) changed, each checked as `parse` checks it: a value
        derived from a parsed config (an absolute path, a default count) without parsing it all again."""
        specs = {spec.name: spec for spec in self.key_specs()}
        unknown = sorted(set(changes) - set(specs))
        if unknown:
            raise ConfigError(unknown_key_message(unknown[0], specs))
        return replace(self, **{specs[name].attr: specs[name].coerce(v, name) for name, v in changes.items()})

    def to_flower(self, prefix: str = "") -> dict[str, Any]:
        """Flower key -> value, as `flwr run --run-config` would take it."""
        return {_join(prefix, spec.name): getattr(self, spec.attr) for spec in self.key_specs()}


@functools.cache  # every message of every client parses the run config: read the type hints once
def _key_specs(cls: type) -> tuple[KeySpec, ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for item in fields(cls):
        if "doc" not in item.metadata:
            continue
        kind = hints[item.name]
        if kind not in (int, float, str, bool):
            raise TypeError(f"{cls.__name__}.{item.name}: a config key must be int, float, str or bool")
        specs.append(
            KeySpec(
                attr=item.name,
                name=item.metadata["name"] or item.name.replace("_", "-"),
                kind=kind,
                default=item.default if item.default is not MISSING else None,
                doc=item.metadata["doc"],
                bounds=item.metadata["bounds"],
                choices=item.metadata["choices"],
            )
        )
    return tuple(specs)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def unknown_key_message(key: str, valid: Iterable[str], prefer: str | None = None) -> str:
    """'unknown run-config key ...; did you mean ...?' with the nearest valid key(s).

    A bare key that exists in the `prefer` table (the selected method's) suggests that one alone.
    """
    valid = sorted(valid)
    suffix = key.rsplit(".", 1)[-1]
    same_leaf = [v for v in valid if v.rsplit(".", 1)[-1] == suffix and v != key]
    preferred = [v for v in same_leaf if prefer and v == f"{prefer}.{suffix}"]
    close = preferred or same_leaf or difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown run-config key '{key}'{hint} (`python -m simulation methods` lists every key)"

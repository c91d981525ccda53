"""Rewrite pyproject.toml's run-config tables from the code (`python -m simulation methods --toml`).

Run after adding or changing a config key; `tests/test_config.py` checks the two stay identical.
"""

from __future__ import annotations

import re
from pathlib import Path

from simulation.listing import render_config_toml

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def main() -> None:
    text = PYPROJECT.read_text()
    start = text.index("[tool.flwr.app.config]")
    following = re.search(r"^\[(?!tool\.flwr\.app\.config)", text[start:], flags=re.M)
    end = start + following.start() if following else len(text)
    PYPROJECT.write_text(text[:start] + render_config_toml().rstrip("\n") + "\n\n" + text[end:])


if __name__ == "__main__":
    main()

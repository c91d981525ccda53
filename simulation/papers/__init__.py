"""Reproductions of the four papers' experiments, one folder per method: its TOML experiment files, the
scripts that make its tables and figures, and their inputs (see docs/methods/<method>.md)."""

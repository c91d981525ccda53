"""What an image installs in its dependency layer, from pyproject.toml and constraints.txt alone.

    python requirements.py --torch none|cpu|cuda DIR   (DIR holds pyproject.toml and constraints.txt)
    -> DIR/requirements.txt, DIR/constraints-image.txt

The base dependencies, plus the `torch` extra unless `--torch none`; `flwr` without its `simulation` extra
(a SuperLink or SuperNode never starts Ray). With `--torch cpu` the CPU builds of torch and torchvision
are installed before (the Containerfile's TORCH_SPEC), so they, their pins and those of the CUDA libraries
are left out here: every other package keeps the exact version the project's figures were measured with.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

CUDA_PINS = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)==", re.IGNORECASE)


def requirements(pyproject: dict, torch: str) -> list[str]:
    project = pyproject["project"]
    wanted = list(project["dependencies"])
    if torch != "none":
        wanted += project["optional-dependencies"]["torch"]
    if torch == "cpu":  # TORCH_SPEC installed them (a CPU torchvision needs a CPU torch build's index)
        wanted = [item for item in wanted if not re.match(r"^(torch|torchvision)\b", item)]
    return [re.sub(r"^flwr\[simulation\]", "flwr", item) for item in wanted]


def constraints(lines: list[str], torch: str) -> list[str]:
    return [line for line in lines if not (torch == "cpu" and CUDA_PINS.match(line.strip()))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--torch", choices=("none", "cpu", "cuda"), required=True)
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    pyproject = tomllib.loads((args.dir / "pyproject.toml").read_text())
    pins = (args.dir / "constraints.txt").read_text().splitlines()
    (args.dir / "requirements.txt").write_text("\n".join(requirements(pyproject, args.torch)) + "\n")
    (args.dir / "constraints-image.txt").write_text("\n".join(constraints(pins, args.torch)) + "\n")


if __name__ == "__main__":
    main()

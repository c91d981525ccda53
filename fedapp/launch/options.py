"""Run options as the command line gives them: `--set key=value` items, flags that must agree with them,
path arguments, and the resources Ray reserves per simulated client."""

from __future__ import annotations

import argparse
import os
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapp.config.run import ConfigError

DEFAULT_CPUS_PER_CLIENT = 1


@dataclass(frozen=True)
class ClientResources:
    """What Ray reserves per simulated client: `client-resources-num-cpus` / `-num-gpus`.

    Ray runs as many clients at once as the machine's CPUs (and GPUs) allow: 1 CPU per client on 2 cores
    means 2 clients at a time; `gpus=0.1` lets 10 clients share one GPU. With `ray_address` the clients run
    on that cluster's nodes instead (Flower's Ray backend connects to it through `RAY_ADDRESS`), as many at
    once as all its nodes' resources allow.
    """

    cpus: int = DEFAULT_CPUS_PER_CLIENT
    gpus: float = 0.0
    ray_address: str = ""  # HOST:PORT of a Ray cluster the user started (`ray start --head`); "": a local one

    def federation_config(self, num_clients: int) -> str:
        """The `flwr run --federation-config` value for a simulation of `num_clients` SuperNodes."""
        return (
            f"num-supernodes={num_clients} client-resources-num-cpus={self.cpus} "
            f"client-resources-num-gpus={self.gpus:g}"
        )

    def validate(self, cpu_count: int | None = None, gpu_count: int | None = None) -> None:
        """Refuse what Ray could never schedule (it would wait forever instead of failing)."""
        if cpu_count is None:
            cpu_count = os.cpu_count() or 1
        if float(self.cpus) != int(self.cpus) or self.cpus < 1:
            raise ConfigError(f"--cpus-per-client must be a whole number >= 1, got {self.cpus}")
        if self.ray_address:  # the cluster's nodes, not this machine, hold the CPUs and GPUs
            check_ray_address(self.ray_address)
            if self.gpus < 0:
                raise ConfigError(f"--gpus-per-client must be >= 0, got {self.gpus:g}")
            return
        if self.cpus > cpu_count:
            raise ConfigError(f"--cpus-per-client {self.cpus} exceeds the {cpu_count} CPUs of this machine")
        if self.gpus < 0:
            raise ConfigError(f"--gpus-per-client must be >= 0, got {self.gpus:g}")
        if self.gpus > 0:
            if gpu_count is None:
                gpu_count = cuda_device_count()
            if gpu_count == 0:
                raise ConfigError(
                    f"--gpus-per-client {self.gpus:g} but no CUDA GPU is visible on this machine "
                    "(Ray would never schedule a client); use --gpus-per-client 0"
                )
            if self.gpus > gpu_count:
                raise ConfigError(f"--gpus-per-client {self.gpus:g} exceeds the {gpu_count} GPU(s) here")


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """A Ray cluster's HOST:PORT (the GCS address `ray start --head` prints) that answers; else a
    ConfigError in seconds, instead of a simulation that hangs connecting."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"--ray-address '{address}' is not HOST:PORT (the address `ray start --head` prints, e.g. "
            "10.0.0.5:6379)"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}): start one with "
            f"`ray start --head --port {port}` there, or check the address"
        ) from None


def cuda_device_count() -> int:
    """CUDA devices torch sees (0 without torch or CUDA); no torch import where no NVIDIA device exists."""
    import glob

    if not glob.glob("/dev/nvidia[0-9]*") and not Path("/proc/driver/nvidia/gpus").is_dir():
        return 0  # importing torch takes seconds: skip it where there cannot be a CUDA device
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parse_set_options(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values parse as TOML (numbers, booleans, quoted strings), else as plain strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got '{item}'")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value.strip()
    return out


def merge_flags(
    flags: Mapping[str, Any], settings: Mapping[str, Any], out: Path | None = None
) -> dict[str, Any]:
    """Flag values + `--set` values; one key given two different values (`--clients 3 --set
    num-clients=5`, `--out X --set out-dir=Y`) is a ConfigError naming both, never resolved silently."""
    named = {**flags, **({"out-dir": str(out)} if out is not None else {})}
    for key, value in settings.items():
        if key in named and named[key] is not None and str(named[key]) != str(value):
            flag = FLAG_OF.get(key, key)
            raise ConfigError(f"{flag} {named[key]} and --set {key}={value} disagree: give one of them")
    merged = {key: value for key, value in flags.items() if value is not None}
    merged.update(settings)
    return merged


FLAG_OF = {
    "num-clients": "--clients",
    "num-rounds": "--rounds",
    "out-dir": "--out",
    "data-dir": "--data-dir",
    "method": "--method",
    "dataset": "--dataset",
    "seed": "--seed",
    "partition": "--partition",
    "device": "--device",
}


def path_argument(text: str) -> Path:
    """argparse type of a path option: an empty or blank path is an error, not the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a folder or file name")
    return Path(text)

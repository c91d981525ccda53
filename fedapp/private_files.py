"""Files a node keeps of its own records (embedding cache, parsed-array cache): owner-only, written
atomically. Folders are 0700 and files 0600 whatever the umask, since they are derived data of the
records; a write goes to a temporary name in the same folder and is renamed (atomic on POSIX)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from logging import WARNING
from pathlib import Path
from typing import IO

from flwr.common.logger import log

OWNER_ONLY_DIR, OWNER_ONLY_FILE = 0o700, 0o600


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through a temporary file in the same folder, fsync, then rename over `path`."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        owner_only_fd(handle)
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def owner_only_fd(handle: int) -> None:
    """0600 exactly: `mkstemp` and `os.open` modes are narrowed by the umask, never widened, but a umask
    such as 0277 would leave a file its owner cannot rewrite."""
    if os.name == "posix":
        os.fchmod(handle, OWNER_ONLY_FILE)


def owner_only_folder(path: Path) -> None:
    """Create `path` (its parent exists) as 0700, or take group and other bits off an existing one:
    earlier versions made cache folders with the umask's mode (often 0755, readable by every local user).
    An existing folder's owner bits stay as they are, so a folder its owner made read-only stays so."""
    try:
        path.mkdir(mode=OWNER_ONLY_DIR)
        wanted = OWNER_ONLY_DIR  # exactly, whatever the umask
    except FileExistsError:
        wanted = stat.S_IMODE(path.stat().st_mode) & OWNER_ONLY_DIR
    if os.name != "posix" or stat.S_IMODE(path.stat().st_mode) == wanted:
        return
    try:
        os.chmod(path, wanted)
    except PermissionError:
        log(WARNING, "cache folder %s is not yours; it stays readable as it is", path)

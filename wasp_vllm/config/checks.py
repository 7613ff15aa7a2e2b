"""Checks on the machine a command runs on, made before any work starts: folders it will write.

A folder that cannot be written would otherwise fail minutes later, after the models loaded, with
an ``OSError`` from deep inside the store; here it is one line that names the folder and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from wasp_vllm.config.fields import ConfigError


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists: the folder a ``mkdir -p`` would write into."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def check_writable_folder(path: str | Path, option: str) -> None:
    """Refuse a folder (``option`` names the setting) that could not be created or written.

    ``os.access`` answers for the real uid, which is what the writes will use; a read-only file
    system (or /proc) is caught by the ``statvfs`` flag, which ``os.access`` ignores as root.
    """
    target = Path(path).expanduser().absolute()
    base = _nearest_existing(target)
    if not base.is_dir():
        raise ConfigError(f"{option} {path}: {base} exists and is not a folder; choose another path")
    read_only = bool(os.statvfs(base).f_flag & os.ST_RDONLY)
    if read_only or not os.access(base, os.W_OK | os.X_OK) or _pseudo(base):
        where = "is on a read-only file system" if read_only or _pseudo(base) else "is not writable"
        raise ConfigError(f"{option} {path}: {base} {where}; choose a folder you can write to")


def _pseudo(path: Path) -> bool:
    """Kernel file systems (/proc, /sys) look writable to root but refuse new folders."""
    return path.resolve().parts[1:2] in (("proc",), ("sys",))


#: A 1-minute load average above this share of the cores means the run will share them.
BUSY_SHARE = 0.5


def machine_load_note() -> str | None:
    """A note that the machine is busy (others' work already runs on its cores), or None.  For the
    dry run's plan only: a run's default-level output must not vary with the machine (the same
    settings on neighbouring data sets print the same lines), nor time anything private.

    Throughput estimates are measured on idle cores; on a loaded machine a run gets only the cores
    others leave, so its wall time grows about by (load + own work) / cores."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not every platform reports it
        return None
    cores = os.cpu_count() or 1
    if load < BUSY_SHARE * cores:
        return None
    slower = max(1.0, (load + 1) / cores)
    return (
        f"this machine is busy (load {load:.1f} on {cores} cores): the estimate assumes idle cores; "
        f"expect it to take about {slower:.1f}x as long, or more"
    )

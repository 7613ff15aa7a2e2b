"""Long-running child processes in their own process groups: start, recognise later, stop.

A ``vllm serve`` spawns engine processes of its own; started as the leader of a new session
(``start_new_session``), a server and everything it spawns share one process group, so stopping
the group stops all of it and nothing else.  What is recorded (pid and the kernel's start time of
the leader) lets a later process (``wasp-vllm fleet down``) recognise the group even if the pid has
since been given to an unrelated process.  Linux only (``/proc``), as vLLM is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

#: Processes this interpreter started, kept so they are reaped (no zombies) once they end.
_CHILDREN: dict[int, subprocess.Popen] = {}


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of ``pid``, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[2]), int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := proc_stat(int(entry.name))) and st[1] == pgid and st[0] != "Z":
            members.append(int(entry.name))
    return members


def is_ours(pid: int, started: int | None) -> bool:
    """Whether the group led by ``pid`` (started at ``started``) still has a live process.

    A pid whose leader is alive with another start time was reused: not ours.  A gone leader
    with members left is ours: the kernel gives no new process a pid that is still a group id.
    """
    leader = proc_stat(pid)
    if leader is not None and leader[2] != started:
        return False
    return bool(group_members(pid))


def spawn(cmd: Sequence[str], env: dict[str, str], log_path: str | Path) -> tuple[int, int]:
    """Start ``cmd`` (environment: ours plus ``env``) in a new session, output to ``log_path``.

    Returns its pid (also its process group id) and its start time.
    """
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            env=os.environ | env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid, (proc_stat(proc.pid) or ("", 0, 0))[2]


def exit_code(pid: int, started: int | None) -> int | str | None:
    """The exit code of a child we started, '?' for a gone process that is not our child, else None."""
    proc = _CHILDREN.get(pid)
    if proc is not None:
        return proc.poll()
    return None if is_ours(pid, started) else "?"


def reap() -> None:
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def stop_groups(groups: Sequence[tuple[int, int | None]], timeout_s: float = 60.0) -> None:
    """SIGTERM each (pid, start time) group still ours; SIGKILL what is left after ``timeout_s``."""
    left = [pid for pid, started in groups if is_ours(pid, started)]
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        for pgid in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        end = time.monotonic() + wait
        while (left := [g for g in left if group_members(g)]) and time.monotonic() < end:
            reap()
            time.sleep(0.2)
        if not left:
            break
        log.warning("process group(s) %s still running %.0f s after %s", left, wait, sig.name)
    reap()
    if left:
        raise RuntimeError(f"process group(s) {left} survived SIGKILL")


def boot_id() -> str:
    """This boot of the machine: pids recorded under another boot name nothing of ours."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def log_tail(path: str | Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log, for an error message."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"

"""A one-node Ray cluster on 127.0.0.1 for the tests and benchmarks, and the processes it leaves.

Started with ``ray start --head --block`` in a session of its own, with its own token, temp folder
and ports, so it never meets a cluster that may already run here; ``stop()`` ends exactly it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def processes() -> list[tuple[int, int, str]]:
    """(pid, session id, command line) of every live process."""
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            rows.append((int(entry.name), int(fields[3]), cmd))
    return rows


class Cluster:
    """A one-node Ray cluster on 127.0.0.1 started by ``ray start --head --block`` in its own session."""

    def __init__(self, token: str | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths
        gcs, client, dash, agent, self.serve_port = free_ports(5)
        self.address = f"127.0.0.1:{gcs}"
        self.env = os.environ | {
            # One node on loopback: Ray otherwise swaps 127.0.0.1 for the machine's routable address.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token or secrets.token_hex(16),
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0",
            "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
            # Serve retries a failing replica constructor 3 times by default (its controller, a worker
            # of this node, reads this): once is enough for the test of a deployment that cannot start.
            "RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "1",
        }  # fmt: skip
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address",
               "127.0.0.1", "--port", str(gcs), "--num-cpus", "8", "--include-dashboard", "false",
               "--disable-usage-stats", "--temp-dir", str(self.dir), "--ray-client-server-port", str(client),
               "--dashboard-port", str(dash), "--dashboard-agent-listen-port", str(agent)]  # fmt: skip
        self.log = open(self.dir / "head.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        self.sid = self.proc.pid
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 180
        while b"Ray runtime started" not in (self.dir / "head.log").read_bytes():
            assert self.proc.poll() is None, (self.dir / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "ray start did not come up in 180 s"
            time.sleep(0.5)

    def ours(self) -> list[tuple[int, int, str]]:
        """Live processes of the cluster: its session (ray start, GCS, raylet, workers, engines)."""
        return [p for p in processes() if p[1] == self.sid or str(self.dir) in p[2]]

    def stop(self) -> list[tuple[int, int, str]]:
        """SIGTERM to ``ray start --block`` (it stops what it started); SIGKILL what is left after 90 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=90)
        left = self.ours()
        for pid, _, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()
        return left

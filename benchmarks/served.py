"""Served against in-process generation, and one replica against two (your own ``vllm serve``).

The same prompts (half zero-shot, half contrastive, task "drugs"), the same seeds and the same
sampling (the runs' default top-k 50, temperature 1, exactly ``new_tokens`` new tokens per prompt)
go to three engines of the same model in one process:

- in-process: ``VLLMEngine.generate``, as a run builds it;
- served, 1 replica: ``OpenAIEngine`` against one ``vllm serve`` as a user runs it
  (``tests/vllm_servers.py``: on CPU eager mode, no chunked prefill, same KV cache);
- served, 2 replicas: ``OpenAIEngine`` over two such servers (``name@URL1|URL2``).

The calls alternate (order rotated every repetition) and every prefix cache is reset before each
call (``LLM.reset_prefix_cache``; ``POST /reset_prefix_cache`` on the servers, which
``VLLM_SERVER_DEV_MODE=1`` enables).  Reported: median tokens/s of each, the served/in-process
and two/one replica ratios (medians of the per-repetition ratios), and tokens per CPU-second.

    python -m benchmarks.served [--quick] [--out benchmarks/results]

writes ``served.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report
from benchmarks import gen_workload as gw

NAME = "served"
TITLE = "Served (vllm serve + OpenAIEngine) against in-process generation; one replica against two"
LABELS = {
    "in_process": "in-process (VLLMEngine)",
    "served_1": "served, 1 replica (OpenAIEngine)",
    "served_2": "served, 2 replicas (OpenAIEngine over both)",
}


@dataclass(frozen=True)
class Settings:
    plm: str = "smollm2"
    n_prompts: int = 32
    new_tokens: int = 32
    reps: int = 5
    concurrency: int = 16  # requests in flight per replica
    gpu: bool = False


def make_settings(quick: bool, gpu: bool) -> Settings:
    if gpu:
        return Settings(n_prompts=128 if quick else 512, new_tokens=64 if quick else 128, reps=3, gpu=True)
    return Settings(n_prompts=16 if quick else 32, new_tokens=32, reps=5)


def params(s: Settings) -> Any:
    from wasp_vllm.engines import GenerationParams

    n = s.new_tokens
    return GenerationParams(max_new_tokens=n, min_new_tokens=n, temperature=1.0, top_k=50)


def start_servers(s: Settings, directory: Path) -> tuple[list[str], list[Any], float]:
    """Two `vllm serve` servers of the model, as a user runs them; URLs, processes, start-up wall time."""
    from tests.ray_cluster import free_ports
    from tests.vllm_servers import start_server, wait_healthy
    from wasp_vllm.engines.registry import resolve_plm

    ports = free_ports(2)
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    logs = [directory / f"{s.plm}-{i}.log" for i in range(2)]
    extra = ["--gpu-memory-utilization", "0.3"] if s.gpu else []
    env = {"VLLM_SERVER_DEV_MODE": "1"}  # adds /reset_prefix_cache
    started = time.perf_counter()
    model = str(resolve_plm(s.plm).path)
    procs = [start_server(model, p, log, env, extra, s.plm) for p, log in zip(ports, logs, strict=True)]
    wait_healthy(procs, urls, logs, 900)
    return urls, procs, time.perf_counter() - started


def variants(engine: Any, clients: dict[str, Any], prompts: list[str], seeds: list[int], p: Any
             ) -> dict[str, Callable[[], int]]:  # fmt: skip
    """The timed calls; each resets the prefix caches it uses, then returns the tokens generated."""
    import httpx

    def in_process() -> int:
        engine._llm.reset_prefix_cache()
        return sum(c.n_tokens for c in engine.generate(prompts, seeds, p))

    def served(client: Any) -> Callable[[], int]:
        def call() -> int:
            for r in client.replicas:
                httpx.post(r.url.removesuffix("/v1") + "/reset_prefix_cache", timeout=30).raise_for_status()
            return sum(c.n_tokens for c in client.generate(prompts, seeds, p))

        return call

    return {"in_process": in_process, **{k: served(c) for k, c in clients.items()}}


def measure(s: Settings) -> dict[str, Any]:
    from tests.vllm_servers import stop_servers
    from wasp_vllm.engines.openai_engine import OpenAIEngine
    from wasp_vllm.engines.registry import PRESETS

    prompts, kinds = gw.bench_prompts(s.n_prompts)
    seeds = [1_000 + i for i in range(len(prompts))]
    chat = PRESETS[s.plm].chat
    with tempfile.TemporaryDirectory(prefix="served-bench-") as tmp:
        procs: list[Any] = []
        try:
            urls, procs, server_startup = start_servers(s, Path(tmp))
            engine, startup = gw.start_vllm(s.plm, s.gpu)
            clients = {key: OpenAIEngine(s.plm, urls[:n], chat=chat, concurrency=s.concurrency)
                       for key, n in (("served_1", 1), ("served_2", 2))}  # fmt: skip
            try:
                warm = gw.fixed_length_params(8)
                for e in (engine, *clients.values()):  # warm-up, not timed
                    e.generate(prompts[:4], [0, 1, 2, 3], warm)
                calls = variants(engine, clients, prompts, seeds, params(s))
                runs = gw.interleave(calls, s.reps, s.plm, s.gpu)
                stats = {k: c.stats() for k, c in clients.items()}
            finally:
                gw.close_with_timeout(engine)
        finally:
            stop_servers(procs)
    return {
        "prompts": {"n": len(prompts), "zero_shot": kinds.count("zero_shot"),
                    "contrastive": kinds.count("contrastive")},
        "startup_s": {"in_process": round(startup, 1), "two_servers_in_parallel": round(server_startup, 1)},
        "replica_stats": stats,
        "runs": runs,
    }  # fmt: skip


def summary(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    return gw.replica_summary(res["runs"], "served_1")


def table(payload: dict[str, Any]) -> report.Table:
    s, res = payload["settings"], payload["results"]
    sm = summary(res)
    cols = ["engine", "median tok/s", "min", "max", "median tok/CPU-s", "vs in-process (paired median)",
            "vs 1 replica (paired median)"]  # fmt: skip
    t = report.Table(f"Same prompts, same seeds ({s['plm']}, {'GPU' if s['gpu'] else 'CPU'})", cols)
    for key, v in sm.items():
        t.rows.append([LABELS[key], v["median_tps"], v["min_tps"], v["max_tps"], v["median_tpcs"],
                       round(v["vs_in_process"], 3), round(v["vs_one_replica"], 3)])  # fmt: skip
    p, up = res["prompts"], res["startup_s"]
    t.notes += [
        f"served / in-process: {sm['served_1']['vs_in_process']:.3f} (one replica); two replicas / one: "
        f"{sm['served_2']['vs_one_replica']:.3f}.",
        f"{p['n']} prompts ({p['zero_shot']} zero-shot, {p['contrastive']} contrastive), exactly "
        f"{s['new_tokens']} new tokens each, top-k 50; {s['reps']} repetitions, order rotated; all prefix "
        f"caches reset before every call; {s['concurrency']} requests in flight per replica.",
        f"start-up: in-process engine {up['in_process']} s; two servers started together "
        f"{up['two_servers_in_parallel']} s (to /health).",
        "CPU time counts this process and every child (the in-process engine's and both servers' processes, "
        "busy or idle).",
    ]
    if not s["gpu"]:
        t.notes.append(
            "On this CPU both replicas share the same cores, so a second replica cannot add throughput; "
            "on a GPU box each replica has its own GPU and replicas scale as data parallelism does."
        )
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    runs, sm = payload["results"]["runs"], summary(payload["results"])
    title = (
        f"served/in-process {sm['served_1']['vs_in_process']:.2f}, "
        f"2/1 replicas {sm['served_2']['vs_one_replica']:.2f}"
    )
    gw.replica_plot(runs, path, ["in-process", "served\n1 replica", "served\n2 replicas"], title)


def main(argv: Sequence[str] | None = None) -> int:
    args = bench_cli.workload_parser(__doc__, NAME).parse_args(argv)

    def settings() -> Settings:
        from wasp_vllm.engines.devices import gpu_available

        return bench_cli.override(make_settings(args.quick, gpu_available()), n_prompts=args.prompts,
                                  new_tokens=args.new_tokens, reps=args.reps)  # fmt: skip

    payload = bench_cli.measure_or_load(args, argv, __file__, settings, measure)
    report.write_all(args.out, NAME, TITLE, payload, [table(payload)], plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

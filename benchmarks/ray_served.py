"""Ray-served (Ray Serve + ray.serve.llm) against in-process generation; one replica against two.

The same prompts (half zero-shot, half contrastive, task "drugs"), the same seeds and the same
sampling (top-k 50, temperature 1, exactly ``new_tokens`` new tokens per prompt) go to three
engines of the same model, on the same machine:

- in-process: ``VLLMEngine.generate``, as a run builds it;
- Ray, 1 replica: ``OpenAIEngine`` against a Ray Serve application of one replica;
- Ray, 2 replicas: ``OpenAIEngine`` against an application of two replicas (Ray routes between them).

Both applications are built from ``wasp_vllm.ops.fleet.llm_config``, as ``wasp-vllm fleet up`` builds
them, on a one-node cluster this script starts on 127.0.0.1 (``ray start --head --block``) and
stops; each is Ray Serve LLM's development app, which adds ``POST /reset_prefix_cache``.  Calls
alternate (order rotated every repetition) and every prefix cache is reset before each call.
Start-up is timed for each: the in-process engine; ``ray start``; each application until Ray
Serve reports it RUNNING.

    python -m benchmarks.ray_served [--quick] [--out benchmarks/results]

writes ``ray_served.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report
from benchmarks import gen_workload as gw

NAME = "ray_served"
TITLE = "Ray Serve (ray.serve.llm + OpenAIEngine) against in-process generation; one replica against two"
LABELS = {
    "in_process": "in-process (VLLMEngine)",
    "ray_1": "Ray Serve, 1 replica",
    "ray_2": "Ray Serve, 2 replicas (Ray routes)",
}


@dataclass(frozen=True)
class Settings:
    plm: str = "smollm2"
    n_prompts: int = 32
    new_tokens: int = 32
    reps: int = 5
    concurrency: int = 16  # requests in flight per route (the run's OpenAIEngine default)


def make_settings(quick: bool) -> Settings:
    return Settings(n_prompts=16 if quick else 32, reps=3 if quick else 5)


def deploy(s: Settings, app: str, replicas: int, route: str) -> float:
    """One Ray Serve LLM application of ``replicas`` replicas at ``route``; seconds until RUNNING."""
    from ray import serve
    from ray.llm._internal.serve.core.ingress.dev_ingress import build_dev_openai_app
    from ray.serve.llm import LLMConfig

    from wasp_vllm.ops import fleet, ray_fleet

    entry = fleet.PLMEntry(name=s.plm, model=s.plm, replicas=replicas, kv_cache_gib=1)
    config = LLMConfig(**fleet.llm_config(entry, fleet.model_source(s.plm), on_gpu=False))
    started = time.perf_counter()
    target = serve.RunTarget(
        target=build_dev_openai_app({"llm_configs": [config]}), name=app, route_prefix=route
    )
    serve.run_many([target], wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    ray_fleet._wait_running(serve, app, 900)
    return time.perf_counter() - started


def variants(engine: Any, clients: dict[str, Any], prompts: list[str], seeds: list[int], p: Any, plm: str
             ) -> dict[str, Callable[[], int]]:  # fmt: skip
    """The timed calls; each resets the prefix caches it uses, then returns the tokens generated."""
    import httpx

    def in_process() -> int:
        engine._llm.reset_prefix_cache()
        return sum(c.n_tokens for c in engine.generate(prompts, seeds, p))

    def served(client: Any) -> Callable[[], int]:
        def call() -> int:
            base = client.replicas[0].url.removesuffix("/v1")
            httpx.post(f"{base}/reset_prefix_cache", json={"model": plm}, timeout=60).raise_for_status()
            return sum(c.n_tokens for c in client.generate(prompts, seeds, p))

        return call

    return {"in_process": in_process, **{k: served(c) for k, c in clients.items()}}


def measure_on(cluster: Any, s: Settings, engine: Any) -> dict[str, Any]:
    from ray import serve

    from wasp_vllm.engines import GenerationParams
    from wasp_vllm.engines.openai_engine import OpenAIEngine
    from wasp_vllm.ops import ray_fleet

    prompts, kinds = gw.bench_prompts(s.n_prompts)
    seeds = [1_000 + i for i in range(len(prompts))]
    with ray_fleet.connected(cluster.address):
        serve.start(http_options={"host": "127.0.0.1", "port": cluster.serve_port})
        startup = {"ray_1": deploy(s, "one", 1, "/one"), "ray_2": deploy(s, "two", 2, "/two")}
        base = f"http://127.0.0.1:{cluster.serve_port}"
        clients = {k: OpenAIEngine(s.plm, f"{base}/{route}/v1", chat=True, concurrency=s.concurrency)
                   for k, route in (("ray_1", "one"), ("ray_2", "two"))}  # fmt: skip
        warm = gw.fixed_length_params(8)
        for e in (engine, *clients.values()):  # warm-up, not timed
            e.generate(prompts[:4], [0, 1, 2, 3], warm)
        n = s.new_tokens
        p = GenerationParams(max_new_tokens=n, min_new_tokens=n, temperature=1.0, top_k=50)
        runs = gw.interleave(variants(engine, clients, prompts, seeds, p, s.plm), s.reps, s.plm, False)
        stats = {k: c.stats() for k, c in clients.items()}
        for app in ("one", "two"):
            serve.delete(app)
    return {"prompts": {"n": len(prompts), "zero_shot": kinds.count("zero_shot"),
                        "contrastive": kinds.count("contrastive")},
            "startup_s": {k: round(v, 1) for k, v in startup.items()}, "replica_stats": stats,
            "runs": runs}  # fmt: skip


def measure(s: Settings) -> dict[str, Any]:
    from tests.ray_cluster import Cluster

    # Read when ray is first imported (vLLM imports it too, before the cluster exists): one node on
    # loopback and the cluster's token (see tests/ray_cluster.py).
    token = secrets.token_hex(16)
    os.environ |= {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
                   "RAY_AUTH_TOKEN": token}  # fmt: skip
    engine, in_process_startup = gw.start_vllm(s.plm, False)  # alone on the machine while it starts
    try:
        started = time.perf_counter()
        cluster = Cluster(token)
        ray_startup = time.perf_counter() - started
        try:
            res = measure_on(cluster, s, engine)
        finally:
            left = cluster.stop()
        assert not left, f"processes left 90 s after SIGTERM: {left}"
    finally:
        gw.close_with_timeout(engine)
    res["startup_s"] |= {"in_process": round(in_process_startup, 1), "ray_start": round(ray_startup, 1)}
    return res


def summary(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    return gw.replica_summary(res["runs"], "ray_1")


def table(payload: dict[str, Any]) -> report.Table:
    s, res = payload["settings"], payload["results"]
    sm = summary(res)
    cols = [
        "engine",
        "median tok/s",
        "min",
        "max",
        "vs in-process (paired median)",
        "vs 1 replica (paired median)",
    ]
    t = report.Table(f"Same prompts, same seeds ({s['plm']}, CPU, one machine)", cols)
    for key, v in sm.items():
        t.rows.append([LABELS[key], v["median_tps"], v["min_tps"], v["max_tps"], round(v["vs_in_process"], 3),
                       round(v["vs_one_replica"], 3)])  # fmt: skip
    p, up = res["prompts"], res["startup_s"]
    t.notes += [
        f"Ray-served / in-process: {sm['ray_1']['vs_in_process']:.3f} (one replica); two replicas / one: "
        f"{sm['ray_2']['vs_one_replica']:.3f}.",
        f"start-up: in-process engine {up['in_process']} s; `ray start --head` {up['ray_start']} s; "
        f"application of 1 replica {up['ray_1']} s, of 2 replicas {up['ray_2']} s (until Ray Serve reports "
        "RUNNING).",
        f"{p['n']} prompts ({p['zero_shot']} zero-shot, {p['contrastive']} contrastive), exactly "
        f"{s['new_tokens']} new tokens each, top-k 50; {s['reps']} repetitions, order rotated; every prefix "
        f"cache reset before each call; {s['concurrency']} requests in flight per route.",
        "On this 2-core machine the replicas share the same cores (and the in-process engine idles beside "
        "them), so a second replica cannot add throughput; on a GPU cluster each replica has its own GPU.",
    ]
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    runs, sm = payload["results"]["runs"], summary(payload["results"])
    title = (
        f"Ray/in-process {sm['ray_1']['vs_in_process']:.2f}, 2/1 replicas {sm['ray_2']['vs_one_replica']:.2f}"
    )
    gw.replica_plot(runs, path, ["in-process", "Ray Serve\n1 replica", "Ray Serve\n2 replicas"], title)


def main(argv: Sequence[str] | None = None) -> int:
    args = bench_cli.workload_parser(__doc__, NAME).parse_args(argv)

    def settings() -> Settings:
        return bench_cli.override(make_settings(args.quick), n_prompts=args.prompts,
                                  new_tokens=args.new_tokens, reps=args.reps)  # fmt: skip

    payload = bench_cli.measure_or_load(args, argv, __file__, settings, measure)
    report.write_all(args.out, NAME, TITLE, payload, [table(payload)], plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

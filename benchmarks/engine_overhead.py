"""What the vLLM engine wrapper costs: ``VLLMEngine.generate`` against ``vllm.LLM.generate``.

Both drive the *same* ``vllm.LLM`` (the wrapper's own), on the same prompts with the same
``SamplingParams`` (one per prompt, each with its own seed, exactly as the wrapper builds them),
so start-up is paid once.  The calls alternate (order rotated every repetition), the prefix cache
is reset before every call, and every prompt gets exactly the same number of new tokens.  Reported:
median tokens/s and the wrapper/direct ratio by wall time and by CPU time (target >= 0.95).  On a
GPU (and with ``--unseeded``) a third row calls vLLM with *unseeded* requests: what the per-request
seeds that WASP needs (identical prompts must give different samples) cost in vLLM.

    python -m benchmarks.engine_overhead [--quick] [--out benchmarks/results]

writes ``engine_overhead.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report
from benchmarks import gen_workload as gw

NAME = "engine_overhead"
TITLE = "vLLM engine wrapper against vllm.LLM.generate"
LABELS = {
    "vllm_engine": "VLLMEngine.generate (wrapper)",
    "vllm_direct": "LLM.generate, same SamplingParams",
    "vllm_direct_unseeded": "LLM.generate, unseeded (for reference)",
}


@dataclass(frozen=True)
class Settings:
    plm: str = "smollm2"
    n_prompts: int = 64
    new_tokens: int = 64
    reps: int = 10
    unseeded_row: bool = False
    gpu: bool = False


def make_settings(quick: bool, gpu: bool) -> Settings:
    if quick:
        return Settings(
            n_prompts=64 if gpu else 16, new_tokens=64 if gpu else 32, reps=6, unseeded_row=gpu, gpu=gpu
        )
    return Settings(
        n_prompts=256 if gpu else 64, new_tokens=128 if gpu else 64, reps=10, unseeded_row=gpu, gpu=gpu
    )


def sampling_params_like_wrapper(params: Any, seeds: Sequence[int] | None) -> Any:
    """The SamplingParams ``VLLMEngine.generate`` builds (one per request); ``None``: one unseeded."""
    from vllm import SamplingParams

    def one(seed: int | None) -> SamplingParams:
        return SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,
            max_tokens=params.max_new_tokens,
            min_tokens=params.min_new_tokens,
            seed=None if seed is None else int(seed),
            stop=list(params.stop),
        )

    return one(None) if seeds is None else [one(s) for s in seeds]


def variants(
    engine: Any, prompts: list[str], seeds: list[int], params: Any, s: Settings
) -> dict[str, Callable[[], int]]:
    """The timed calls; each returns the number of generated tokens."""
    llm = engine._llm  # the very LLM the wrapper drives
    formatted = [engine.format_prompt(p) for p in prompts]

    def wrapper() -> int:
        llm.reset_prefix_cache()
        return sum(c.n_tokens for c in engine.generate(prompts, seeds, params))

    def direct(seeded: bool = True) -> int:
        llm.reset_prefix_cache()
        sp = sampling_params_like_wrapper(params, seeds if seeded else None)
        return sum(len(o.outputs[0].token_ids) for o in llm.generate(formatted, sp, use_tqdm=False))

    out: dict[str, Callable[[], int]] = {"vllm_engine": wrapper, "vllm_direct": direct}
    if s.unseeded_row:
        out["vllm_direct_unseeded"] = lambda: direct(seeded=False)
    return out


def measure(s: Settings) -> dict[str, Any]:
    prompts, kinds = gw.bench_prompts(s.n_prompts)
    seeds = [1_000 + i for i in range(len(prompts))]
    params = gw.fixed_length_params(s.new_tokens)
    engine, startup = gw.start_vllm(s.plm, s.gpu)
    try:
        lengths = gw.prompt_tokens(engine, prompts)
        few = prompts[:4] + prompts[-4:]
        engine.generate(few, list(range(len(few))), gw.fixed_length_params(8))  # warm-up, not timed
        runs = gw.interleave(variants(engine, prompts, seeds, params, s), s.reps, s.plm, s.gpu)
    finally:
        gw.close_with_timeout(engine)
    return {
        "prompts": {
            "n": len(prompts),
            "zero_shot": kinds.count("zero_shot"),
            "contrastive": kinds.count("contrastive"),
            "tokens_mean": sum(lengths) / len(lengths),
        },
        "startup_s": round(startup, 2),
        "runs": runs,
    }


def summary(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per variant: median tok/s, tok/CPU-s and the paired-median ratios to the direct call."""
    runs, out = res["runs"], {}
    for key in runs:
        tps = [r["tps"] for r in runs[key]]
        out[key] = {
            "median_tps": report.median(tps),
            "min_tps": min(tps),
            "max_tps": max(tps),
            "median_tpcs": report.median([r["tokens_per_cpu_s"] for r in runs[key]]),
            "wall_ratio": report.median(gw.paired_ratios(runs, key, "vllm_direct", "tps")),
            "cpu_ratio": report.median(gw.paired_ratios(runs, key, "vllm_direct", "tokens_per_cpu_s")),
        }
    return out


def table(payload: dict[str, Any]) -> report.Table:
    s, res = payload["settings"], payload["results"]
    sm = summary(res)
    t = report.Table(
        f"Wrapper vs direct ({s['plm']}, one LLM instance)",
        [
            "variant",
            "median tok/s",
            "min",
            "max",
            "median tok/CPU-s",
            "ratio to direct, wall (paired median)",
            "ratio to direct, CPU (paired median)",
        ],
    )
    for key, v in sm.items():
        t.rows.append(
            [
                LABELS.get(key, key),
                v["median_tps"],
                v["min_tps"],
                v["max_tps"],
                v["median_tpcs"],
                round(v["wall_ratio"], 3),
                round(v["cpu_ratio"], 3),
            ]
        )
    wall, cpu = sm["vllm_engine"]["wall_ratio"], sm["vllm_engine"]["cpu_ratio"]
    of_medians = report.ratio(sm["vllm_engine"]["median_tps"], sm["vllm_direct"]["median_tps"])
    cpu_ok = cpu >= 0.95 or cpu != cpu  # nan: no CPU figure
    verdict = "met" if wall >= 0.95 and cpu_ok else ("met on CPU time only" if cpu >= 0.95 else "NOT met")
    p = res["prompts"]
    t.notes += [
        f"wrapper / direct: {wall:.3f} by wall time, {cpu:.3f} by CPU time (medians of the per-repetition "
        f"ratios; ratio of the median tok/s {of_medians:.3f}); target >= 0.95: {verdict}.",
        f"{p['n']} prompts ({p['zero_shot']} zero-shot, {p['contrastive']} contrastive, mean "
        f"{p['tokens_mean']:.0f} prompt tokens), exactly {s['new_tokens']} new tokens each; {s['reps']} "
        "repetitions, the order alternating (A B, B A, ...); prefix cache reset before every call. CPU time "
        "= this process and vLLM's engine processes (robust to other tenants' load; wall time is not).",
    ]
    if "vllm_direct_unseeded" in sm:
        cost = (1 - 1 / sm["vllm_direct_unseeded"]["wall_ratio"]) * 100
        t.notes.append(f"per-request seeds cost {cost:+.1f} % of the unseeded throughput here (wall time).")
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    runs, sm = payload["results"]["runs"], summary(payload["results"])
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, key in enumerate(runs):
        vals = [r["tps"] for r in runs[key]]
        ax.bar(i, report.median(vals), color=["tab:blue", "tab:orange", "tab:gray"][i], alpha=0.8)
        ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
    ax.set_xticks(range(len(runs)), ["wrapper", "direct", "direct\nunseeded"][: len(runs)])
    ax.set_ylabel("tokens/s (bars: median; dots: repetitions)")
    v = sm["vllm_engine"]
    ax.set_title(f"wrapper / direct = {v['wall_ratio']:.3f} (wall), {v['cpu_ratio']:.3f} (CPU time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = bench_cli.workload_parser(__doc__, NAME)
    p.add_argument("--unseeded", action="store_true", help="add the unseeded row (default on a GPU)")
    args = p.parse_args(argv)

    def settings() -> Settings:
        from wasp_vllm.engines.devices import gpu_available

        return bench_cli.override(make_settings(args.quick, gpu_available()), n_prompts=args.prompts,
                                  new_tokens=args.new_tokens, reps=args.reps,
                                  unseeded_row=args.unseeded or None)  # fmt: skip

    payload = bench_cli.measure_or_load(args, argv, __file__, settings, measure)
    report.write_all(args.out, NAME, TITLE, payload, [table(payload)], plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

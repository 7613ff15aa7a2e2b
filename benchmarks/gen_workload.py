"""The generation workload shared by ``engine_overhead.py`` and ``reference_loop.py``.

Prompts of task "drugs" (half zero-shot, half contrastive with in-context examples written for
this benchmark), a fixed number of new tokens per prompt (EOS suppressed, no stop strings, so
tokens/s compare directly), and interleaved timing: the variants alternate, the order rotates
every repetition, and each call records wall time and the CPU time of the whole process tree.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

log = logging.getLogger("gen_workload")

# In-context examples of the contrastive prompts: made-up texts, never taken from a data set.
# "good" ones are fluent, "bad" ones terse or off-topic.
EXAMPLES: dict[str, dict[str, list[str]]] = {
    "positive": {
        "good": [
            "After two weeks my headaches were down to one a month and I had no side effects at all.",
            "This finally let me sleep through the night; I wake up rested and clear-headed.",
            "My skin cleared up within a month and the dryness was easy to manage with lotion.",
            "I was skeptical, but my anxiety is far more manageable and I can work again.",
        ],
        "bad": [
            "good drug.",
            "It works i guess, five stars, buy it.",
            "Pharmacy was nice and parking was easy.",
            "ok ok ok it was fine fine fine",
        ],
    },
    "neutral": {
        "good": [
            "It helped with the pain somewhat, but the nausea in the first week was hard to take.",
            "Some nights it works and some nights it does not; I am still deciding whether to stay on it.",
            "Mood is a little better, though I gained a few pounds, so it is a trade-off for me.",
            "It did the job for a while, then seemed to lose its effect after about three months.",
        ],
        "bad": [
            "meh.",
            "Not sure. Maybe. We will see.",
            "The box is blue and the pills are small.",
            "it is a drug that I took",
        ],
    },
    "negative": {
        "good": [
            "Within days I had a rash and constant dizziness, and my symptoms did not improve at all.",
            "I felt numb and exhausted every day; coming off it took my doctor two months.",
            "It made my migraines worse and the stomach cramps kept me home from work.",
            "After six weeks there was no change, only dry mouth and trouble sleeping.",
        ],
        "bad": ["bad.", "Worst thing ever!!!!! never!!!!", "The pharmacist was rude to me.", "no no no no"],
    },
}


def bench_prompts(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Half zero-shot, half contrastive prompts of task "drugs" (labels cycle, attributes drawn)."""
    from wasp_vllm.tasks import build_prompt, draw_contrastive_examples, get_task, pick_attribute

    task = get_task("drugs")
    rng = np.random.default_rng(seed)
    prompts, kinds = [], []
    for i in range(n):
        label = task.labels[i % len(task.labels)]
        attribute = pick_attribute(task, label, rng)
        kind = "zero_shot" if i < n // 2 else "contrastive"
        good: list[str] = []
        bad: list[str] = []
        if kind == "contrastive":
            good, bad = draw_contrastive_examples(EXAMPLES[label]["good"], EXAMPLES[label]["bad"], 8, rng)
        prompts.append(build_prompt(task, kind, label, attribute, good=good, bad=bad))
        kinds.append(kind)
    return prompts, kinds


def fixed_length_params(new_tokens: int) -> Any:
    """Exactly ``new_tokens`` tokens per prompt; top-p 0.95 without top-k, as the reference samples."""
    from wasp_vllm.engines import GenerationParams

    return GenerationParams(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0, top_p=0.95, top_k=0
    )


def start_vllm(name: str, gpu: bool, **settings: Any) -> tuple[Any, float]:
    """A ``VLLMEngine`` as a run builds it (seed 0, 1 GiB CPU KV cache, run ``settings`` such as
    ``dtype`` on top); returns it and its start-up s."""
    from wasp_vllm.config import RunConfig
    from wasp_vllm.config.roles import EngineArgs
    from wasp_vllm.engines import EngineOptions
    from wasp_vllm.engines.registry import resolve_plm
    from wasp_vllm.engines.vllm_engine import VLLMEngine

    # on a GPU, 0.35 of the card leaves room for the hf engine and the reference loop
    share = 0.35 if gpu else None
    engine_args = EngineArgs(gpu_memory_utilization=share, **settings)  # dtype=...: engine arguments
    cfg = RunConfig(plms=[name], engine="vllm", seed=0, engine_args=engine_args)
    start = time.perf_counter()
    engine = VLLMEngine(resolve_plm(name), EngineOptions.from_config(cfg))
    return engine, time.perf_counter() - start


def close_with_timeout(engine: Any, timeout_s: float = 60.0) -> None:
    """Close an engine without hanging the benchmark when its worker already died."""
    thread = threading.Thread(target=engine.close, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("closing engine %s timed out after %.0f s", getattr(engine, "name", "?"), timeout_s)
    gc.collect()


def prompt_tokens(engine: Any, prompts: Sequence[str]) -> list[int]:
    """Prompt lengths in tokens, as the vLLM engine formats and tokenizes them."""
    formatted = [engine.format_prompt(p) for p in prompts]
    ids = engine._llm.get_tokenizer()(formatted, add_special_tokens=not engine.chat)["input_ids"]
    return [len(t) for t in ids]


@dataclass
class Timed:
    tokens: int
    seconds: float
    cpu_seconds: float = float("nan")

    def as_dict(self) -> dict[str, float]:
        tps = self.tokens / self.seconds if self.seconds > 0 else float("nan")
        tpcs = self.tokens / self.cpu_seconds if self.cpu_seconds > 0 else float("nan")
        return {
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "tps": round(tps, 2),
            "tokens_per_cpu_s": round(tpcs, 2),
        }


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and its descendants (vLLM's engine processes).

    On a shared machine wall time swings with the other tenants' load; CPU time much less.
    """
    try:
        import psutil
    except ImportError:
        return float("nan")
    me, total = psutil.Process(), 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], int], sync: bool) -> Timed:
    if sync:
        cuda_sync()
    cpu0, start = tree_cpu_seconds(), time.perf_counter()
    tokens = fn()
    if sync:
        cuda_sync()
    return Timed(tokens, time.perf_counter() - start, tree_cpu_seconds() - cpu0)


def interleave(
    variants: dict[str, Callable[[], int]], reps: int, label: str, sync: bool
) -> dict[str, list[dict]]:
    """Run every variant ``reps`` times, rotating the order each repetition (A B, B A, ...)."""
    keys = list(variants)
    res: dict[str, list[dict]] = {k: [] for k in keys}
    for rep in range(reps):
        for key in keys[rep % len(keys) :] + keys[: rep % len(keys)]:
            r = timed(variants[key], sync=sync).as_dict()
            res[key].append(r)
            log.info(
                "%s rep %d %-22s %5d tokens %7.2f s %7.1f tok/s %7.1f tok/CPU-s",
                label,
                rep,
                key,
                r["tokens"],
                r["seconds"],
                r["tps"],
                r["tokens_per_cpu_s"],
            )
    return res


def paired_ratios(runs: dict[str, list[dict]], key: str, base: str, field: str) -> list[float]:
    """Per-repetition ratios key/base (each pair ran back to back, under about the same load)."""
    return [
        a[field] / b[field] for a, b in zip(runs[key], runs[base], strict=True) if b[field] and b[field] > 0
    ]


# --- one engine against its served replicas (served.py, ray_served.py) ---------------------------


def replica_summary(runs: dict[str, list[dict]], one_replica: str) -> dict[str, dict[str, float]]:
    """Per variant: tokens/s (median, min, max, per CPU-second) and paired ratios against the
    in-process engine and against ``one_replica``."""
    from benchmarks import report  # the benchmarks' reporting helper, next to this file

    out = {}
    for key, rows in runs.items():
        tps = [r["tps"] for r in rows]
        out[key] = {
            "median_tps": report.median(tps),
            "min_tps": min(tps),
            "max_tps": max(tps),
            "median_tpcs": report.median([r["tokens_per_cpu_s"] for r in rows]),
            "vs_in_process": report.median(paired_ratios(runs, key, "in_process", "tps")),
            "vs_one_replica": report.median(paired_ratios(runs, key, one_replica, "tps")),
        }
    return out


def replica_plot(runs: dict[str, list[dict]], path: Any, ticks: Sequence[str], title: str) -> None:
    """Bars of each variant's median tokens/s, dots for its repetitions."""
    from benchmarks import report

    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, key in enumerate(runs):
        vals = [r["tps"] for r in runs[key]]
        ax.bar(i, report.median(vals), color=["tab:blue", "tab:orange", "tab:green"][i], alpha=0.8)
        ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
    ax.set_xticks(range(len(runs)), list(ticks)[: len(runs)])
    ax.set_ylabel("tokens/s (bars: median; dots: repetitions)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- one PLM's engine in two variants, side by side (model_dtype.py, engine_cores.py)


@dataclass(frozen=True)
class PLMWorkload:
    """Sizes of a two-variant benchmark: which PLMs, how many prompts, new tokens per prompt, and
    repetitions of each variant."""

    plms: tuple[str, ...] = ("smollm2", "gemma3")
    n_prompts: int = 32
    new_tokens: int = 64
    reps: int = 4


def timed_variants(
    engines: Mapping[str, Any], params: Mapping[str, Any], s: PLMWorkload, label: str
) -> dict[str, list[dict]]:
    """Warm each variant up (its engine with its params), then time the same prompts, per-request
    seeds and exactly ``s.new_tokens`` new tokens on each, alternating, with the prefix cache reset
    before every call.  Variants may share an engine."""
    prompts, _ = bench_prompts(s.n_prompts)
    seeds = [1_000 + i for i in range(len(prompts))]
    for v, engine in engines.items():  # warm-up, not timed
        short = replace(params[v], max_new_tokens=8, min_new_tokens=8)
        engine.generate(prompts[:4], [0, 1, 2, 3], short)

    def call(engine: Any, p: Any) -> Callable[[], int]:
        def run() -> int:
            engine._llm.reset_prefix_cache()
            return sum(c.n_tokens for c in engine.generate(prompts, seeds, p))

        return run

    return interleave({v: call(e, params[v]) for v, e in engines.items()}, s.reps, label, sync=False)


def variants_side_by_side(
    starts: Mapping[str, Callable[[], Any]], s: PLMWorkload, label: str
) -> dict[str, list[dict]]:
    """Start every variant's engine (all alive in one process, as a run keeps its engines) and time
    them on the same workload (:func:`timed_variants`)."""
    engines: dict[str, Any] = {}
    try:
        for variant, start in starts.items():
            engines[variant] = start()
        params = fixed_length_params(s.new_tokens)
        return timed_variants(engines, dict.fromkeys(engines, params), s, label)
    finally:
        for engine in engines.values():
            close_with_timeout(engine)


def variant_rows(runs: dict[str, dict[str, list[dict]]], base: str, other: str) -> list[list[Any]]:
    """Per PLM: median tokens/s of ``base`` and ``other``, and the paired ``other / base`` ratios by
    wall time and by CPU time (medians over repetitions)."""
    from benchmarks import report

    rows = []
    for plm, per_variant in runs.items():
        tps = [report.median([r["tps"] for r in per_variant[v]]) for v in (base, other)]
        by = ("tps", "tokens_per_cpu_s")
        ratios = [report.median(paired_ratios(per_variant, other, base, field)) for field in by]
        rows.append([plm, *tps, *(round(r, 2) for r in ratios)])
    return rows


def variant_bars(
    runs: dict[str, dict[str, list[dict]]], variants: Sequence[str], path: Any, title: str
) -> None:
    """Per PLM, a bar of each variant's median tokens/s and dots for its repetitions."""
    from benchmarks import report

    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    variant_bars_on(ax, runs, variants, "tps")
    ax.set_ylabel("tokens/s (bars: median; dots: repetitions)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def variant_bars_on(
    ax: Any, runs: dict[str, dict[str, list[dict]]], variants: Sequence[str], field: str
) -> None:
    """On ``ax``, per PLM, a bar of each variant's median ``field`` and dots for its repetitions."""
    from benchmarks import report

    for i, per_variant in enumerate(runs.values()):
        for j, variant in enumerate(variants):
            vals = [r[field] for r in per_variant[variant]]
            x = i + (j - 0.5) * 0.38
            ax.bar(x, report.median(vals), width=0.36, color=("tab:gray", "tab:blue")[j],
                   label=variant if i == 0 else None)  # fmt: skip
            ax.scatter([x] * len(vals), vals, color="k", s=10, zorder=3)
    ax.set_xticks(range(len(runs)), list(runs))

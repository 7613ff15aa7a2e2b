"""The PLMs' number type on this machine: vLLM in bfloat16 against float32, side by side.

``--dtype auto`` (the default, ``engines.devices.model_dtype``) computes in bfloat16 on a GPU or on
a CPU with native bf16 (AVX-512 BF16, AMX, Arm BF16) and in float32 on other CPUs, where bf16 is
emulated.  This measures that choice: per PLM, one ``VLLMEngine`` in each type, both alive in one
process as a run keeps its engines, the same prompts and per-request seeds, exactly the same number of
new tokens, the calls alternating (order rotated every repetition) with the prefix cache reset
before each.  Reported: median tokens/s per type and the paired float32/bfloat16 ratio by wall time
and by CPU time, with the CPU's flags and what ``auto`` picks here.

    python -m benchmarks.model_dtype [--quick] [--plms smollm2,gemma3] [--out benchmarks/results] [--name N]

writes ``model_dtype.{md,json,png}`` (``model_dtype_amx.*``: the same on a CPU with AMX);
``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import bench_cli, report
from benchmarks import gen_workload as gw

TITLE = "PLM number type: float32 against bfloat16 on vLLM"
DTYPES = ("bfloat16", "float32")


def make_settings(quick: bool) -> gw.PLMWorkload:
    return gw.PLMWorkload(("smollm2",), n_prompts=16, new_tokens=32, reps=3) if quick else gw.PLMWorkload()


def start(plm: str, dtype: str) -> Any:
    """A ``VLLMEngine`` as a run builds it, in this number type."""
    return gw.start_vllm(plm, False, dtype=dtype)[0]


def one_plm(plm: str, s: gw.PLMWorkload) -> dict[str, list[dict]]:
    starts = {dtype: partial(start, plm, dtype) for dtype in DTYPES}
    return gw.variants_side_by_side(starts, s, plm)


def measure(s: gw.PLMWorkload) -> dict[str, Any]:
    from wasp_vllm.engines.devices import cpu_has_native_bf16, gpu_available, model_dtype

    return {
        "native_bf16": cpu_has_native_bf16(),
        "gpu": gpu_available(),
        "auto_picks": model_dtype("auto"),
        "runs": {plm: one_plm(plm, s) for plm in s.plms},
    }


def table(payload: dict[str, Any]) -> report.Table:
    s, res = payload["settings"], payload["results"]
    t = report.Table(
        "Tokens per second by number type (median over repetitions)",
        ["PLM", "bfloat16 tok/s", "float32 tok/s", "float32 / bfloat16, wall (paired median)",
         "float32 / bfloat16, CPU time (paired median)"],
    )  # fmt: skip
    t.rows += gw.variant_rows(res["runs"], *DTYPES)
    where = "a GPU" if res["gpu"] else f"a CPU {'with' if res['native_bf16'] else 'without'} native bf16"
    t.notes += [
        f"This machine: {where}; `--dtype auto` picks {res['auto_picks']} here.",
        f"{s['n_prompts']} prompts, exactly {s['new_tokens']} new tokens each, the same seeds in both types; "
        f"{s['reps']} repetitions, the order alternating; prefix cache reset before every call. Both engines "
        "live in one process, as a run's engines do.",
    ]
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    title = f"vLLM on {payload['machine'].get('device', 'this machine')}"
    gw.variant_bars(payload["results"]["runs"], DTYPES, path, title)


def main(argv: list[str] | None = None) -> int:
    return bench_cli.plm_variants_main(argv, __file__, __doc__, TITLE, make_settings, measure, table, plot)


if __name__ == "__main__":
    sys.exit(main())

"""What asking vLLM for the samples' log-probabilities costs (``--max-sample-logprob`` and
``--min-sample-logprob`` ask for them; runs without the bounds do not).

Per PLM, one ``VLLMEngine`` as a run builds it; the same prompts, per-request seeds and exactly the
same number of new tokens, once plain and once with ``logprobs`` asked (vLLM's ``logprobs=0``: the
written token's log-probability under the raw logits), the calls alternating (order rotated every
repetition) with the prefix cache reset before each.  Reported: median tokens/s of each and the
paired with/without ratio by wall time and by CPU time.

    python benchmarks/logprob_cost.py [--quick] [--plms smollm2,gemma3] [--out benchmarks/results]

writes ``logprob_cost.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cli  # noqa: E402
import gen_workload as gw  # noqa: E402 - the benchmarks' own helpers, next to this file
import report  # noqa: E402

TITLE = "Cost of the samples' log-probabilities on vLLM"
VARIANTS = ("plain", "logprobs")


def make_settings(quick: bool) -> gw.PLMWorkload:
    return gw.PLMWorkload(("smollm2",), n_prompts=16, new_tokens=32, reps=3) if quick else gw.PLMWorkload()


def one_plm(plm: str, s: gw.PLMWorkload) -> dict[str, list[dict]]:
    """Both variants on one engine: the only difference between the calls is ``logprobs``."""
    plain = gw.fixed_length_params(s.new_tokens)
    engine = gw.start_vllm(plm, False)[0]
    try:
        params = {"plain": plain, "logprobs": replace(plain, logprobs=True)}
        return gw.timed_variants(dict.fromkeys(params, engine), params, s, plm)
    finally:
        gw.close_with_timeout(engine)


def measure(s: gw.PLMWorkload) -> dict[str, Any]:
    return {"runs": {plm: one_plm(plm, s) for plm in s.plms}}


def table(payload: dict[str, Any]) -> report.Table:
    s, res = payload["settings"], payload["results"]
    t = report.Table(
        "Tokens per second without and with log-probabilities (median over repetitions)",
        ["PLM", "plain tok/s", "with log-probabilities tok/s", "with / plain, wall (paired median)",
         "with / plain, CPU time (paired median)"],
    )  # fmt: skip
    t.rows += gw.variant_rows(res["runs"], *VARIANTS)
    t.notes += [
        f"{s['n_prompts']} prompts (half zero-shot, half contrastive, drugs), exactly {s['new_tokens']} new "
        f"tokens each, the same seeds both ways; {s['reps']} repetitions, the order alternating; prefix "
        "cache reset before every call; one engine per PLM serves both.",
        "A ratio below 1 is what a run with a log-probability bound pays in generation speed.",
    ]
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    title = f"vLLM on {payload['machine'].get('device', 'this machine')}: log-probabilities asked or not"
    gw.variant_bars(payload["results"]["runs"], VARIANTS, path, title)


def main(argv: list[str] | None = None) -> int:
    return bench_cli.plm_variants_main(argv, __file__, __doc__, TITLE, make_settings, measure, table, plot)


if __name__ == "__main__":
    sys.exit(main())

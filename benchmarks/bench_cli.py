"""The command line every benchmark shares: ``--quick``, ``--out``, ``--from-json``, settings overrides."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.report import RESULTS


def parser(doc: str | None, name: str) -> argparse.ArgumentParser:
    """``--quick``, ``--out`` and ``--from-json`` (re-render a saved result without measuring)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (minutes on a 2-core CPU)")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"folder for {name}.{{md,json,png}}")
    p.add_argument("--from-json", type=Path, help=f"re-render the tables and plot of a saved {name}.json")
    return p


def override(settings: Any, **values: Any) -> Any:
    """``settings`` (a dataclass) with those ``values`` that are not None: command-line overrides."""
    return dataclasses.replace(settings, **{k: v for k, v in values.items() if v is not None})


def setup_logging() -> None:
    """INFO logging, quiet libraries (the offline model cache is set by importing ``benchmarks``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("vllm", "httpx", "sentence_transformers", "transformers", "faiss"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def workload_parser(doc: str | None, name: str) -> argparse.ArgumentParser:
    """:func:`parser` plus the sizes of a generation workload: ``--prompts``, ``--new-tokens``, ``--reps``."""
    p = parser(doc, name)
    p.add_argument("--prompts", type=int, help="number of prompts (default: by mode)")
    p.add_argument("--new-tokens", type=int, help="new tokens per prompt (default: by mode)")
    p.add_argument("--reps", type=int, help="repetitions of each variant (default: by mode)")
    return p


def measure_or_load(
    args: argparse.Namespace, argv: Sequence[str] | None, script: str, settings: Callable[[], Any],
    measure: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """The saved payload of ``--from-json``, or a new one: ``settings()`` measured by ``measure``."""
    from benchmarks import report

    if args.from_json:
        return dict(report.read_json(args.from_json))
    setup_logging()
    s = settings()
    payload = report.start(script, sys.argv[1:] if argv is None else list(argv), dataclasses.asdict(s))
    payload["results"] = measure(s)
    return dict(report.finish(payload))


def plm_variants_main(
    argv: list[str] | None, script: str, doc: str | None, title: str, defaults: Callable[[bool], Any],
    measure: Callable[[Any], dict[str, Any]], table: Callable[[dict[str, Any]], Any],
    plot: Callable[[dict[str, Any], Path], None],
) -> int:  # fmt: skip
    """``main`` of a benchmark that times each PLM's engine in two variants (model_dtype.py,
    engine_cores.py): :func:`workload_parser` plus ``--plms`` and ``--name``;
    ``defaults(quick)`` is its sizes before the command line's overrides."""
    from benchmarks import report

    name = Path(script).stem
    p = workload_parser(doc, name)
    p.add_argument("--plms", help="comma list of PLMs (default: smollm2,gemma3; quick: smollm2)")
    p.add_argument("--name", default=name, help="file stem of the results, e.g. one per kind of machine")
    args = p.parse_args(argv)

    def settings() -> Any:
        plms = tuple(args.plms.split(",")) if args.plms else None
        return override(defaults(args.quick), plms=plms, n_prompts=args.prompts,
                        new_tokens=args.new_tokens, reps=args.reps)  # fmt: skip

    payload = measure_or_load(args, argv, script, settings, measure)
    report.write_all(args.out, args.name, title, payload, [table(payload)], plot)
    return 0

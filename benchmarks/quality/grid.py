"""The quality benchmark: WASP and its baselines over the task suite, methods x tasks x seeds.

Settings are chosen on the validation splits of the suite's choosing group, never on one task,
and checked once on the held-out group's test splits (the rule; docs/suite.md); this is the
command that measures them, on every task or on one (``--tasks drugs``).  Per run: M private
records drawn from ``TASK:fit`` by keyed hash (seeded), the synthetic set scored on
``TASK:validation`` (or ``TASK:test`` for the final table) by a logistic regression on MiniLM
embeddings, label agreement against a classifier trained on ``TASK:fit``, FID against the M
records (after every round too); plus, per round and PLM, what the samples look like
(``round_stats.py``).  The methods (``--list``): the baselines (OnlyPrivate, FuseGen, Aug-PE per
PLM), WASP, the paper's ablations and the kept options flipped one at a time, Q, the paper's
accountant, a larger N, federated WASP against Pre-Text (``--m`` sets M), and any round policy
registered in ``policies.py``.  Paired by seed: WASP − each baseline, each variant − WASP,
federated WASP − Pre-Text; a gap inside its standard deviation is "no gap" (``grid_report.py``
writes the tables).

A finished run's record is written atomically under ``--work`` and keyed by the run's whole
configuration: an interrupted benchmark run again skips what finished.  The results JSON keeps
every record with its key, and a run of the benchmark first restores them from the JSON it is
about to rewrite: a grid too long for one sitting grows over several, on fresh clones too, from
its committed results (a changed setting or default is a new key, so it runs again).
``--max-minutes`` starts no new run after the limit and reports what finished (``0``: the tables
rebuilt from the finished runs alone).

    python -m benchmarks.quality.grid --split validation    # the grid the defaults come from
    python -m benchmarks.quality.grid --quick               # CI size (a few minutes)
    python -m benchmarks.quality.grid --tasks drugs --split test --methods wasp,wasp-q1,wasp-q16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.quality.grid_report import write_outputs
from benchmarks.quality.harness import (
    AUTO_ENGINE,
    DELTA,
    EPSILON,
    PLMS,
    REPO,
    RESULTS,
    CachedEmbedder,
    Data,
    EnginePool,
    Method,
    Settings,
    log,
    out_of_time,
    restore_records,
    run_or_fail,
    setup_logging,
)
from benchmarks.quality.policies import POLICIES
from benchmarks.quality.round_stats import ReferenceJudge, junk_share, round_diversity, round_stats
from wasp_vllm.data.suite import SUITE
from wasp_vllm.privacy.report import PrivacyReport

#: The suite (docs/suite.md): a validation grid runs the choosing group, a test grid every task.
CHOOSING = tuple(t for t, group in SUITE.items() if group == "choosing")
TASKS = (*CHOOSING, *(t for t in SUITE if t not in CHOOSING))
QUICK_TASKS = ("tweets", "trec")
DEFAULT_METHODS = ("descriptions", "only-private", "fusegen", "aug-pe:smollm2", "aug-pe:gemma3", "wasp")
QUICK_METHODS = ("descriptions", "only-private", "fusegen", "aug-pe:smollm2", "wasp")
FEDERATED = {"parties": 10, "dirichlet": 1.0}
#: Every run: room for IMDb's contrastive prompts (S=8 examples of up to 200 tokens each).
RUN_CONFIG: dict[str, Any] = {"engine_args": {"max_model_len": 4096}}
#: The CI size (N=24, T=2) leaves 2-4 samples per label and round: pools of S=2, Q=2 votes.
QUICK_CONFIG = {**RUN_CONFIG, "q": 2, "s": 2}

#: The baselines run as published: an even split of the labels (WASP's default too; its private
#: label prior is a lever).
AS_PUBLISHED = {"label_prior": "uniform"}
#: WASP's kept options, each flipped against its defaults (compared as lever − WASP): name, label,
#: overrides.  Only settings of RunConfig go here; a lever the rule rejected left RunConfig (commit
#: f7b6f4b reproduces it) and an experimental one is a round policy, never a setting here.
LEVERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("wasp-label-check-off", "WASP, label check off", {"label_check": "off"}),
    # The private label prior was the default until 2026-11-29: the grids made before then compare
    # WASP with wasp-uniform-prior (now WASP's own configuration, so its runs stand in for WASP's).
    ("wasp-uniform-prior", "WASP, uniform label split (no private label prior)", {"label_prior": "uniform"}),
    ("wasp-private-prior", "WASP, private label prior", {"label_prior": "private"}),
    # Cooler and warmer than the default T = 1 (0.7 is a common chat default). Measured, not adopted:
    # 0.7 copies the in-context examples more, 1.2 less (docs/research/levers-not-adopted.md).
    ("wasp-temperature-07", "WASP, sampling temperature 0.7", {"temperature": 0.7}),
    ("wasp-temperature-12", "WASP, sampling temperature 1.2", {"temperature": 1.2}),
    (
        "wasp-zero-shot",
        "WASP, zero-shot prompts (the votes move only the PLM shares)",
        {"later_prompt": "zero_shot"},
    ),
)


def method_table(m: int) -> dict[str, tuple[Method, tuple[str, str]]]:
    """Every method by name, with the pair its paired difference is taken as (``a − b``)."""
    both = list(PLMS)
    wasp = {"strategy": "wasp", "plms": both}
    fewshot = {**wasp, "strategy": "wasp-no-contrast"}  # = today's WASP, under the key its records have
    rows: list[tuple[str, str, str, dict[str, Any], tuple[str, str] | None]] = [
        ("descriptions", "The label descriptions alone (no data, no generation)", "baseline", {}, None),
        ("only-private", "OnlyPrivate (no DP)", "baseline", {}, None),
        ("fusegen", "FuseGen (zero-shot, 2 PLMs)", "baseline", {"strategy": "fusegen", "plms": both}, None),
        *((f"aug-pe:{p}", f"Aug-PE ({p})", "baseline",
           {"strategy": "aug-pe", "plms": [p], **AS_PUBLISHED}, None) for p in PLMS),
        ("wasp", "WASP", "main", wasp, None),
        ("wasp-fewshot", "WASP, few-shot prompts (no contrast)", "lever", fewshot, None),
        ("wasp-contrastive", "WASP, contrastive prompts after round 0 (the paper's)", "lever",
         {**wasp, "later_prompt": "contrastive"}, None),
        ("wasp-far-auto", "WASP, each vote releases H_far only where the prompts show the far pool",
         "lever", {**wasp, "far_votes": "auto"}, None),
        ("wasp-fewshot-uniform", "WASP, few-shot prompts, uniform label split", "lever",
         {**fewshot, "label_prior": "uniform"}, ("wasp-fewshot-uniform", "wasp-fewshot")),
        ("wasp-no-weighting", "WASP, no PLM weighting", "lever",
         {**wasp, "strategy": "wasp-no-weighting"}, None),
        *((key, label, "lever", {**wasp, **change}, None) for key, label, change in LEVERS),
        # the paper's other studies: votes per private record, its accountant, more synthetic data
        *((f"wasp-q{q}", f"WASP, Q = {q} votes per private record", "variant", {**wasp, "q": q}, None)
          for q in (1, 2, 4, 16)),
        ("wasp-paper-accountant", "WASP, the paper's accountant (sigma by its formula)", "variant",
         {**wasp, "accountant": "paper"}, None),
        # issue 76: what the check's share costs the votes, and how its figures on the private
        # records compare with the split's
        ("wasp-utility-check", "WASP with the utility check (a tenth of the budget)", "variant",
         {**wasp, "utility_check_share": 0.1}, None),
        *((f"wasp-n{n}", f"WASP, N = {n}", "variant", {**wasp, "n": n}, None) for n in (600, 1200)),
        ("wasp-federated", "Federated WASP (10 parties)", "federated", {**wasp, **FEDERATED}, None),
        ("pretext", "Pre-Text (10 parties, 2 PLMs)", "federated",
         {"strategy": "pre-text", "plms": both, **FEDERATED}, ("wasp-federated", "pretext")),
        *((f"pre-text:{p}", f"Pre-Text (10 parties, {p})", "federated",
           {"strategy": "pre-text", "plms": [p], **FEDERATED}, ("wasp-federated", f"pre-text:{p}"))
          for p in PLMS),
    ]  # fmt: skip
    table = {}
    for key, label, group, overrides, pair in rows:
        method = Method(key, label, group, overrides, m=m, only_private=key == "only-private",
                        descriptions=key == "descriptions")  # fmt: skip
        default = (key, "wasp") if group in ("lever", "variant") else ("wasp", key)
        table[key] = (method, pair or default)
    for name, (label, _) in POLICIES.items():  # experiments: WASP's settings, another round policy
        key = f"policy-{name}"
        table[key] = (Method(key, label, "lever", wasp, m=m, policy=name), (key, "wasp"))
    return table


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI size: tweets,trec; N=24, T=2, 1 seed, 4 methods")
    p.add_argument(
        "--tasks", default=None,
        help="comma list of built-in tasks (default: the choosing group on validation, every task on test)",
    )  # fmt: skip
    p.add_argument(
        "--split", choices=("validation", "test"), default="validation",
        help="what is scored: validation (to choose settings) or test (the final table only)",
    )  # fmt: skip
    p.add_argument("--methods", default=None, help="comma list (default: the baselines and WASP); see --list")
    p.add_argument("--list", action="store_true", help="print every method name and what it overrides")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3; quick 1)")
    p.add_argument("--n", type=int, default=None, help="synthetic samples per run (default 300; quick 24)")
    p.add_argument("--rounds", type=int, default=None, help="rounds T (default 5; quick 2)")
    p.add_argument("--m", type=int, default=100, help="private records drawn from TASK:fit (default 100)")
    p.add_argument(
        "--max-new-tokens", type=int, default=None,
        help="token cap per sample: each task's own, or this where the task's is larger",
    )  # fmt: skip
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto", help=f"auto = {AUTO_ENGINE}")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no new run after this many minutes (finished runs are reused: 0 = tables from the cache)",
    )
    p.add_argument("--work", default=None, help="run folders and records (default runs/bench-tasks[-quick])")
    p.add_argument(
        "--score-from", default="",
        help="comma list of other grids' --work folders (e.g. the other split's): a run they generated "
        "at the same configuration, whose run folder is still there, is scored here instead of run again",
    )  # fmt: skip
    p.add_argument("--out", default=str(RESULTS), help="folder for the .md/.json/.png")
    p.add_argument("--name", default=None, help="output stem (default quality_tasks{_quick,_test})")
    args = p.parse_args(argv)
    args.score_from = [Path(w) for w in args.score_from.split(",") if w]
    default = QUICK_TASKS if args.quick else CHOOSING if args.split == "validation" else TASKS
    args.tasks = (args.tasks or ",".join(default)).split(",")
    args.methods = (args.methods or ",".join(QUICK_METHODS if args.quick else DEFAULT_METHODS)).split(",")
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.n = args.n or (24 if args.quick else 300)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.work = Path(args.work or REPO / "runs" / ("bench-tasks-quick" if args.quick else "bench-tasks"))
    suffix = ("_quick" if args.quick else "") + ("_test" if args.split == "test" else "")
    args.name = args.name or f"quality_tasks{suffix}"
    args.engine = AUTO_ENGINE if args.engine == "auto" else args.engine
    args.config = QUICK_CONFIG if args.quick else RUN_CONFIG
    return args


def token_cap(task: str, cap: int | None) -> int | None:
    """The task's own token cap, or ``cap`` where that is smaller (None: the task's own)."""
    from wasp_vllm.tasks import get_task

    own = get_task(task).max_new_tokens
    return None if cap is None or cap >= own else cap


def _check(args: argparse.Namespace, table: dict[str, Any]) -> None:
    from wasp_vllm.data.builtin import BUILTIN

    if unknown := [t for t in args.tasks if t not in BUILTIN]:
        raise SystemExit(f"--tasks: no built-in set {unknown}; one of {', '.join(BUILTIN)}")
    if args.split == "validation" and (held := [t for t in args.tasks if SUITE.get(t) == "held-out"]):
        raise SystemExit(
            f"--tasks {','.join(held)}: the held-out group's validation splits are never looked at "
            "(docs/suite.md); its test splits are scored for the final table (--split test)"
        )
    if unknown := [m for m in args.methods if m not in table]:
        raise SystemExit(f"--methods: no method {unknown}; one of {', '.join(table)}")
    if missing := [str(w) for w in args.score_from if not w.is_dir()]:
        raise SystemExit(f"--score-from: no such folder {', '.join(missing)}")


def new_payload(args: argparse.Namespace, argv: list[str] | None, table: dict[str, Any]) -> dict[str, Any]:
    from wasp_vllm.data.records import load_private, load_test
    from wasp_vllm.tasks import get_task

    methods = [table[k][0] for k in args.methods]
    return {
        "command": report.command(__file__, sys.argv[1:] if argv is None else argv),
        "settings": {"quick": args.quick, "tasks": args.tasks, "split": args.split, "engine": args.engine,
                     "n": args.n, "rounds": args.rounds, "m": args.m, "max_new_tokens": args.max_new_tokens,
                     "seeds": list(range(args.seeds)), "epsilon": EPSILON, "delta": DELTA,
                     "plms": list(PLMS), "max_minutes": args.max_minutes, "run_config": args.config},
        "machine": report.machine(),
        "methods": [{"key": m.key, "label": m.label, "group": m.group, "overrides": m.overrides,
                     "versus": list(table[m.key][1])} for m in methods],
        "n_scored": {t: len(load_test(f"{t}:{args.split}", get_task(t))) for t in args.tasks},
        "reference_junk_share": {t: junk_share(load_private(f"{t}:fit", get_task(t)).texts)
                                 for t in args.tasks},
        "runs": [], "ran": [], "reused": [], "skipped": [], "finished": False,
    }  # fmt: skip


def finished_cells(payload: dict[str, Any]) -> set[tuple[str, str, int]]:
    """(task, method, seed) of every run a results payload holds that did not fail."""
    return {(r["task"], r["method"], r["seed"]) for r in payload.get("runs", []) if "error" not in r}


class ResultsWriter:
    """Writes a grid's tables to ``stem`` unless that would drop a finished run the file there
    holds (one this grid skipped for time, or could not match because settings or defaults changed
    since): then to ``STEM-partial`` beside it, so what was written is never lost to a grid that
    stopped early."""

    def __init__(self, stem: Path) -> None:
        self.stem, self.partial = stem, stem.with_name(stem.name + "-partial")
        old = stem.with_suffix(".json")
        self.kept = finished_cells(json.loads(old.read_text())) if old.exists() else set()

    def missing(self, payload: dict[str, Any]) -> set[tuple[str, str, int]]:
        return self.kept - finished_cells(payload)

    def write(self, payload: dict[str, Any]) -> Path:
        target = self.partial if self.missing(payload) else self.stem
        write_outputs(payload, target)
        if target == self.stem:  # caught up: a partial table of an earlier try is out of date
            for stale in self.partial.parent.glob(f"{self.partial.name}*"):
                stale.unlink()
        return target


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    table = method_table(args.m)
    if args.list:
        for key, (method, pair) in table.items():
            print(f"{key:24s} {method.overrides}  (paired: {pair[0]} − {pair[1]})")
        return 0
    _check(args, table)
    setup_logging()
    stem = Path(args.out) / args.name
    payload = new_payload(args, argv, table)
    if restored := restore_records(stem.with_suffix(".json"), lambda task: args.work / task):
        log.info("restored %d finished runs from %s.json into %s", restored, stem, args.work)
    writer = ResultsWriter(stem)
    start = time.perf_counter()
    embedder, pool = CachedEmbedder.on_disk(), EnginePool(args.engine)
    judge = ReferenceJudge(embedder)

    def extras(run_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        sigma = PrivacyReport.from_json(manifest["privacy"]).plan.sigma
        return {"rounds": round_stats(run_dir, manifest, judge),
                "diversity": round_diversity(run_dir, manifest["task"], sigma, judge)}  # fmt: skip

    extras.keys = ("rounds", "diversity")  # type: ignore[attr-defined]  # what a kept record is brought up to

    twins = tuple(method for method, _ in table.values())
    try:
        for seed in range(args.seeds):  # seed-major: an interrupted grid still has whole seeds
            for task in args.tasks:
                data = Data(task, args.split)
                settings = Settings(args.engine, args.n, args.rounds, token_cap(task, args.max_new_tokens),
                                    args.work / task, config=args.config, twins=twins,
                                    score_from=tuple(w / task for w in args.score_from))  # fmt: skip
                for key in args.methods:
                    method = table[key][0]
                    elapsed = (time.perf_counter() - start) / 60
                    if out_of_time(method, seed, data, settings, elapsed, args.max_minutes):
                        payload["skipped"].append([task, key, seed])
                        continue
                    log.info("== %s on %s, seed %d (%.1f min in)", key, task, seed, elapsed)
                    record = run_or_fail(method, seed, data, settings, pool, embedder, extras)
                    payload["runs"].append(record)
                    payload["reused" if record.get("reused") else "ran"].append([task, key, seed])
                    payload["engine_startup_s"] = dict(pool.startup_s)
                    payload["total_s"] = round(time.perf_counter() - start, 1)
                    writer.write(payload)
    finally:
        pool.close()
    payload["finished"] = True
    payload["machine"]["load_end"] = report.load_average()
    payload["total_s"] = round(time.perf_counter() - start, 1)
    written = writer.write(payload)
    log.info("wrote %s.{md,json,png} in %.1f min", written, payload["total_s"] / 60)
    print(written.with_suffix(".md").read_text())
    if written != stem:
        lost = sorted(writer.missing(payload))
        log.error(
            "%s.json holds %d finished runs this grid did not reproduce (skipped for time, or their "
            "settings changed since), e.g. %s: it is left as it was, and this grid's tables are in %s.*; "
            "run the missing cells, or delete the old file to replace it",
            stem, len(lost), ", ".join(f"{m} on {t} seed {sd}" for t, m, sd in lost[:3]), written,
        )  # fmt: skip
        return 1
    failed = [r for r in payload["runs"] if "error" in r]
    return 1 if failed else 0  # the tables are written either way; a failed run must not pass unseen


if __name__ == "__main__":
    sys.exit(main())

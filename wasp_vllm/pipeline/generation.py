"""Generation of one round: every active PLM writes its quota; a PLM that fails for good hands its
share to the others within the same round.  Rejected samples are regenerated, never copied."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from wasp_vllm.engines import Completion, Engine, GenerationParams
from wasp_vllm.engines.presets import sampling_for
from wasp_vllm.pipeline.prompts import (
    RoundInputs,
    Share,
    Slot,
    clean_sample,
    make_slots,
    normalize_text,
    request_seed,
)
from wasp_vllm.pipeline.selection import allocate_quotas, split_over_labels
from wasp_vllm.pipeline.state import RoundRecord, RunState

log = logging.getLogger(__name__)


class PipelineError(RuntimeError):
    """The run cannot go on (every PLM failed, or the settings do not fit the data)."""


class EngineFailed(RuntimeError):
    def __init__(self, plm: str, reason: str) -> None:
        super().__init__(f"PLM {plm} failed repeatedly ({reason})")
        self.plm = plm


@dataclass
class PLMResult:
    """What one PLM wrote in one round (rows in the Arrow data contract, minus embeddings)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    #: Tokens each row cost (parallel to ``rows``): where the work went, against ``tokens``.
    row_tokens: list[int] = field(default_factory=list)
    generated: int = 0  # samples the engine wrote, kept or not
    tokens: int = 0  # tokens the engine wrote, kept or not
    seconds: float = 0.0
    prompt_seconds: float = 0.0  # of ``seconds``: building prompts (public work, no engine)
    engine_seconds: float = 0.0  # of ``seconds``: inside the engine (the rest is cleaning)
    shortfall: int = 0
    failures: int = 0
    rejects: Counter[str] = field(default_factory=Counter)  # by reason (see pipeline.prompts.clean_sample)
    cap: int = 0  # the token cap the rows were written under (max_new_tokens)

    @property
    def capped(self) -> int:
        """Rows that reached the token cap: cut there, likely mid-text."""
        return sum(n >= self.cap for n in self.row_tokens) if self.cap else 0

    def merge(self, other: PLMResult) -> None:
        self.rejects.update(other.rejects)
        self.rows += other.rows
        self.row_tokens += other.row_tokens
        self.generated += other.generated
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.prompt_seconds += other.prompt_seconds
        self.engine_seconds += other.engine_seconds
        self.shortfall += other.shortfall
        self.failures += other.failures
        self.cap = max(self.cap, other.cap)


Progress = Callable[[int], None]


def generate_share(
    engine: Engine, rin: RoundInputs, share: Share, plm: str, on_progress: Progress
) -> PLMResult:
    """Generate ``share.quota`` clean samples; rejects are regenerated, never copied."""
    cfg, t = rin.cfg, rin.t
    counts = label_counts(
        share.quota, len(rin.task.labels), (t + share.k) % len(rin.task.labels), rin.label_shares
    )
    wanted = [rin.task.labels[c] for c, n in enumerate(counts) for _ in range(int(n))]
    params = sampling_for(plm, rin.params, cfg.model_fields_set)  # a preset's sampling, unless set
    result = PLMResult(cap=params.max_new_tokens)
    kept_keys: set[str] = set()
    start = time.perf_counter()
    for attempt in range(cfg.engine_args.max_attempts):
        if not wanted:
            break
        started = time.perf_counter()
        slots = make_slots(rin, share, wanted, attempt)
        result.prompt_seconds += time.perf_counter() - started
        seeds = [request_seed(cfg.seed, t, share.k, share.part, s.index, attempt) for s in slots]
        started = time.perf_counter()
        completions = _generate_with_retries(
            engine, slots, seeds, params, cfg.engine_args.engine_retries, result
        )
        result.engine_seconds += time.perf_counter() - started
        missing = []
        candidates: list[tuple[Slot, str]] = []
        cost = {id(slot): c.n_tokens for slot, c in zip(slots, completions, strict=True)}
        result.generated += len(completions)
        for slot, completion in zip(slots, completions, strict=True):
            result.tokens += completion.n_tokens
            text, reason = clean_sample(completion.text, slot, rin.gate, rin.seen, kept_keys)
            if text is None:
                result.rejects[str(reason)] += 1
                missing.append(slot.label)
                continue
            kept_keys.add(normalize_text(text))
            candidates.append((slot, text))
        for slot, text, embedding in _label_checked(rin, candidates, result, missing):
            # The run's own PLM name, not the engine's: a served model may call itself otherwise.
            result.rows.append(_row(text, slot, plm, t, share, attempt, embedding))
            result.row_tokens.append(cost[id(slot)])
        on_progress(len(wanted) - len(missing))
        wanted = missing
    result.shortfall = len(wanted)
    result.seconds = time.perf_counter() - start
    if result.shortfall:
        log.debug(
            "%s round %d: %d of %d samples still unusable after %d attempts; asking the others",
            engine.name, t, result.shortfall, share.quota, cfg.engine_args.max_attempts,
        )  # fmt: skip
    return result


def label_counts(quota: int, n_labels: int, offset: int, shares: tuple[float, ...] | None) -> np.ndarray:
    """Samples per label of one share: even (extras rotating with ``offset``), or by ``shares``."""
    if shares is None:
        return split_over_labels(quota, n_labels, offset=offset)
    return allocate_quotas(quota, np.asarray(shares, dtype=float))


def _label_checked(
    rin: RoundInputs, candidates: list[tuple[Slot, str]], result: PLMResult, missing: list[str]
) -> list[tuple[Slot, str, np.ndarray | None]]:
    """The candidates that read as their label (all of them without a label check); the others
    are counted as ``off_label`` rejects and their labels asked again."""
    if rin.label_check is None or not candidates:
        return [(slot, text, None) for slot, text in candidates]
    embeddings, off = rin.label_check.check([t for _, t in candidates], [s.label for s, _ in candidates])
    kept = []
    for (slot, text), embedding, is_off in zip(candidates, embeddings, off, strict=True):
        if is_off:
            result.rejects["off_label"] += 1
            missing.append(slot.label)
        else:
            kept.append((slot, text, embedding))
    return kept


def _row(
    text: str, slot: Slot, plm: str, t: int, share: Share, attempt: int, embedding: np.ndarray | None
) -> dict[str, Any]:
    """One sample; ``embedding`` (from the label check) is reused when the round is embedded."""
    row: dict[str, Any] = {
        "id": f"r{t}-k{share.k}-p{share.part}-a{attempt}-{slot.index:06d}",
        "text": text,
        "label": slot.label,
        "attribute": slot.attribute,
        "plm": plm,
        "round": t,
        "prompt_kind": slot.kind,
    }
    if embedding is not None:
        row["embedding"] = embedding
    return row


def _generate_with_retries(
    engine: Engine,
    slots: list[Slot],
    seeds: list[int],
    params: GenerationParams,
    retries: int,
    result: PLMResult,
) -> list[Completion]:
    prompts = [s.prompt for s in slots]
    for attempt in range(retries + 1):
        try:
            completions = engine.generate(prompts, seeds, params)
            if len(completions) != len(prompts):
                raise RuntimeError(f"engine returned {len(completions)} outputs for {len(prompts)} prompts")
            return completions
        except Exception as exc:  # noqa: BLE001 - any engine failure is retried, then reported
            result.failures += 1
            log.warning(
                "engine %s failed (%s, try %d of %d)",
                engine.name,
                type(exc).__name__,
                attempt + 1,
                retries + 1,
            )
            if attempt == retries:
                raise EngineFailed(engine.name, type(exc).__name__) from None
    raise AssertionError("unreachable")


def drop_cross_plm_duplicates(results: dict[str, PLMResult]) -> None:
    """Two PLMs of one round may write the same text; keep the first (in PLM order), never a copy."""
    kept: set[str] = set()
    for res in results.values():
        unique, unique_tokens = [], []
        for row, n_tokens in zip(res.rows, res.row_tokens, strict=True):
            key = normalize_text(row["text"])
            if key in kept:
                res.shortfall += 1
                res.rejects["duplicate_across_plms"] += 1
                continue
            kept.add(key)
            unique.append(row)
            unique_tokens.append(n_tokens)
        res.rows, res.row_tokens = unique, unique_tokens


@dataclass(frozen=True)
class AskingCap:
    """How many more samples the last round may generate to make up what it lacks: the deficit
    divided by the share the round kept so far (its own reject rate, a public figure: the checks
    read only synthetic text), times :attr:`SLACK`, with the kept share taken as at least
    :attr:`MIN_KEPT_SHARE`.  Fixed when the usual passes end, so the round cannot ask forever."""

    limit: int  # samples generated in the round (all PLMs) at which asking stops

    SLACK: ClassVar[float] = 3.0
    MIN_KEPT_SHARE: ClassVar[float] = 0.02  # at most SLACK / 0.02 = 150 samples per missing one

    @classmethod
    def after(cls, results: dict[str, PLMResult], deficit: int, t: int) -> AskingCap:
        generated = sum(r.generated for r in results.values())
        kept = sum(len(r.rows) for r in results.values())
        share = max(kept / generated if generated else 0.0, cls.MIN_KEPT_SHARE)
        more = math.ceil(cls.SLACK * deficit / share)
        log.info(
            "round %d (the last): %d samples still missing, %.0f %% of this round's samples kept; "
            "asking again, up to %d more samples",
            t, deficit, 100 * share, more,
        )  # fmt: skip
        return cls(generated + more)

    def spent(self, results: dict[str, PLMResult]) -> bool:
        return sum(r.generated for r in results.values()) >= self.limit


@dataclass
class RoundGeneration:
    """Runs the PLMs' shares of a round, concurrently where the engines allow it."""

    engines: dict[str, Engine]
    concurrent: bool
    timings: dict[str, float]
    #: Called with the number of usable samples each PLM adds (the run's one progress display).
    on_progress: Progress = lambda n: None

    def run(self, rin: RoundInputs, quotas: np.ndarray, state: RunState) -> dict[str, PLMResult]:
        """Every active PLM writes its quota; what is missing is made up within the round.

        A PLM that fails for good hands its share to the others; samples still unusable after
        ``max_attempts`` and copies across PLMs are asked again of the active PLMs (by weight),
        for at most ``len(plms) + max_attempts`` passes.  The last round, which no later round
        can make up for, then keeps asking within :class:`AskingCap` (from the round's own reject
        rate).  Only if that cannot fill the round (every PLM failing, none writing anything new,
        or the cap spent) does it end short.
        """
        plms, total = state.plms, int(quotas.sum())
        results: dict[str, PLMResult] = {}
        shares = [Share(k, int(quotas[k])) for k, p in enumerate(plms) if p in state.active]
        usual_passes, cap, part = len(plms) + rin.cfg.engine_args.max_attempts, None, 0
        while True:
            part += 1
            for share, res in self._run_shares(rin, shares, plms):
                if isinstance(res, EngineFailed):
                    state.drop(plms[share.k], f"round {rin.t}: {res}")
                else:
                    results.setdefault(plms[share.k], PLMResult()).merge(res)
            drop_cross_plm_duplicates(results)
            deficit = total - sum(len(r.rows) for r in results.values())
            if deficit <= 0:
                break
            if not state.active:
                raise PipelineError("every PLM failed; see the log for the engine errors")
            # Only PLMs that wrote usable samples this round are asked to make up the rest.
            delivering = [p for p in state.active if results.get(p) and results[p].rows]
            if not delivering:
                break
            if part >= usual_passes:
                if rin.t < rin.cfg.rounds - 1:
                    break  # the next round asks for them
                cap = cap or AskingCap.after(results, deficit, rin.t)
                if cap.spent(results):
                    break
            extra = state.quotas(deficit, 0, among=delivering)
            shares = [Share(k, int(q), part) for k, q in enumerate(extra) if q > 0]
        if deficit > 0:
            later = "the next round asks for them" if rin.t < rin.cfg.rounds - 1 else "the run ends short"
            log.warning(
                "round %d: %d of %d samples could not be written by any PLM; %s", rin.t, deficit, total, later
            )
        return results

    def _run_shares(
        self, rin: RoundInputs, shares: list[Share], plms: list[str]
    ) -> list[tuple[Share, PLMResult | EngineFailed]]:
        def work(share: Share) -> tuple[Share, PLMResult | EngineFailed]:
            name = plms[share.k]
            try:
                res = generate_share(self.engines[name], rin, share, name, self.on_progress)
            except EngineFailed as exc:
                log.error("%s; continuing without it", exc)
                return share, exc
            stages = {"generation": res.seconds, "prompts": res.prompt_seconds, "engine": res.engine_seconds}
            for stage, seconds in stages.items():
                self.timings[f"{stage}:{name}"] = self.timings.get(f"{stage}:{name}", 0.0) + seconds
            return share, res

        if self.concurrent and len(shares) > 1:
            with ThreadPoolExecutor(max_workers=len(shares)) as pool:
                return list(pool.map(work, shares))
        return [work(share) for share in shares]


def round_record(
    t: int, quotas: dict[str, int], weights: tuple[list[float], list[float]], results: dict[str, PLMResult],
    rows: int,
) -> RoundRecord:  # fmt: skip
    """What round ``t`` did, per PLM: ``weights`` before and after it, ``rows`` it wrote in all."""
    each = results.items()
    return RoundRecord(
        t, quotas, *weights, {p: len(r.rows) for p, r in each}, {p: r.shortfall for p, r in each},
        {p: r.tokens for p, r in each}, {p: round(r.seconds, 3) for p, r in each},
        {p: r.failures for p, r in each}, sum(quotas.values()) - rows,
        {p: dict(sorted(r.rejects.items())) for p, r in each}, {p: r.generated for p, r in each},
        {p: sum(r.row_tokens) for p, r in each}, {p: r.capped for p, r in each},
    )  # fmt: skip

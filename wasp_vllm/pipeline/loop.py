"""The round loop of WASP and of the baselines that share it (the paper's Algorithm 1).

Each round: quotas from the weights -> every PLM writes its quota -> the samples are cleaned and
embedded -> (all rounds but the last) the private records release noisy votes -> the votes pick
next round's pools and PLM weights -> the round is committed to disk.  Only the noisy histograms
leave the voting step; everything after it is post-processing.  Committed rounds make
``resume`` continue a killed run and write what an uninterrupted run would have written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wasp_vllm.config import ConfigError
from wasp_vllm.engines import GenerationParams, engine_messages
from wasp_vllm.engines.devices import gpu_available
from wasp_vllm.engines.embedder import encode_each
from wasp_vllm.pipeline.backends import EngineFactory, RunEngines
from wasp_vllm.pipeline.card import CARD_FILE, card_for_run
from wasp_vllm.pipeline.context import RunContext, per_round_totals
from wasp_vllm.pipeline.estimate import RunPlan, against_run
from wasp_vllm.pipeline.generation import PLMResult, RoundGeneration, round_record
from wasp_vllm.pipeline.label_check import LabelCheck
from wasp_vllm.pipeline.manifest import Manifest, build_manifest, utility_figures
from wasp_vllm.pipeline.policy import (
    DEFAULT_POLICY,
    PolicyContext,
    Vote,
    VotedSamples,
    check_policy,
    policy_identity,
)
from wasp_vllm.pipeline.prompts import Gate, RoundInputs, normalize_text
from wasp_vllm.pipeline.selection import label_shares
from wasp_vllm.pipeline.state import Pools, RoundRecord, RunState
from wasp_vllm.pipeline.store import (
    CheckpointError,
    RunStore,
    sample_schema,
    sha256_file,
    stored_embeddings,
    write_json,
    write_parquet,
    write_text,
)
from wasp_vllm.pipeline.utility_check import checked_classifiers
from wasp_vllm.privacy.clock import private_work
from wasp_vllm.privacy.mechanisms import Voters, VotingMechanism, open_voting, release_label_histogram
from wasp_vllm.privacy.secrets import RunSecret
from wasp_vllm.privacy.utility import CHECKED_SETS
from wasp_vllm.privacy.voting import NoisyVotes

log = logging.getLogger(__name__)


class Run:
    """One WASP (or baseline) run writing to one output directory.

    ``engine_factory`` and ``embedder`` are the run's backends (real ones from
    :func:`wasp_vllm.pipeline.backends.default_backends`, test doubles in unit tests). What a
    round does with its noisy votes is ``ctx.policy`` (the paper's unless the benchmark harness
    prepares the run with an experimental one, see :mod:`wasp_vllm.pipeline.policy`).
    """

    def __init__(self, ctx: RunContext, out: Any, *, engine_factory: EngineFactory, embedder: Any,
                 progress: Any = None, estimate: RunPlan | None = None,
                 engine_log: bool = False) -> None:  # fmt: skip
        self.ctx, self.cfg, self.strategy, self.policy = ctx, ctx.cfg, ctx.strategy, ctx.policy
        check_policy(self.policy)
        self.store = RunStore(out)
        self.engine_log, self.already_finished = (self.store.engine_log_path if engine_log else None), False
        self.engine_factory, self.embedder, self.progress = engine_factory, embedder, progress
        self.timings: dict[str, float] = {}
        self.run_engines = RunEngines(engine_factory, self.timings)
        self.estimate = estimate  # the dry-run's plan, set beside what happened in the manifest
        self.voting: VotingMechanism | None = None
        self.label_check: LabelCheck | None = None  # rejects off-label samples (--label-check drop)
        self.secret: RunSecret | None = None
        self.tables: list[pa.Table] = []
        self.votes_so_far: list[NoisyVotes] = []  # the run's earlier votes, as its policy sees them
        self.policy_context = PolicyContext(
            ctx.task, embedder, tuple(ctx.cfg.plms), ctx.cfg.s, ctx.cfg.rounds, ctx.plan.sigma
        )

    def execute(self, *, resume: bool = False, overwrite: bool = False) -> Manifest:
        with self.store.prepared(resume=resume, overwrite=overwrite):  # the folder is this run's alone
            state = self._load_or_start(resume)
            if self._done(state) and (done := self.store.finished()):
                self.already_finished = True  # a resume with nothing to do: the files stay as they are
                return Manifest.from_json(done)
            if not self._done(state):  # else killed while writing the final file
                with engine_messages(self.engine_log), self._session(state):  # (engines.chatter)
                    for t in range(state.completed_rounds, self.cfg.rounds):
                        self._round(t, state)
                    if self.ctx.plan.utility_sigma is not None and state.utility_check is None:
                        self._utility_check(state)
            return self._finish(state)

    def _done(self, state: RunState) -> bool:
        """Every round committed, and the utility check too where the plan makes one."""
        checked = self.ctx.plan.utility_sigma is None or state.utility_check is not None
        return state.completed_rounds >= self.cfg.rounds and checked

    def _utility_check(self, state: RunState) -> None:
        """After the last round: the noisy confusion matrices of the check's task models on the
        private records (the only private step here; trained on public samples only)."""
        assert self.voting is not None, "a plan with a utility check votes"
        synthetic = pa.concat_tables(self.tables)
        models = checked_classifiers(synthetic, self.ctx.task, self.embedder, self.cfg.seed)
        with private_work(self.progress):
            noisy = self.voting.release_confusions(models, len(self.ctx.task.labels))
        state.utility_check = noisy.tolist()
        self._timed("io", self.store.save_state, state)

    def _round(self, t: int, state: RunState) -> None:
        """One round of Algorithm 1."""
        if self.progress is not None:
            self.progress.update(self._bar, description=f"round {t + 1}/{self.cfg.rounds}")
        weights_before = list(state.weights)
        quotas = state.quotas(self._round_target(t), self.cfg.min_plm_share)
        results = self._timed("generation", self.generation.run, self._inputs(t, state), quotas, state)
        new = self._embed(results)
        votes, voted = None, None
        # The plan's schedule: never after the last round; a policy may have asked for fewer votes.
        if self.voting is not None and self.ctx.plan.votes_after(t):
            voted = pa.concat_tables([*self.tables, new])  # D so far: voting, selection, the votes file
            if voted.num_rows:  # (none yet where every sample so far was turned down: no vote, no cost)
                votes = self._release(t, voted)
                self._post_process(t, votes, voted, state)
            else:
                voted = None
        quotas_of = dict(zip(self.cfg.plms, quotas.tolist(), strict=True))
        record = round_record(t, quotas_of, (weights_before, list(state.weights)), results, new.num_rows)
        self._commit(t, new, votes, voted, state, record)

    # -- the steps -------------------------------------------------------------------------

    def _round_target(self, t: int) -> int:
        """Samples this round writes: its share of N plus what earlier rounds could not write (a
        run ends with exactly N rows unless even the last round cannot make the rest up)."""
        due = int(per_round_totals(self.cfg.n, self.cfg.rounds)[: t + 1].sum())
        return due - sum(table.num_rows for table in self.tables)

    def _inputs(self, t: int, state: RunState) -> RoundInputs:
        seen = frozenset(normalize_text(s) for tbl in self.tables for s in tbl.column("text").to_pylist())
        task, cfg = self.ctx.task, self.cfg
        params = GenerationParams.from_settings(
            cfg.sampling, task_cap=task.max_new_tokens, stop=tuple(task.stop)
        )
        shares = tuple(state.label_shares) if state.label_shares is not None else None
        return RoundInputs(
            cfg, self.strategy, task, state.pools, t, seen, params, self._gate(), shares, self.label_check
        )

    def _gate(self) -> Gate | None:
        """The policy's own check of a sample; None for the paper's, which keeps every sample."""
        if self.policy is DEFAULT_POLICY:
            return None
        policy, context = self.policy, self.policy_context
        return lambda text, slot: policy.reject(context, text, slot)

    def _embed(self, results: dict[str, PLMResult]) -> pa.Table:
        rows = [r for res in results.values() for r in res.rows]
        kept = [r.pop("embedding", None) for r in rows]  # the label check embedded these already
        new = pa.Table.from_pylist(rows, schema=sample_schema())
        if rows and all(e is not None for e in kept):
            emb = np.stack(kept).astype(np.float32)
        elif rows:
            emb = self._timed("embedding", self.embedder.encode, new.column("text").to_pylist())
        else:  # every sample of the round was turned down: an empty table of the run's width
            emb = np.zeros((0, self._embedding_width()), dtype=np.float32)
        new = new.append_column("embedding", pa.FixedSizeListArray.from_arrays(emb.reshape(-1), emb.shape[1]))
        # Readers reuse stored embeddings only when they come from the same embedder.
        return new.replace_schema_metadata({"embedder": str(getattr(self.embedder, "name", "unknown"))})

    def _embedding_width(self) -> int:
        if self.tables:
            return int(self.tables[0].schema.field("embedding").type.list_size)
        return int(np.asarray(self.embedder.encode(["width"])).shape[1])  # a public word: only its width

    def _release(self, t: int, synth: pa.Table) -> NoisyVotes:
        """The only step that reads private data; only the noisy histograms leave it."""
        assert self.voting is not None
        labels = np.array([self.ctx.task.labels.index(x) for x in synth.column("label").to_pylist()])
        start = time.perf_counter()
        with private_work(self.progress):  # the bar's clock shows public work only
            votes = self.voting.release(t, stored_embeddings(synth), labels)
        # The time of private work scales with the private data: it stays in the operator's state.
        self.timings["private:voting"] = self.timings.get("private:voting", 0.0) + time.perf_counter() - start
        log.debug(
            "round %d voted: epsilon spent %.4g of %g",
            t,
            self.voting.ledger.spent_epsilon(),
            self.voting.ledger.epsilon,
        )
        return votes

    def _post_process(self, t: int, votes: NoisyVotes, synth: pa.Table, state: RunState) -> None:
        """Next round's pools and PLM weights from the noisy votes (public post-processing, by the
        run's policy)."""
        samples = VotedSamples.of(synth, self.ctx.task.labels, self.cfg.plms)
        vote = Vote(t, votes, samples, tuple(self.votes_so_far))
        self.votes_so_far.append(votes)
        chosen = self.policy.pools(self.policy_context, vote)
        labels_of = self.ctx.task.labels
        state.pools = Pools(
            good={labels_of[c]: [samples.texts[i] for i in rows] for c, rows in chosen.good.items()},
            bad={labels_of[c]: [samples.texts[i] for i in rows] for c, rows in chosen.bad.items()},
        )
        if self.strategy.reweights:
            previous = np.asarray(state.weights)
            state.weights = self.policy.plm_weights(self.policy_context, vote, previous).tolist()
            state.renormalise()  # a dropped PLM's old samples still get votes

    def _commit(
        self,
        t: int,
        new: pa.Table,
        votes: NoisyVotes | None,
        voted: pa.Table | None,
        state: RunState,
        record: RoundRecord,
    ) -> None:
        written = {self.store.round_path(t): new}
        if votes is not None and voted is not None:
            far = {} if votes.h_far is None else {"h_far": votes.h_far}  # released only where a step uses it
            written[self.store.votes_path(t)] = pa.table(
                {"id": voted.column("id"), "h_near": votes.h_near, **far}
            )
        for path, table in written.items():  # the state, saved last, commits them
            state.checksums[path.name] = self._timed("io", write_parquet, path, table)
        if t == 0 and self.ctx.record_keys is not None:  # with the run's first checkpoint
            self._timed("io", self.store.save_record_keys, self.ctx.record_keys)
        state.rounds.append(record)
        state.timings = dict(self.timings)
        self._timed("io", self.store.save_state, state)
        self.tables.append(new)
        log.info(
            "round %d: %d samples; weights %s; epsilon spent %.3g of %g", t, new.num_rows,
            np.round(state.weights, 3).tolist(), state.ledger.spent_epsilon(), state.ledger.epsilon,
        )  # fmt: skip

    # -- starting, resuming, finishing -------------------------------------------------------

    def _load_or_start(self, resume: bool) -> RunState:
        state = self.store.load_state() if resume else None
        if state is not None and state.config_fingerprint != self.cfg.fingerprint():
            raise ConfigError("--resume with different settings than the run in --out; use the same ones")
        if state is not None and state.data_fingerprint != self.ctx.private.fingerprint():
            raise ConfigError("--resume with different private data than the run in --out")
        if state is not None and state.policy != policy_identity(self.policy):
            raise ConfigError(
                f"--resume with round policy {policy_identity(self.policy)}; the run in --out used "
                f"{state.policy}"
            )
        # A run whose rounds are all committed only writes its files again from the checkpoints:
        # it needs no noise, and its key is gone once it has finished (see _finish).
        finished = state is not None and self._done(state)
        secret = None if finished else self._secret(create=state is None or state.noise_key_check is None)
        if state is None:
            state = RunState(
                config_fingerprint=self.cfg.fingerprint(),
                # Keyed by the owner's secret: a plain hash of the records would be a release with
                # infinite epsilon (see wasp_vllm.privacy.secrets); the state is the operator's.
                data_fingerprint=self.ctx.private.fingerprint(),
                noise_key_check=secret.check_value() if secret is not None else None,
                plms=list(self.cfg.plms),
                weights=[1.0 / len(self.cfg.plms)] * len(self.cfg.plms),
                ledger=self.ctx.plan.open_ledger(),
                active=list(self.cfg.plms),
                policy=policy_identity(self.policy),
            )
        elif not finished and state.noise_key_check not in (None, secret.check_value() if secret else None):
            raise CheckpointError(
                f"{self.store.key_path} (or --noise-seed) is not the noise key of the run in --out"
            )
        else:
            log.info("resuming after round %d", state.completed_rounds - 1)
        self.secret = secret
        self.timings.update(state.timings)
        self.tables = [self.store.read_round(t) for t in range(state.completed_rounds)]
        sigma, q = self.ctx.plan.sigma or 0.0, self.strategy.q(self.cfg.q)
        voted = [t for t in range(state.completed_rounds) if self.store.votes_path(t).name in state.checksums]
        self.votes_so_far = [self.store.read_votes(t, sigma, q) for t in voted]
        return state

    def _secret(self, *, create: bool) -> RunSecret | None:
        """The noise secret, for runs that vote; a fixed --noise-seed voids the guarantee."""
        if not self.ctx.plan.needs_noise:
            return None
        if self.cfg.noise_seed is not None:
            log.warning(
                "--noise-seed is set: anyone who knows it can remove the DP noise. This run's "
                "epsilon is VOID (the manifest says so); never use it on data that matters"
            )
        return self.store.secret(self.cfg.noise_seed, create=create)

    @contextmanager
    def _session(self, state: RunState) -> Iterator[None]:
        """Engines for the active PLMs, the embedder and the voting mechanism; engines closed after."""
        try:
            self.run_engines.open(state.active, self.cfg)
            concurrent = self.cfg.engine_args.side_by_side(gpu=gpu_available())
            self.generation = RoundGeneration(
                self.run_engines.engines, concurrent, self.timings, self._progress_bar(state)
            )
            if hasattr(self.embedder, "load"):  # a lazy embedder: its start-up is a stage of its own
                self._timed("startup:embedder", self.embedder.load)
            self.voting = self._open_voting(state)
            if self.cfg.label_check == "drop":
                self.label_check = LabelCheck(self.ctx.task, self.embedder)
            if self.cfg.label_prior == "private" and state.label_shares is None:
                state.label_shares = self._label_prior(state)
            yield
        finally:
            self.close()

    def _progress_bar(self, state: RunState) -> Callable[[int], None]:
        """One display for the whole run: samples written of those still to write, with an ETA."""
        if self.progress is None:
            return lambda n: None
        done = state.completed_rounds
        left = int(per_round_totals(self.cfg.n, self.cfg.rounds)[done:].sum())
        self._bar = self.progress.add_task(f"round {done + 1}/{self.cfg.rounds}", total=left)
        return lambda n: self.progress.advance(self._bar, n)

    def _label_prior(self, state: RunState) -> list[float]:
        """Label shares from a noisy histogram of the private labels (charged on the ledger)."""
        assert self.secret is not None, "a plan with a label prior holds a noise secret"
        with private_work(self.progress):
            counts = release_label_histogram(
                self.ctx.private.labels, len(self.ctx.task.labels), self.ctx.plan, self.secret, state.ledger
            )
        return label_shares(counts).tolist()

    def _open_voting(self, state: RunState) -> VotingMechanism | None:
        if self.secret is None or not self.strategy.votes or self.ctx.plan.sigma is None:
            return None  # FuseGen never reads the private records
        private = self.ctx.private
        with private_work(self.progress):
            # One record at a time: a record's embedding then depends on it alone, bitwise.
            embeddings = self._timed("private:embedding", encode_each, self.embedder, private.texts)
        voters = Voters(embeddings, private.labels, private.parties)
        return open_voting(
            voters, self.strategy.q(self.cfg.q), self.ctx.plan, self.secret, state.ledger,
            n_parties=self.cfg.parties, tolerance=self.cfg.tolerance,
        )  # fmt: skip

    def _timed(self, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - start

    def close(self) -> None:
        self.run_engines.close()

    def _finish(self, state: RunState) -> Manifest:
        # Built from the checkpointed round files, so a resumed run writes the same bytes.
        final = pa.concat_tables([self.store.read_round(t) for t in range(self.cfg.rounds)]).combine_chunks()
        if (check := utility_figures(self.ctx, state)) is not None and check.published != CHECKED_SETS[0]:
            final = final.filter(pc.equal(final["round"], 0))  # the zero-shot reference: better, and public
        out = self.store.out / "synthetic.parquet"
        self._timed("io", write_parquet, out, final)
        engines = self.run_engines
        manifest = build_manifest(self.ctx, state, self.timings, final, sha256_file(out), engines.stats)
        if self.estimate is not None:
            manifest = replace(manifest, estimate=against_run(self.estimate, manifest, engines.kinds))
        published = manifest.to_json()
        write_text(self.store.out / CARD_FILE, card_for_run(published, final, self.ctx.task))
        write_json(self.store.out / "manifest.json", published)
        self.store.discard_key()  # last: everything that needed it is written
        return manifest

"""Token-by-token private generation with Hot PATE, and synthetic records from private data.

The run, label by label (each label's teachers hold only that label's records)::

    n = teachers per label, from the public requested M (settings.py); prompts (prompts.py)
    a fresh private step with its own accountant for this label (steps.py)
    for each of the label's records (an empty one is generated again, up to max_attempts):
        reset every teacher to its prompt; append the public response prefix (an opening quote)
        repeat up to max_tokens times:
            p = next-token distributions of all teachers (on transformers, one batch padded to a
                public length, so each row depends on its own prompt alone; + the public prompt,
                last row, from forward passes of its own)
            the selector: draw the ensemble, private call (if the accountant allows), retries;
            nothing came back / out of reach / budget spent -> the public prompt's own token
            end of sequence or a stop string -> stop; else append the token to every teacher

Privacy.  The private data enter only through the teacher prompts: one record is in exactly one
teacher of its own label (keyed hash), so the labels' ensembles are disjoint and each gets its own
accountant (:func:`~wasp_vllm.hotpate.steps.label_budget` says why the run is then ``(eps, delta)``
-DP, for add/remove and for replace neighbours).  Tokens, stops, retries and fallbacks are
functions of the calls' outputs and of public randomness, so they, the records and every count in
the report are post-processing.  A spent budget never ends the run: the remaining tokens come from
the public fallback, so the run always writes the records it was asked for, and the report says
how many tokens came from where (per record and overall).

Cost.  Whatever the accounting, a private token needs many teachers: with ``n`` per label the
Gaussian ledger affords ``K ~ (mu* sigma / Delta)^2`` releases with ``sigma ~ 0.3 n / 5.5``, and
target charging a fixed cost that only pays off at a few hundred teachers per label and more; see
``docs/research/hotpate_accounting.md`` for the arithmetic and ``python -m
benchmarks.hotpate.hotpate_yields`` for the measurement on the packaged data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from wasp_vllm.hotpate.prompts import build_teacher_prompts, teacher_skeleton
from wasp_vllm.hotpate.report import HotPateReport, LabelRun, Tally, run_report
from wasp_vllm.hotpate.selector import (
    Fallback,
    PrivateTokenSelector,
    SourceFactory,
    generate_record,
    sample_public,
)
from wasp_vllm.hotpate.settings import HotPateSettings, check_inputs
from wasp_vllm.hotpate.teachers import (
    DistributionSource,
    TeacherEnsembleLM,
    WithPublicRow,
    load_lm,
    public_pad_length,
)

log = logging.getLogger(__name__)

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("label", pa.string()),
        ("attribute", pa.string()),
        ("plm", pa.string()),
        ("round", pa.int32()),
        ("prompt_kind", pa.string()),
    ]
)


@dataclass
class _Label:
    """One label's ensemble and its selector while it generates."""

    name: str
    quota: int
    source: DistributionSource
    selector: PrivateTokenSelector
    public_source: DistributionSource | None = None
    run: LabelRun = field(init=False)

    def __post_init__(self) -> None:
        self.run = LabelRun(self.name, self.quota, self.selector.step)


def generate_hotpate(
    private_texts: Sequence[str],
    private_labels: Sequence[str],
    label_names: Sequence[str],
    source_factory: SourceFactory,
    settings: HotPateSettings,
    plm: str,
    fallback: Fallback = sample_public,
    noise_rng: np.random.Generator | None = None,
) -> tuple[pa.Table, HotPateReport]:
    """Synthetic records (text, label) from each label's teachers; always ``n_samples`` records
    unless some come out empty ``max_attempts`` times.

    ``noise_rng`` draws the noise of every private call: a stream of the run's secret key (fresh OS
    entropy when None); the public ``seed`` drives only the shared coordination randomness and
    the fallback.  Returns the records as an Arrow table (``SCHEMA``) and the privacy report.
    """
    s = settings
    check_inputs(private_texts, private_labels, label_names, s)
    n = s.teachers_per_label(len(label_names))
    rng = np.random.default_rng(s.seed)
    noise = noise_rng if noise_rng is not None else np.random.default_rng()
    tally = Tally()
    log.info(
        "hot pate: %d records, %d teachers per label (M=%s, %d records per teacher), %s accounting",
        s.n_samples, n, s.requested_m, s.records_per_teacher, s.accounting,
    )  # fmt: skip
    for name, quota in zip(label_names, s.quotas(len(label_names)), strict=True):
        if quota == 0:
            continue
        texts = [t for t, lab in zip(private_texts, private_labels, strict=True) if lab == name]
        prompts = build_teacher_prompts(
            texts, n, name, s.seed, s.examples_shown(), s.task, s.max_example_chars
        )
        # The public prompt in forward passes of its own (never in a batch with private prompts),
        # also for the tokens after the label's ensemble went silent (public).
        public = source_factory([prompts[-1]])
        source = WithPublicRow(source_factory(prompts[:-1]), public)
        step = s.make_step(n, source.vocab_size, quota)
        selector = PrivateTokenSelector(
            step, s.ensemble, None, s.max_retries, fallback, rng, s.neighbour, noise
        )
        label = _Label(name, quota, source, selector, public)
        _warn_unreachable(label, n)
        _generate_label(label, s, plm, tally)
        tally.labels.append(label.run)
    report = run_report(s, n, tally)
    return pa.Table.from_pylist(tally.rows, schema=SCHEMA), report


def _warn_unreachable(label: _Label, n: int) -> None:
    if label.selector.unreachable(n, label.source.vocab_size):
        log.warning(
            "hot pate: label %r: the threshold is out of reach of %d teachers at this noise: no private "
            "call is made and every token comes from the public fallback (no privacy spent); use more "
            "teachers (a larger M), a larger epsilon or fewer tokens",
            label.name,
            n,
        )


def _generate_label(label: _Label, s: HotPateSettings, plm: str, tally: Tally) -> None:
    """``quota`` records of one label; an empty record is generated again (up to ``max_attempts``)."""
    source, written, attempts = label.source, 0, 0
    while written < label.quota and attempts < label.quota * s.max_attempts:
        attempts += 1
        prefix = source.encode(s.response_prefix) if s.response_prefix else []
        outcome = generate_record(source, label.selector, s.max_tokens, prefix, s.stop, label.public_source)
        if outcome.sources["budget"] and label.run.budget_spent_at is None:
            label.run.budget_spent_at = written
            log.warning(
                "hot pate: label %r: privacy budget spent during record %d/%d; the rest of the label's "
                "tokens come from the public fallback",
                label.name, written + 1, label.quota,
            )  # fmt: skip
        text = outcome.text.strip()
        if not text:
            tally.empty += 1
            tally.empty_decisions += sum(outcome.sources.values())
            continue
        written += 1
        tally.add_tokens(outcome.sources)
        tally.add_record(
            {"id": f"hotpate-{s.seed}-{len(tally.rows):06d}", "text": text, "label": label.name,
             "attribute": None, "plm": plm, "round": 0, "prompt_kind": "hotpate"},
            outcome.private, outcome.fallback,
        )  # fmt: skip
        log.info(
            "hot pate: label %r record %d/%d: %d tokens (%d private, %d fallback), %d private calls",
            label.name, written, label.quota, len(outcome.tokens), outcome.private, outcome.fallback,
            outcome.releases,
        )  # fmt: skip


def vllm_batch_invariant() -> bool:
    """Whether vLLM computes each request's numbers whatever else shares its batch."""
    return os.environ.get("VLLM_BATCH_INVARIANT") == "1"


@dataclass(frozen=True)
class TeacherModel:
    """The LM every teacher runs: a PLM preset or model directory, on which engine and device.

    ``engine``: ``hf`` (transformers: exact distributions, KV caches reused), ``vllm`` (the
    ``top_logprobs`` most likely tokens per teacher and step, plus a no-token bin) or ``auto``
    (vLLM on a GPU with batch invariance on, ``VLLM_BATCH_INVARIANT=1``; transformers, padded to a
    public length, everywhere else).
    """

    model: str = "smollm2"
    engine: str = "auto"
    device: str | None = None
    dtype: Any = None
    top_logprobs: int = 20

    def resolved_engine(self) -> str:
        if self.engine == "auto":  # vLLM's top-K path pays off on a GPU; transformers is exact on CPU
            from wasp_vllm.engines.devices import gpu_available

            if not gpu_available():
                return "hf"
            if not vllm_batch_invariant():
                # vLLM batches the teachers together: without batch invariance a teacher's numbers
                # move with the other teachers' private prompts; transformers pads to a public length.
                log.info("hot pate: --engine auto uses transformers (vLLM needs VLLM_BATCH_INVARIANT=1)")
                return "hf"
            return "vllm"
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"engine must be 'hf', 'vllm' or 'auto', got {self.engine!r}")
        return self.engine


def _source_factory(
    teacher: TeacherModel, run: HotPateSettings, label_names: list[str]
) -> tuple[SourceFactory, str]:
    """Teachers on transformers (exact distributions, KV caches reused) or on vLLM (top-K + no-token)."""
    if teacher.resolved_engine() == "vllm":
        from wasp_vllm.hotpate.vllm_teachers import VLLMTeacherSource, load_vllm

        llm = load_vllm(teacher.model)

        def vllm_factory(prompts: list[str]) -> DistributionSource:
            return VLLMTeacherSource(llm, prompts, top_k=teacher.top_logprobs, temperature=run.temperature)

        return vllm_factory, llm.name
    lm = load_lm(teacher.model, teacher.device, teacher.dtype)
    skeletons = [teacher_skeleton(run.task, name, run.examples_shown()) for name in label_names]
    pad_to = public_pad_length(lm, skeletons, run.examples_shown(), run.max_example_chars)

    def hf_factory(prompts: list[str]) -> DistributionSource:
        return TeacherEnsembleLM(lm, prompts, temperature=run.temperature, pad_to=pad_to)

    return hf_factory, lm.name


def run_hotpate(
    private_texts: list[str],
    private_labels: list[str],
    label_names: list[str],
    *,
    teacher: TeacherModel = TeacherModel(),
    fallback: Fallback = sample_public,
    source_factory: SourceFactory | None = None,
    noise_rng: np.random.Generator | None = None,
    **settings: Any,
) -> tuple[pa.Table, HotPateReport]:
    """Hot PATE synthetic records with the ``teacher`` LM (entry point for the CLI).

    ``settings`` are the fields of :class:`HotPateSettings` (``n_samples``, ``epsilon``, ``delta``
    and ``requested_m`` or ``teachers`` at least).  ``source_factory`` replaces the model (tests
    use a stub).  Returns the records (columns ``id, text, label, attribute, plm, round,
    prompt_kind``) and the typed privacy report (its ``to_json()`` goes in the run manifest).
    """
    if "stop" in settings:
        settings["stop"] = tuple(settings["stop"])
    run = HotPateSettings(**settings)
    check_inputs(private_texts, private_labels, label_names, run)
    plm, used = teacher.model, "custom"
    if source_factory is None:
        teacher = replace(teacher, engine=teacher.resolved_engine())  # asks for a GPU once
        used = teacher.engine
        source_factory, plm = _source_factory(teacher, run, label_names)
    table, report = generate_hotpate(
        private_texts, private_labels, label_names, source_factory, run, plm, fallback, noise_rng
    )
    return table, replace(report, engine=used)

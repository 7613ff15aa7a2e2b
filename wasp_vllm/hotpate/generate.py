"""Token-by-token private generation with Hot PATE, and synthetic records from private data.

The loop for one synthetic record (``generate_record``)::

    reset every teacher to its prompt; append the public response prefix (e.g. an opening quote)
    repeat up to max_tokens times:
        p = next-token distributions of all teachers (+ the public prompt, last row)
        if even n unanimous votes could not clear the threshold: fallback (no release)
        up to 1 + max_retries times:
            record one Gaussian release on the privacy ledger (stop if over budget)
            draw the ensemble's votes (fresh shared randomness), add noise, aggregate
            a token came back -> use it
        nothing came back -> fallback(public distribution)   (free: no private data)
        end of sequence or a stop string -> stop; else append the token to every teacher

Privacy.  The private data enter only through the teacher prompts.  Each private record is
placed in exactly one teacher of its label's ensemble, by a keyed hash of its text (keyed by
the run seed), so adding or removing one record changes at most one teacher; that teacher's
one vote moves between two bins: L2 sensitivity ``sqrt(2)`` per release.  (Replacing a record
may touch two teachers: sensitivity 2; :func:`vote_sensitivity` returns the right one.)  Every
aggregation - retries included - is one Gaussian release recorded on a
:class:`~wasp_vllm.privacy.accountant.PrivacyLedger`; the releases compose exactly.  Tokens,
stop decisions, retries and fallbacks are functions of the releases only, so everything else
is post-processing.  The ledger refuses the release that would exceed the budget; generation
then ends with the records completed so far, and the report says so.

What this costs.  With ``n`` teachers the default homogeneous threshold is ``n/2 + L`` with
``L ~ 5.5 sigma`` (50k vocabulary), so tokens come from the teachers only while roughly
``sigma < n/15``; the per-release sigma grows with ``sqrt(releases)``, so the number of private
tokens a budget buys grows like ``n^2``.  At epsilon 8, delta 1e-5 that is about 25 releases
with 64 teachers, 400 with 256 and 6500 with 1024 (at epsilon 4: 7, 124, 2000).  With fewer
teachers most tokens come from the public fallback (reported as ``tokens_fallback`` and
``private_token_share``); when the threshold is out of reach altogether no release is made.
The heterogeneous aggregator (threshold ``2L``) needs fewer teachers per release but returns
"nothing" more often.

Private texts never appear in a log line, an exception message or the report.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from wasp_vllm.hotpate.aggregators import make_aggregator
from wasp_vllm.hotpate.ensembles import ENSEMBLE_KINDS, EnsembleKind
from wasp_vllm.hotpate.selector import (
    Fallback,
    Neighbour,
    PrivateTokenSelector,
    SourceFactory,
    generate_record,
    sample_public,
    vote_sensitivity,
)
from wasp_vllm.hotpate.teachers import DistributionSource, TeacherEnsembleLM, load_lm
from wasp_vllm.privacy.accountant import PrivacyLedger
from wasp_vllm.privacy.gaussian import calibrate_sigma

log = logging.getLogger(__name__)

TEACHER_TEMPLATE = (
    'Here are some examples of {task} with the label "{label}":\n\n{examples}\n\n'
    'Write one new {task} with the label "{label}", different from the examples. '
    "Reply with the text only."
)
PUBLIC_TEMPLATE = 'Write one {task} with the label "{label}". Reply with the text only.'
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


# --------------------------------------------------------------------------------------------
# teachers from private data
# --------------------------------------------------------------------------------------------


def _slot(text: str, seed: int, teachers: int) -> tuple[int, bytes]:
    """Teacher slot of a record: a keyed hash of its text, so each record's place depends on it alone."""
    digest = hashlib.blake2b(
        text.encode("utf-8"), key=str(seed).encode("utf-8")[:64], digest_size=16
    ).digest()
    return int.from_bytes(digest[:8], "big") % teachers, digest


def _example(text: str, max_chars: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 3].rstrip() + "..."


def build_teacher_prompts(
    texts: Sequence[str],
    teachers: int,
    label: str,
    seed: int,
    examples_per_teacher: int = 3,
    task: str = "text",
    max_example_chars: int = 300,
    teacher_template: str = TEACHER_TEMPLATE,
    public_template: str = PUBLIC_TEMPLATE,
) -> list[str]:
    """``teachers`` prompts from disjoint parts of ``texts`` (all of one label), plus the public one.

    A teacher that receives no record gets the public prompt (it is still a teacher: the
    ensemble size stays public and fixed).  A teacher that receives more than
    ``examples_per_teacher`` records shows the first ones in hash order.
    """
    if teachers < 1 or examples_per_teacher < 1:
        raise ValueError("teachers and examples_per_teacher must be >= 1")
    slots: list[list[tuple[bytes, str]]] = [[] for _ in range(teachers)]
    for text in texts:
        slot, digest = _slot(text, seed, teachers)
        slots[slot].append((digest, text))
    public = public_template.format(task=task, label=label)
    prompts = []
    for members in slots:
        shown = [t for _, t in sorted(members)[:examples_per_teacher]]
        if not shown:
            prompts.append(public)
            continue
        examples = "\n".join(f"{i + 1}. {_example(t, max_example_chars)}" for i, t in enumerate(shown))
        prompts.append(teacher_template.format(task=task, label=label, examples=examples))
    return [*prompts, public]


# --------------------------------------------------------------------------------------------
# the whole run
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HotPateSettings:
    """Every knob of a Hot PATE run (all public; recorded in the report)."""

    n_samples: int
    epsilon: float
    delta: float
    seed: int = 0
    teachers: int = 64
    max_tokens: int = 48
    examples_per_teacher: int = 3
    ensemble: EnsembleKind = "coordinated"
    aggregator: str = "homogeneous"
    threshold: float | None = None
    beta: float = 1e-3
    renormalize: bool = False
    temperature: float = 1.0
    max_retries: int = 2
    sigma: float | None = None
    planned_releases: int | None = None
    neighbour: Neighbour = "add_remove"
    task: str = "text"
    max_example_chars: int = 300
    response_prefix: str = '"'
    stop: tuple[str, ...] = ('"', "\n\n")

    def releases_planned(self) -> int:
        """Releases sigma is calibrated for: by default one per token of every record, no retries."""
        return self.planned_releases or self.n_samples * self.max_tokens

    def resolve_sigma(self) -> float:
        """The given sigma, or the smallest one for which the planned releases fit (epsilon, delta)."""
        if self.sigma is not None:
            return float(self.sigma)
        return calibrate_sigma(
            self.epsilon, self.delta, vote_sensitivity(self.neighbour), self.releases_planned()
        )


def _per_label(n: int, k: int) -> list[int]:
    """Split ``n`` records evenly over ``k`` labels (the first labels get the remainder)."""
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def _check_inputs(
    texts: Sequence[str], labels: Sequence[str], label_names: Sequence[str], s: HotPateSettings
) -> None:
    """Validate without ever echoing a private value."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} private texts but {len(labels)} labels")
    if not label_names or len(set(label_names)) != len(label_names):
        raise ValueError("label_names must be non-empty and distinct")
    unknown = sum(1 for lab in labels if lab not in set(label_names))
    if unknown:
        raise ValueError(f"{unknown} private labels are not in label_names")
    if s.n_samples < 1 or s.max_tokens < 1 or s.teachers < 1:
        raise ValueError("n_samples, max_tokens and teachers must be >= 1")
    if s.ensemble not in ENSEMBLE_KINDS:
        raise ValueError(f"ensemble must be one of {ENSEMBLE_KINDS}")


@dataclass
class _Tally:
    """Counters of the run (public: functions of the releases)."""

    private: int = 0
    fallback: int = 0
    empty: int = 0
    partial_dropped: int = 0
    stop_reason: str | None = None
    vocab_size: int | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)


def _warn_unreachable(selector: PrivateTokenSelector, teachers: int, vocab: int) -> float:
    threshold = selector.aggregator.resolve_threshold(teachers, vocab)
    if selector.unreachable(teachers, vocab):
        log.warning(
            "hot pate: threshold %.1f is out of reach of %d teachers at sigma %.3g: no release is "
            "made and every token comes from the public fallback (no privacy spent); use more "
            "teachers, a larger epsilon or fewer tokens",
            threshold,
            teachers,
            selector.aggregator.sigma,
        )
    return threshold


def generate_hotpate(
    private_texts: Sequence[str],
    private_labels: Sequence[str],
    label_names: Sequence[str],
    source_factory: SourceFactory,
    settings: HotPateSettings,
    plm: str,
    fallback: Fallback = sample_public,
    noise_rng: np.random.Generator | None = None,
) -> tuple[pa.Table, dict[str, Any]]:
    """Synthetic records (text, label) from ``settings.teachers`` teachers per label.

    ``noise_rng`` draws the Gaussian noise of every release: a stream of the run's secret key
    (fresh OS entropy when None); the public ``seed`` drives only the shared coordination
    randomness and the fallback.  Returns the records as an Arrow table (``SCHEMA``) and the
    privacy report.
    """
    s = settings
    _check_inputs(private_texts, private_labels, label_names, s)
    sigma = s.resolve_sigma()
    ledger = PrivacyLedger(s.epsilon, s.delta)
    aggregator = make_aggregator(s.aggregator, sigma, s.threshold, s.beta, s.renormalize)
    rng = np.random.default_rng(s.seed)
    selector = PrivateTokenSelector(
        aggregator, s.ensemble, ledger, s.max_retries, fallback, rng, s.neighbour, noise_rng
    )
    log.info(
        "hot pate: %d records, %d teachers per label, sigma %.4g per release (%d releases planned)",
        s.n_samples,
        s.teachers,
        sigma,
        s.releases_planned(),
    )
    tally, threshold = _Tally(), None
    for label, quota in zip(label_names, _per_label(s.n_samples, len(label_names)), strict=True):
        if quota == 0 or tally.stop_reason:
            continue
        texts = [t for t, lab in zip(private_texts, private_labels, strict=True) if lab == label]
        prompts = build_teacher_prompts(
            texts, s.teachers, label, s.seed, s.examples_per_teacher, s.task, s.max_example_chars
        )
        source = source_factory(prompts)
        tally.vocab_size = source.vocab_size
        threshold = _warn_unreachable(selector, s.teachers, source.vocab_size)
        _generate_label(source, selector, label, quota, s, plm, tally)
    report = _report(s, sigma, threshold, ledger, selector, tally)
    return pa.Table.from_pylist(tally.rows, schema=SCHEMA), report


def _generate_label(
    source: DistributionSource,
    selector: PrivateTokenSelector,
    label: str,
    quota: int,
    s: HotPateSettings,
    plm: str,
    tally: _Tally,
) -> None:
    for i in range(quota):
        prefix = source.encode(s.response_prefix) if s.response_prefix else []
        outcome = generate_record(source, selector, s.max_tokens, prefix, s.stop)
        tally.private += outcome.private
        tally.fallback += outcome.fallback
        if outcome.end == "budget":
            tally.partial_dropped += int(bool(outcome.tokens))
            tally.stop_reason = "privacy budget exhausted"
            log.warning(
                "hot pate: privacy budget exhausted after %d records; stopping early", len(tally.rows)
            )
            return
        text = outcome.text.strip()
        if not text:
            tally.empty += 1
            continue
        tally.rows.append(
            {
                "id": f"hotpate-{s.seed}-{len(tally.rows):06d}",
                "text": text,
                "label": label,
                "attribute": None,
                "plm": plm,
                "round": 0,
                "prompt_kind": "hotpate",
            }
        )
        log.info(
            "hot pate: label %r record %d/%d: %d tokens (%d private, %d fallback), %d releases",
            label,
            i + 1,
            quota,
            len(outcome.tokens),
            outcome.private,
            outcome.fallback,
            outcome.releases,
        )


def _report(
    s: HotPateSettings,
    sigma: float,
    threshold: float | None,
    ledger: PrivacyLedger,
    selector: PrivateTokenSelector,
    tally: _Tally,
) -> dict[str, Any]:
    """The manifest entry: settings, noise, spend and what the budget bought (no private data)."""
    summary = {k: v for k, v in ledger.report().items() if k not in ("sigmas", "rounds")}
    tokens = tally.private + tally.fallback
    return {
        "mechanism": "hot_pate_gaussian",
        "settings": asdict(s),
        "sigma_per_release": sigma,
        "sensitivity": selector.sensitivity,
        "threshold": threshold,
        "noise_margin": selector.aggregator.margin(tally.vocab_size) if tally.vocab_size else None,
        "epsilon": s.epsilon,
        "delta": s.delta,
        "epsilon_spent": ledger.spent_epsilon(),
        "releases": selector.releases,
        "releases_planned": s.releases_planned(),
        "tokens_private": tally.private,
        "tokens_fallback": tally.fallback,
        "private_token_share": tally.private / tokens if tokens else 0.0,
        "records_requested": s.n_samples,
        "records_written": len(tally.rows),
        "records_empty": tally.empty,
        "records_partial_dropped": tally.partial_dropped,
        "stopped_early": tally.stop_reason is not None,
        "stop_reason": tally.stop_reason,
        "ledger": summary,
    }


def run_hotpate(
    private_texts: list[str],
    private_labels: list[str],
    label_names: list[str],
    *,
    model: str = "smollm2",
    device: str | None = None,
    dtype: Any = None,
    fallback: Fallback = sample_public,
    source_factory: SourceFactory | None = None,
    noise_rng: np.random.Generator | None = None,
    **settings: Any,
) -> tuple[pa.Table, dict[str, Any]]:
    """Hot PATE synthetic records with a PLM preset or model directory (entry point for the CLI).

    ``settings`` are the fields of :class:`HotPateSettings` (``n_samples``, ``epsilon`` and
    ``delta`` at least).  ``source_factory`` replaces the transformers model (tests use a stub).
    Returns the records (columns ``id, text, label, attribute, plm, round, prompt_kind``) and the
    privacy report for the run manifest.
    """
    if "stop" in settings:
        settings["stop"] = tuple(settings["stop"])
    run = HotPateSettings(**settings)
    _check_inputs(private_texts, private_labels, label_names, run)
    plm = model
    if source_factory is None:
        lm = load_lm(model, device, dtype)
        plm = lm.name

        def source_factory(prompts: list[str]) -> DistributionSource:
            return TeacherEnsembleLM(lm, prompts, temperature=run.temperature)

    return generate_hotpate(
        private_texts, private_labels, label_names, source_factory, run, plm, fallback, noise_rng
    )

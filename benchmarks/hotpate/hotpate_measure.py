"""Measure what Hot PATE's private step sees on real data: the ensemble's top vote count per token.

For every label of the packaged drug reviews, the real teachers (SmolLM2 on transformers, each
teacher ``k`` private records, ``n = ceil(M / (k * labels))`` per label, the generator's own
prompts) walk ``records`` synthetic records along the *noise-free* Hot PATE path: at each token
position the coordinated ensemble is drawn ``draws`` times (fresh shared randomness, no model call)
and the top count of each draw is kept as a fraction of ``n``; the walk then takes the majority
token of the first draw when there is one, else the public prompt's own token.  No privacy is
involved: this is the measurement the simulation (:mod:`hotpate_simulate`) replays under each
accounting.  The walk is the path a run with free privacy would take, so it slightly favours
agreement over the path of a run that mostly falls back (said in the results).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wasp_vllm.hotpate import PreparedEnsemble, TeacherEnsembleLM, build_teacher_prompts, load_lm
from wasp_vllm.hotpate.prompts import subject_for
from wasp_vllm.hotpate.settings import HotPateSettings

log = logging.getLogger("hotpate_measure")


@dataclass
class LabelWalk:
    """One label's measured positions: ``fractions[p]`` are the top-count fractions of the draws."""

    label: str
    n_teachers: int
    empty_teachers: int
    fractions: list[list[float]] = field(default_factory=list)
    record_lengths: list[int] = field(default_factory=list)
    majority_steps: int = 0
    seconds: float = 0.0


def _top_fractions(probs: np.ndarray, draws: int, rng: np.random.Generator) -> tuple[list[float], int, int]:
    """Top-count fractions of ``draws`` coordinated draws; the first draw's top token and count."""
    prepared = PreparedEnsemble(probs, "coordinated")
    out, first_top, first_count = [], -1, 0
    for d in range(draws):
        hist = prepared.histogram(rng)
        k = int(hist.counts.argmax())
        if d == 0:
            first_top, first_count = int(hist.tokens[k]), int(hist.counts[k])
        out.append(float(hist.counts[k]) / prepared.n_teachers)
    return out, first_top, first_count


def walk_label(
    lm: Any,
    texts: list[str],
    label: str,
    s: HotPateSettings,
    records: int,
    draws: int,
    rng: np.random.Generator,
) -> LabelWalk:
    """Walk ``records`` records of one label along the noise-free path, measuring every position."""
    n = s.teachers_per_label(3)
    prompts = build_teacher_prompts(texts, n, label, s.seed, s.examples_shown(), s.task, s.max_example_chars)
    empty = sum(p == prompts[-1] for p in prompts[:-1])
    start = time.perf_counter()
    source = TeacherEnsembleLM(lm, prompts, temperature=s.temperature)
    walk = LabelWalk(label, n, empty)
    for _ in range(records):
        source.reset()
        for tok in source.encode(s.response_prefix):
            source.append(tok)
        tokens: list[int] = []
        while len(tokens) < s.max_tokens:
            probs = source.next_distributions().astype(np.float64)
            fractions, top, count = _top_fractions(probs[:-1], draws, rng)
            walk.fractions.append(fractions)
            if count > n / 2:
                token, walk.majority_steps = top, walk.majority_steps + 1
            else:
                public = probs[-1] / probs[-1].sum()
                token = int(rng.choice(public.size, p=public))
            if token in source.stop_token_ids:
                break
            tokens.append(token)
            text = source.decode(tokens)
            if any(stop in text for stop in s.stop):
                break
            source.append(token)
        walk.record_lengths.append(len(tokens) + 1)  # the end decision is a token decision too
    walk.seconds = time.perf_counter() - start
    log.info(
        "label %s: %d teachers (%d empty), %d positions, %.0f s",
        label, n, empty, len(walk.fractions), walk.seconds,
    )  # fmt: skip
    return walk


def measure(
    model: str, m: int, k: int, records: int, draws: int, max_tokens: int, seed: int
) -> dict[str, Any]:
    """The walks of all labels of the packaged drug reviews (train split, M drawn by keyed hash)."""
    from wasp_vllm.data.records import load_private
    from wasp_vllm.tasks import get_task

    spec = get_task("drugs")
    data = load_private("drugs", spec, limit=m, seed=seed)
    s = HotPateSettings(n_samples=1, epsilon=1.0, delta=1e-5, requested_m=m, records_per_teacher=k,
                        max_tokens=max_tokens, task=subject_for(spec.name), seed=seed)  # fmt: skip
    lm = load_lm(model, device="cpu")
    rng = np.random.default_rng([seed, 17])
    walks = []
    for i, label in enumerate(spec.labels):
        texts = [t for t, lab in zip(data.texts, data.labels, strict=True) if lab == i]
        walks.append(walk_label(lm, texts, label, s, records, draws, rng))
    return {
        "model": model, "m": m, "records_per_teacher": k, "teachers_per_label": s.teachers_per_label(3),
        "records_per_label": records, "draws": draws, "max_tokens": max_tokens,
        "walks": [w.__dict__ for w in walks],
    }  # fmt: skip

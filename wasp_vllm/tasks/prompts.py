"""Rendering a task's prompts and drawing their in-context examples.

Prompt convention: every rendered prompt ends right where the sample starts (normally with an
opening double quote), so the model's continuation *is* the sample and generation ends at one of
``TaskSpec.stop``.  In-context examples are always synthetic texts chosen by the pipeline; this
module never sees private data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from wasp_vllm.tasks.spec import PROMPT_KINDS, TaskError, TaskSpec


def _clean_example(text: str) -> str:
    """Make an example safe to quote: the stop strings must not fire inside it.

    Double quotes become single quotes and blank lines collapse, because the
    default stops are '"' and a blank line; otherwise the model would learn
    from the prompt that a sample can end half-way.
    """
    text = text.replace('"', "'")
    text = re.sub(r"\n\s*\n+", "\n", text)
    return text.strip()


def _render_block(template: str, texts: Sequence[str], context: dict[str, str]) -> str:
    return "\n".join(template.format(text=_clean_example(t), **context) for t in texts)


def _check_texts(name: str, texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TaskError(f"{name} must be a sequence of texts, not a single string")
    out = list(texts)
    if any(not isinstance(t, str) for t in out):
        raise TaskError(f"{name} must contain only strings")
    return out


def build_prompt(
    task: TaskSpec,
    kind: str,
    label: str,
    attribute: str | None = None,
    good: Sequence[str] = (),
    bad: Sequence[str] = (),
) -> str:
    """Render one generation prompt.

    ``kind``: 'zero_shot' (no examples), 'few_shot' (``good`` examples only) or
    'contrastive' (``bad`` examples to move away from, ``good`` ones to move
    towards).  ``attribute`` is free text (normally from :func:`pick_attribute`);
    it is not checked against the task's list so that callers may use their own.
    """
    if kind not in PROMPT_KINDS:
        raise TaskError(f"unknown prompt kind {kind!r}; expected one of {PROMPT_KINDS}")
    task.label_index(label)
    good_list, bad_list = _check_texts("good", good), _check_texts("bad", bad)
    context = {
        "label": label,
        "label_text": task.label_text(label),
        "attribute": attribute or "",
        "attribute_text": task.attribute_template.format(attribute=attribute) if attribute else "",
    }
    templates = task.templates
    if kind == "zero_shot":
        if good_list or bad_list:
            raise TaskError("a zero_shot prompt takes no examples")
        return templates.zero_shot.format(**context)
    if not good_list:
        raise TaskError(f"a {kind} prompt needs at least one good example")
    if kind == "few_shot":
        if bad_list:
            raise TaskError("a few_shot prompt takes good examples only; use 'contrastive' for bad ones")
        examples = _render_block(templates.example, good_list, context)
        return templates.few_shot.format(examples=examples, **context)
    prompt = templates.contrastive.format(
        good_examples=_render_block(templates.good_example, good_list, context),
        bad_examples=_render_block(templates.bad_example, bad_list, context),
        **context,
    )
    # With an empty bad pool the bad block renders empty; drop the blank line it leaves.
    return prompt.lstrip("\n")


def draw_contrastive_examples(
    good_pool: Sequence[str], bad_pool: Sequence[str], s: int, rng: np.random.Generator
) -> tuple[list[str], list[str]]:
    """Draw S-⌊S/2⌋ good and ⌊S/2⌋ bad examples, each without replacement.

    Each draw is a random subset of the selected pools, so prompts built from
    different draws differ (the pipeline shares each draw among a few prompts,
    see ``RunConfig.example_sets``).  A pool smaller than its share gives all
    of its items, in random order.
    """
    if s < 0:
        raise TaskError(f"number of in-context examples S must be >= 0, got {s}")
    n_bad = s // 2
    n_good = s - n_bad
    return _draw(good_pool, n_good, rng), _draw(bad_pool, n_bad, rng)


def _draw(pool: Sequence[str], n: int, rng: np.random.Generator) -> list[str]:
    k = min(n, len(pool))
    if k == 0:
        return []
    picks = rng.choice(len(pool), size=k, replace=False)
    return [pool[int(i)] for i in picks]


def pick_attribute(task: TaskSpec, label: str, rng: np.random.Generator) -> str | None:
    """A uniformly drawn attribute value for ``label``, or None when the task has none."""
    task.label_index(label)
    choices = task.attribute_choices(label)
    if not choices:
        return None
    return choices[int(rng.integers(len(choices)))]


#: What ``tasks --check`` shows where a run's later prompts hold synthetic texts the votes chose.
STAND_INS = ("<a synthetic text the votes chose>", "<another one>")
STAND_IN_BAD = "<a synthetic text the votes turned from>"


def example_prompts(task: TaskSpec) -> dict[str, str]:
    """One prompt of each kind for the task's first label (and attribute), with stand-ins for the
    synthetic examples, under a heading that says when a run uses it (``--later-prompt`` picks
    the later rounds' one): what a task file's templates make (``wasp-vllm tasks --check``)."""
    label = task.labels[0]
    choices = task.attribute_choices(label)
    attribute = choices[0] if choices else None
    return {
        f"zero_shot prompt (round 0), label {label}": build_prompt(task, "zero_shot", label, attribute),
        f"few_shot prompt (later rounds, the default), label {label}": build_prompt(
            task, "few_shot", label, attribute, good=STAND_INS
        ),
        f"contrastive prompt (later rounds with --later-prompt contrastive), label {label}": build_prompt(
            task, "contrastive", label, attribute, good=STAND_INS[:1], bad=[STAND_IN_BAD]
        ),
    }

"""Teacher prompts from private records: each record in exactly one teacher, by a keyed hash.

A record's teacher is a keyed hash of its own text (keyed by the public run seed), so adding or
removing one record changes exactly one teacher's prompt and no other; the number of teachers is
public (:meth:`~wasp_vllm.hotpate.settings.HotPateSettings.teachers_per_label`).  A teacher that
receives no record gets the public prompt (it is still a teacher: the ensemble size stays public
and fixed).  Private texts never appear in a log line or an error message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

TEACHER_TEMPLATE = (
    'Here are some examples of {task} with the label "{label}":\n\n{examples}\n\n'
    'Write one new {task} with the label "{label}", different from the examples. '
    "Reply with the text only."
)
PUBLIC_TEMPLATE = 'Write one {task} with the label "{label}". Reply with the text only.'
#: Fewest characters per token assumed when a teacher prompt's padded length is fixed in advance
#: (English runs near 4; a prompt that goes below 2 is cut from the left, see ``teachers.py``).
CHARS_PER_TOKEN_FLOOR = 2
#: What one record of a built-in task is, as the prompts name it ({task}); other tasks say "text".
SUBJECTS = {
    "banking": "online banking customer query",
    "drugs": "patient review of a drug",
    "imdb": "movie review",
    "openreview_category": "paper review",
    "openreview_rating": "paper review",
    "rotten_tomatoes": "movie review snippet",
    "yelp_category": "Yelp review",
    "yelp_rating": "Yelp review",
}


def subject_for(task_name: str) -> str:
    """How the prompts name one record of a task (public: the task's name only)."""
    return SUBJECTS.get(task_name, "text")


def _slot(text: str, seed: int, teachers: int) -> tuple[int, bytes]:
    """Teacher slot of a record: a keyed hash of its text, so each record's place depends on it alone."""
    digest = hashlib.blake2b(
        text.encode("utf-8"), key=str(seed).encode("utf-8")[:64], digest_size=16
    ).digest()
    return int.from_bytes(digest[:8], "big") % teachers, digest


def teacher_skeleton(task: str, label: str, examples_per_teacher: int) -> str:
    """A teacher prompt with every example left empty: public, it gives the prompts' fixed part."""
    examples = "\n".join(f"{i + 1}. " for i in range(examples_per_teacher))
    return TEACHER_TEMPLATE.format(task=task, label=label, examples=examples)


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
) -> list[str]:
    """``teachers`` prompts from disjoint parts of ``texts`` (all of one label), plus the public one.

    A teacher that receives no record gets the public prompt.  A teacher that receives more than
    ``examples_per_teacher`` records shows the first ones in hash order.
    """
    if teachers < 1 or examples_per_teacher < 1:
        raise ValueError("teachers and examples_per_teacher must be >= 1")
    slots: list[list[tuple[bytes, str]]] = [[] for _ in range(teachers)]
    for text in texts:
        slot, digest = _slot(text, seed, teachers)
        slots[slot].append((digest, text))
    public = PUBLIC_TEMPLATE.format(task=task, label=label)
    prompts = []
    for members in slots:
        shown = [t for _, t in sorted(members)[:examples_per_teacher]]
        if not shown:
            prompts.append(public)
            continue
        examples = "\n".join(f"{i + 1}. {_example(t, max_example_chars)}" for i, t in enumerate(shown))
        prompts.append(TEACHER_TEMPLATE.format(task=task, label=label, examples=examples))
    return [*prompts, public]

"""The task suite: every built-in set, split once, before any measurement, into two groups.

* ``choosing``: settings and defaults are chosen on these tasks' *validation* splits (a lever
  is adopted only if it is better there, see the lever rule).
* ``held-out``: these tasks' *test* splits are scored only at the end, once per adopted lever,
  for the result table; never while choosing, and their validation splits are not looked at.

The rule that made the groups (fixed before any run on the new sets; :func:`groups_by_rule`
recomputes it and a test checks that :data:`SUITE` is what it gives):

1. The five sets the project already measured on (drugs, rotten_tomatoes, imdb, tweets, trec)
   are ``choosing``: defaults were chosen on their validation splits and their test splits have
   been scored, so none of them can be held out any more.
2. Each new set has a kind (:data:`KIND`).  Within a kind, the new sets are ranked by a keyed
   hash of their name (:func:`_rank`, not by anything measured); the first goes to ``choosing``
   (so that the choosing group has every kind the held-out group has) and the rest are
   ``held-out``.  A kind with a single new set and no choosing member would go to ``choosing``.

This gives three held-out tasks of two kinds, each kind also present among the choosing tasks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

Group = Literal["choosing", "held-out"]

#: The sets measured before the suite existed (rule 1).
MEASURED_BEFORE = ("drugs", "rotten_tomatoes", "imdb", "tweets", "trec")

#: What each task asks a classifier; the rule groups the new sets by this.
KIND: dict[str, str] = {
    "drugs": "sentiment, 3 labels (patient drug reviews)",
    "rotten_tomatoes": "sentiment, 2 labels (film critic snippets)",
    "imdb": "sentiment, 2 labels (long film reviews)",
    "tweets": "sentiment, 3 labels (tweets on brands and events)",
    "trec": "question type, 6 labels (answer type of short questions)",
    "products": "sentiment, 3 labels (product review sentences)",
    "editorials": "sentiment, 3 labels (newspaper opinion sentences; skewed: 59 % neutral)",
    "vader_tweets": "sentiment, 3 labels (tweets on everyday life)",
    "disaster": "binary, not sentiment (tweets: real disaster or not; skewed: 42 % disaster)",
    "conventions": "binary, not sentiment (political speech paragraphs: which party)",
}

SUITE: dict[str, Group] = {
    # Rule 1: measured on before the suite existed.
    "drugs": "choosing",
    "rotten_tomatoes": "choosing",
    "imdb": "choosing",
    "tweets": "choosing",
    "trec": "choosing",
    # Rule 2, kind "sentiment, 3 labels": editorials ranks first of the three new ones.
    "editorials": "choosing",
    "products": "held-out",
    "vader_tweets": "held-out",
    # Rule 2, kind "binary, not sentiment": conventions ranks first of the two.
    "conventions": "choosing",
    "disaster": "held-out",
}


def kind_class(name: str) -> str:
    """The part of a task's kind that the rule groups by (before the parenthesis)."""
    return KIND[name].split(" (")[0]


def _rank(name: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(name.encode(), key=b"wasp-vllm/suite", digest_size=8).digest(), "big"
    )


def groups_by_rule(names: list[str] | None = None) -> dict[str, Group]:
    """The groups the rule in the module docstring gives to ``names`` (default: all of KIND)."""
    names = list(KIND) if names is None else names
    groups: dict[str, Group] = {n: "choosing" for n in names if n in MEASURED_BEFORE}
    new = sorted((n for n in names if n not in MEASURED_BEFORE), key=_rank)
    seen: set[str] = set()
    for name in new:
        kind = kind_class(name)
        groups[name] = "held-out" if kind in seen else "choosing"
        seen.add(kind)
    return {n: groups[n] for n in names}


def choosing() -> list[str]:
    """The tasks whose validation splits decide defaults."""
    return [n for n, g in SUITE.items() if g == "choosing"]


def held_out() -> list[str]:
    """The tasks whose test splits are scored only at the end."""
    return [n for n, g in SUITE.items() if g == "held-out"]


@dataclass(frozen=True)
class SuiteRow:
    """One task of the suite, as ``wasp-vllm tasks`` lists it."""

    name: str
    kind: str
    summary: str
    labels: tuple[str, ...]
    group: Group
    #: records per split ("fit", "validation", "test"); empty when not counted
    records: dict[str, int]


def suite_rows(count: bool = True) -> list[SuiteRow]:
    """One row per task of the suite, choosing group first.  ``count`` reads every set (a few
    seconds; IMDb is the slowest) to give its records per split; a set whose package is missing
    raises :class:`~wasp_vllm.data.sources.DataError` naming the pip command."""
    from wasp_vllm.data.builtin import BUILTIN, builtin_split
    from wasp_vllm.tasks import get_task

    rows = []
    for group in ("choosing", "held-out"):
        for name in (n for n, g in SUITE.items() if g == group):
            records = (
                {s: builtin_split(name, s).num_rows for s in ("fit", "validation", "test")} if count else {}
            )
            rows.append(
                SuiteRow(
                    name,
                    KIND[name],
                    BUILTIN[name].summary,
                    tuple(get_task(name).labels),
                    SUITE[name],
                    records,
                )
            )
    return rows
